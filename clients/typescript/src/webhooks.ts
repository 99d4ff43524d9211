/** Signature checks for what fastack sends: webhooks (Standard Webhooks) and AMQP messages (x-message-signature). */
import { Buffer } from "node:buffer";
import { createHmac, timingSafeEqual } from "node:crypto";

/**
 * Node's `req.headers`, a fetch `Headers`, AMQP message headers, or any
 * name → value record (names matched case-insensitively; values may be
 * strings, arrays of strings, numbers or bytes).
 */
export type HeadersLike = { get(name: string): string | null } | Record<string, unknown>;

/** The raw body bytes as received. A string is taken as its UTF-8 bytes. */
export type RawBody = string | Uint8Array | ArrayBuffer;

export interface VerifyOptions {
  /** Largest accepted |now - timestamp| in seconds. Default 300. */
  toleranceSeconds?: number;
  /** "Now" (a Date or unix milliseconds). Default: the clock. */
  now?: Date | number;
}

export type VerificationFailure =
  | "missing_header"
  | "invalid_timestamp"
  | "timestamp_out_of_window"
  | "unsupported_version"
  | "invalid_key"
  | "signature_mismatch";

export class WebhookVerificationError extends Error {
  override readonly name = "WebhookVerificationError";
  readonly reason: VerificationFailure;
  constructor(reason: VerificationFailure, message: string) {
    super(message);
    this.reason = reason;
  }
}

/**
 * Checks a webhook delivery (Standard Webhooks): `webhook-signature` holds
 * one or more space-separated `v1,<base64 HMAC-SHA256>` over
 * `webhook-id + "." + webhook-timestamp + "." + body`, keyed with the
 * base64 after `whsec_` (several during a secret rotation: any may match).
 * Refuses a timestamp more than 5 minutes from now. Answers the parsed JSON
 * body; throws WebhookVerificationError otherwise.
 *
 * Pass the RAW body (the bytes received), never a re-serialised object.
 */
export function verifyWebhook<T = unknown>(secret: string, headers: HeadersLike, body: RawBody, options: VerifyOptions = {}): T {
  const id = header(headers, "webhook-id");
  const timestamp = header(headers, "webhook-timestamp");
  const signatures = header(headers, "webhook-signature");
  if (id === undefined || timestamp === undefined || signatures === undefined) {
    throw new WebhookVerificationError("missing_header", "webhook-id, webhook-timestamp and webhook-signature are required");
  }
  checkTime(timestamp, options);
  const key = webhookKey(secret);
  const bytes = toBytes(body);
  const expected = createHmac("sha256", key).update(`${id}.${timestamp.trim()}.`).update(bytes).digest();
  let match = false;
  for (const candidate of signatures.split(" ")) {
    const comma = candidate.indexOf(",");
    if (comma < 0 || candidate.slice(0, comma) !== "v1") continue;
    const sig = Buffer.from(candidate.slice(comma + 1), "base64");
    // Compare every candidate (no early exit), each in constant time.
    if (sig.length === expected.length && timingSafeEqual(sig, expected)) match = true;
  }
  if (!match) throw new WebhookVerificationError("signature_mismatch", "no webhook signature matches");
  return parse<T>(bytes);
}

/**
 * Checks an AMQP message of fastack's streams: `x-message-signature` is the
 * hex HMAC-SHA256 of `t \n v1 \n ce-tenantid \n ce-subject \n exchange \n
 * routing_key \n body` with the deployment key (`fastack keys external-hmac`:
 * pass that hex text or its 32 bytes). Refuses `signature-version` other than
 * `v1`, missing headers and `t` more than 5 minutes from now. Answers the
 * parsed JSON body; throws WebhookVerificationError otherwise.
 *
 * `headers` are the message's headers (amqplib: `msg.properties.headers`);
 * `exchange` and `routingKey` are the ones it was delivered with
 * (`msg.fields.exchange`, `msg.fields.routingKey`).
 */
export function verifyAmqp<T = unknown>(
  key: string | Uint8Array,
  headers: HeadersLike,
  body: RawBody,
  exchange: string,
  routingKey: string,
  options: VerifyOptions = {},
): T {
  const version = header(headers, "signature-version");
  const t = header(headers, "t");
  const tenant = header(headers, "ce-tenantid");
  const subject = header(headers, "ce-subject");
  const signature = header(headers, "x-message-signature");
  if ([version, t, tenant, subject, signature].includes(undefined)) {
    throw new WebhookVerificationError(
      "missing_header",
      "signature-version, t, ce-tenantid, ce-subject and x-message-signature are required",
    );
  }
  if (version !== "v1") throw new WebhookVerificationError("unsupported_version", `signature-version ${version} is not v1`);
  const seconds = checkTime(t!, options);
  const bytes = toBytes(body);
  const expected = createHmac("sha256", amqpKey(key))
    .update(`${seconds}\nv1\n${tenant}\n${subject}\n${exchange}\n${routingKey}\n`)
    .update(bytes)
    .digest();
  const given = /^[0-9a-fA-F]{64}$/.test(signature!) ? Buffer.from(signature!, "hex") : Buffer.alloc(0);
  if (!(given.length === expected.length && timingSafeEqual(given, expected))) {
    throw new WebhookVerificationError("signature_mismatch", "x-message-signature does not match");
  }
  return parse<T>(bytes);
}

function header(headers: HeadersLike, name: string): string | undefined {
  let value: unknown;
  if (typeof (headers as { get?: unknown }).get === "function") {
    value = (headers as { get(name: string): string | null }).get(name);
  } else {
    const record = headers as Record<string, unknown>;
    value = record[name];
    if (value === undefined) {
      for (const k of Object.keys(record)) {
        if (k.toLowerCase() === name) {
          value = record[k];
          break;
        }
      }
    }
  }
  if (value === undefined || value === null) return undefined;
  if (Array.isArray(value)) return value.map(String).join(" ");
  if (value instanceof Uint8Array) return Buffer.from(value).toString("utf8");
  return String(value);
}

function checkTime(value: string, options: VerifyOptions): number {
  const v = value.trim();
  if (!/^\d{1,15}$/.test(v)) throw new WebhookVerificationError("invalid_timestamp", "the timestamp is not unix seconds");
  const seconds = Number(v);
  const tolerance = options.toleranceSeconds ?? 300;
  const now = options.now === undefined ? Date.now() : options.now instanceof Date ? options.now.getTime() : options.now;
  if (Math.abs(Math.floor(now / 1000) - seconds) > tolerance) {
    throw new WebhookVerificationError("timestamp_out_of_window", `the timestamp is more than ${tolerance} s from now`);
  }
  return seconds;
}

function webhookKey(secret: string): Buffer {
  const raw = typeof secret === "string" ? (secret.startsWith("whsec_") ? secret.slice(6) : secret) : "";
  if (raw === "" || !/^[A-Za-z0-9+/]+={0,2}$/.test(raw)) {
    throw new WebhookVerificationError("invalid_key", "a webhook secret is whsec_ followed by base64");
  }
  return Buffer.from(raw, "base64");
}

function amqpKey(key: string | Uint8Array): Buffer {
  if (key instanceof Uint8Array) return Buffer.from(key);
  const hex = typeof key === "string" ? key.trim() : "";
  if (hex === "" || hex.length % 2 !== 0 || !/^[0-9a-fA-F]+$/.test(hex)) {
    throw new WebhookVerificationError("invalid_key", "the AMQP key is the hex printed by `fastack keys external-hmac`");
  }
  return Buffer.from(hex, "hex");
}

function toBytes(body: RawBody): Buffer {
  if (typeof body === "string") return Buffer.from(body, "utf8");
  if (body instanceof ArrayBuffer) return Buffer.from(body);
  if (body instanceof Uint8Array) return Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  throw new TypeError("body must be the raw bytes (Buffer / Uint8Array / ArrayBuffer) or a string");
}

function parse<T>(bytes: Buffer): T {
  return JSON.parse(bytes.toString("utf8")) as T;
}
