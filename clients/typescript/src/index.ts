export { Client } from "./client.js";
export type { CallOptions, ClientOptions, ContactLookup, ErasureInput, EventsQuery, ExportInput, WaitOptions } from "./client.js";
export {
  Tracker,
  TrackerError,
  MAX_BATCH_ITEMS,
  MAX_EVENT_BYTES,
  MAX_REQUEST_BYTES,
  DEFAULT_FLUSH_TIMEOUT_MS,
  DEFAULT_CLOSE_TIMEOUT_MS,
} from "./tracker.js";
export type {
  DetailedFlushOptions,
  FlushOptions,
  FlushResult,
  TrackerErrorKind,
  TrackerItem,
  TrackerOptions,
  TrackerStats,
} from "./tracker.js";
export { ApiError, TimeoutError } from "./errors.js";
export { verifyWebhook, verifyAmqp, WebhookVerificationError } from "./webhooks.js";
export type { HeadersLike, RawBody, VerificationFailure, VerifyOptions } from "./webhooks.js";
export { rfc3339Local } from "./time.js";
export { DEFAULT_BASE_URL } from "./http.js";
export { VERSION } from "./version.js";
export type * from "./types.js";
export type { paths, components, operations } from "./generated/schema.js";
