/** This package's version (kept equal to package.json by a test). */
export const VERSION = "0.2.0";
