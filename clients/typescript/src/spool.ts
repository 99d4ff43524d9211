/**
 * The Tracker's on-disk spool. The format is the Python SDK's too.
 *
 * A spool is a directory of files, each holding items the Tracker could not
 * deliver before its deadline, one per line: the JSON object sent in a batch
 * (`{"type":"track",…,"idempotency_key":"…"}`), exactly as it was queued.
 * Because every item keeps its idempotency key, sending a spooled item the
 * server already stored is answered `duplicate: true`: exactly once.
 *
 * - `<time_ns>-<pid>-<random>.jsonl`: ready to be sent, oldest first by name;
 *   written to `.<name>.tmp` (mode 0600), fsync'd, then renamed, so a reader
 *   never sees half a file.
 * - `<name>.claimed-<pid>-<random>`: taken by a tracker of process `pid`. A
 *   tracker claims a file by renaming it; of two renaming the same file,
 *   exactly one succeeds. A claimed file is removed only once each of its
 *   items was delivered, refused item by item, or written to a new ready
 *   file; the claim of a process that is gone is renamed back when a tracker
 *   next starts on the directory.
 *
 * The processes sharing a spool directory must see each other's process ids
 * (one host, one pid namespace).
 */
import { randomBytes } from "node:crypto";
import {
  chmodSync,
  closeSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  readdirSync,
  renameSync,
  unlinkSync,
  writeSync,
} from "node:fs";
import { join } from "node:path";

const READY = /^\d{20}-\d+-[0-9a-f]+\.jsonl$/;
const CLAIMED = /^(\d{20}-\d+-[0-9a-f]+\.jsonl)\.claimed-(\d+)-[0-9a-f]+$/;
const TEMP = /^\.\d{20}-(\d+)-[0-9a-f]+\.jsonl\.tmp$/;

/** One spooled item: its line (the wire JSON) and that JSON parsed. */
export interface SpoolLine {
  json: string;
  wire: Record<string, unknown>;
}

function alive(pid: number): boolean {
  if (pid === process.pid) return true;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code !== "ESRCH";
  }
}

function hex(bytes: number): string {
  return randomBytes(bytes).toString("hex");
}

/** Wall-clock nanoseconds, 20 digits: file names sort oldest first. */
function timeNs(): string {
  const ns = BigInt(Date.now()) * 1_000_000n + (process.hrtime.bigint() % 1_000_000n);
  return ns.toString().padStart(20, "0");
}

export class Spool {
  readonly dir: string;
  readonly #token = hex(4);

  constructor(dir: string) {
    this.dir = dir;
    mkdirSync(dir, { recursive: true, mode: 0o700 });
  }

  /** Writes the lines as one new ready file, atomically; answers its path. Throws on I/O errors. */
  write(lines: string[]): string {
    const name = `${timeNs()}-${process.pid}-${hex(4)}.jsonl`;
    const temp = join(this.dir, `.${name}.tmp`);
    const path = join(this.dir, name);
    const fd = openSync(temp, "wx", 0o600);
    try {
      writeSync(fd, lines.map((l) => `${l}\n`).join(""));
      fsyncSync(fd);
    } catch (err) {
      closeSync(fd);
      try {
        unlinkSync(temp);
      } catch {
        // already gone
      }
      throw err;
    }
    closeSync(fd);
    chmodSync(temp, 0o600); // whatever the umask
    renameSync(temp, path);
    this.#fsyncDir();
    return path;
  }

  /** Gives back the claims of processes that are gone; removes their half-written temp files. */
  recover(): void {
    for (const name of this.#list()) {
      const claimed = CLAIMED.exec(name);
      if (claimed && !alive(Number(claimed[2]))) {
        try {
          renameSync(join(this.dir, name), join(this.dir, claimed[1]!));
        } catch {
          // another tracker took it back first
        }
        continue;
      }
      const temp = TEMP.exec(name);
      if (temp && !alive(Number(temp[1]))) {
        try {
          unlinkSync(join(this.dir, name));
        } catch {
          // gone
        }
      }
    }
  }

  /** Claims ready files, oldest first, until at least `most` items are held (a file is taken whole), and reads them. */
  claim(most: number): { files: string[]; lines: SpoolLine[] } {
    this.recover();
    const files: string[] = [];
    const lines: SpoolLine[] = [];
    for (const name of this.#list().filter((n) => READY.test(n)).sort()) {
      if (lines.length >= most) break;
      const claimed = join(this.dir, `${name}.claimed-${process.pid}-${this.#token}`);
      try {
        renameSync(join(this.dir, name), claimed);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "ENOENT") console.warn(`[fastack] cannot claim spool file ${name}: ${(err as Error).message}`);
        continue; // another tracker claimed it
      }
      let text: string;
      try {
        text = readFileSync(claimed, "utf8");
      } catch (err) {
        console.warn(`[fastack] cannot read spool file ${claimed}: ${(err as Error).message}`);
        this.release([claimed]);
        continue;
      }
      let bad = 0;
      for (const line of text.split("\n")) {
        if (line.trim() === "") continue;
        let wire: unknown;
        try {
          wire = JSON.parse(line);
        } catch {
          wire = undefined;
        }
        const type = (wire as { type?: unknown } | undefined)?.type;
        if (typeof wire !== "object" || wire === null || Array.isArray(wire) || (type !== "track" && type !== "identify")) {
          bad++;
          continue;
        }
        lines.push({ json: line, wire: wire as Record<string, unknown> });
      }
      if (bad) console.warn(`[fastack] spool file ${name}: ${bad} line(s) that are not items skipped`);
      files.push(claimed);
    }
    return { files, lines };
  }

  /** Gives claimed files back (renamed to their ready name): their items were not written anywhere else. */
  release(files: string[]): void {
    for (const path of files) {
      const name = path.slice(path.lastIndexOf("/") + 1);
      const m = CLAIMED.exec(name);
      if (!m) continue;
      try {
        renameSync(path, join(this.dir, m[1]!));
      } catch (err) {
        console.error(`[fastack] cannot give back spool file ${path}: ${(err as Error).message}`);
      }
    }
  }

  /** Removes claimed files whose items are delivered, refused or written to another file. */
  remove(files: string[]): void {
    for (const path of files) {
      try {
        unlinkSync(path);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "ENOENT") console.error(`[fastack] cannot remove spool file ${path}: ${(err as Error).message}`);
      }
    }
    if (files.length) this.#fsyncDir();
  }

  #list(): string[] {
    try {
      return readdirSync(this.dir);
    } catch (err) {
      console.warn(`[fastack] cannot list the spool ${this.dir}: ${(err as Error).message}`);
      return [];
    }
  }

  #fsyncDir(): void {
    try {
      const fd = openSync(this.dir, "r");
      try {
        fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
    } catch {
      // not every file system lets a directory be fsync'd
    }
  }
}
