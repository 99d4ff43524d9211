import { randomUUID } from "node:crypto";
import { ApiError, parseRetryAfter } from "./errors.js";
import { Transport, withDeadline } from "./http.js";
import type { Ack, BatchItem, IdentifyInput, TrackInput } from "./types.js";
import { batchItem, resolve, type Resolved } from "./wire.js";

/** Most items in one `POST /v1/core/batch`. */
export const MAX_BATCH_ITEMS = 500;
/** Largest event the server takes (a batch item as serialised). */
export const MAX_EVENT_BYTES = 32 * 1024;
/** Largest request body the server takes. */
export const MAX_REQUEST_BYTES = 4 * 1024 * 1024;
const ENVELOPE_BYTES = '{"batch":[]}'.length;

/** An item the tracker took, as it reports it back: key and `occurredAt` filled in. */
export type TrackerItem =
  | { type: "track"; idempotencyKey: string; input: Resolved<TrackInput> }
  | { type: "identify"; idempotencyKey: string; input: Resolved<IdentifyInput> };

/**
 * Why items reached `onError`:
 * - `rejected`: the server refused them (a 4xx other than 429; `problem` says why). Not retried.
 * - `invalid`: refused before sending (no event name, no id, not JSON-serialisable).
 * - `too_large`: over 32 KiB serialised; never sent (the rest of its batch is).
 * - `dropped`: the queue was full (`maxQueueSize`); never sent.
 * - `closed`: tracked after `close()`; never sent.
 * - `retries_exhausted`: no 2xx after `maxRetries` retries (5xx, network). They may or may
 *   not be stored: resending them with the same idempotency key is safe.
 * - `undelivered`: `close()` ran out of time. Same as above: resend with the same key.
 */
export type TrackerErrorKind =
  | "rejected"
  | "invalid"
  | "too_large"
  | "dropped"
  | "closed"
  | "retries_exhausted"
  | "undelivered";

export class TrackerError extends Error {
  override readonly name = "TrackerError";
  readonly kind: TrackerErrorKind;
  /** The items concerned (for a resend: `client.batch(items.map(i => ({ type: i.type, ...i.input })))`). */
  readonly items: TrackerItem[];
  /** The server's answer, for `rejected` (and the last one for `retries_exhausted`, when there was one). */
  readonly problem: ApiError | undefined;

  constructor(kind: TrackerErrorKind, message: string, items: TrackerItem[], problem?: ApiError, cause?: unknown) {
    super(message, cause === undefined ? undefined : { cause });
    this.kind = kind;
    this.items = items;
    this.problem = problem;
  }
}

export interface TrackerOptions {
  /** `fsk_…` API key. */
  apiKey: string;
  /** Default `http://127.0.0.1:8080`. */
  baseUrl?: string;
  /** A partial batch is sent this long after its first item was queued. Default 500. */
  flushIntervalMs?: number;
  /** Items per request, 1–500 (a request also stays under 4 MiB). Default 500. */
  maxBatch?: number;
  /** Items held (queued + in flight); beyond it `track()` drops the item and reports it. Default 100,000. */
  maxQueueSize?: number;
  /** Items that could not be delivered, and why. Default: a console.warn line. */
  onError?: (error: TrackerError) => void;
  /** Items the server accepted (202; `acks[i]` answers `items[i]`, `duplicate` when it had them already). */
  onDelivered?: (items: TrackerItem[], acks: Ack[]) => void;
  /** Retries of one batch after a 5xx or network error (refused, reset, timeout) before its items go to onError. 429 is not counted. Default 10. */
  maxRetries?: number;
  /** First backoff delay (doubling, capped, with jitter). Default 500. */
  retryBaseMs?: number;
  /** Backoff cap. Default 30,000. */
  retryMaxMs?: number;
  /** Per-request timeout. Default 30,000. */
  requestTimeoutMs?: number;
  /** When the process is about to exit naturally (`beforeExit`) with items still held, close() (with `exitTimeoutMs`). Default true. */
  flushOnExit?: boolean;
  /** How long that exit flush may take. Default 5,000. */
  exitTimeoutMs?: number;
  /** Custom fetch (tests, instrumentation). */
  fetch?: (input: Request) => Promise<Response>;
  /** Extra headers on every request. */
  headers?: Record<string, string>;
  /**
   * Batches of at least 1 KiB are sent gzip-compressed (`content-encoding:
   * gzip`, CompressionStream): JSON shrinks 5 to 10 times. `"none"` sends
   * them as is. A server that answers 415 to a compressed batch (a release
   * before compressed bodies) gets it again as is, and everything after.
   * Default `"gzip"`.
   */
  compression?: "gzip" | "none";
}

export interface TrackerStats {
  /** Items waiting to be sent. */
  queued: number;
  /** Items in the request being sent (or waiting for its retry). */
  inFlight: number;
  /** Items the server accepted (202), duplicates included. */
  delivered: number;
  /** Of those, answered `duplicate: true`. */
  duplicates: number;
  /** Items handed to onError (drops included). */
  failed: number;
  /** Items dropped because the queue was full. */
  dropped: number;
  /** Requests sent. */
  requests: number;
  /** Requests retried after a 5xx or network error. */
  retries: number;
  /** Requests answered 429. */
  rateLimited: number;
  /** Request body bytes sent (after compression). */
  bytesSent: number;
}

export interface FlushOptions {
  /** Stop waiting after this long (the promise then resolves `false`). Default: no limit. */
  timeoutMs?: number;
}

interface Pending {
  item: TrackerItem;
  json: string;
  bytes: number;
  seq: number;
}

interface Waiter {
  through: number;
  settle(ok: boolean): void;
}

/** Server answers that mean "something in this request": halve the batch to find it. */
const SPLITTABLE = new Set([400, 409, 413, 422]);

/**
 * Fire-and-forget delivery. `track()` / `identify()` only queue in memory and
 * answer the idempotency key; batches go out every `flushIntervalMs` or when
 * full, one request at a time. A batch is all or nothing on the server, so a
 * retry (429 after `Retry-After`; 5xx and network errors with capped
 * exponential backoff and jitter) re-sends the same items with the same keys
 * and the server answers the original ids: nothing is doubled.
 *
 * Process lifetime: the tracker's own timers never hold the process open.
 * `await flush()` / `await close()` do, until they are done. A process that
 * ends naturally with items still held gets them flushed on `beforeExit`
 * (at most `exitTimeoutMs`); `process.exit()` and signals skip that, so call
 * `close()` in your shutdown path.
 */
export class Tracker {
  readonly #t: Transport;
  readonly #flushIntervalMs: number;
  readonly #maxBatch: number;
  readonly #maxQueueSize: number;
  readonly #maxRetries: number;
  readonly #retryBaseMs: number;
  readonly #retryMaxMs: number;
  readonly #requestTimeoutMs: number;
  readonly #exitTimeoutMs: number;
  readonly #onError: (error: TrackerError) => void;
  readonly #onDelivered: ((items: TrackerItem[], acks: Ack[]) => void) | undefined;
  #compress: boolean;

  #queue: Pending[] = [];
  #head = 0;
  #queuedBytes = 0;
  readonly #inflight = new Set<Pending>();
  #seq = 0;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #sleeping: ReturnType<typeof setTimeout> | undefined;
  #worker: Promise<void> | undefined;
  #waiters: Waiter[] = [];
  #closed = false;
  #closing: Promise<void> | undefined;
  readonly #abort = new AbortController();
  #drops: TrackerItem[] = [];
  readonly #stats = { delivered: 0, duplicates: 0, failed: 0, dropped: 0, requests: 0, retries: 0, rateLimited: 0, bytesSent: 0 };

  constructor(options: TrackerOptions) {
    this.#t = new Transport({
      apiKey: options.apiKey,
      baseUrl: options.baseUrl,
      fetch: options.fetch,
      headers: options.headers,
      timeoutMs: 0, // the tracker sets its own deadline per request
    });
    this.#flushIntervalMs = nonNegative(options.flushIntervalMs, 500, "flushIntervalMs");
    this.#maxBatch = integerIn(options.maxBatch, MAX_BATCH_ITEMS, 1, MAX_BATCH_ITEMS, "maxBatch");
    this.#maxQueueSize = integerIn(options.maxQueueSize, 100_000, 1, Number.MAX_SAFE_INTEGER, "maxQueueSize");
    this.#maxRetries = nonNegative(options.maxRetries, 10, "maxRetries");
    this.#retryBaseMs = nonNegative(options.retryBaseMs, 500, "retryBaseMs");
    this.#retryMaxMs = nonNegative(options.retryMaxMs, 30_000, "retryMaxMs");
    this.#requestTimeoutMs = nonNegative(options.requestTimeoutMs, 30_000, "requestTimeoutMs");
    this.#exitTimeoutMs = nonNegative(options.exitTimeoutMs, 5_000, "exitTimeoutMs");
    this.#onError = options.onError ?? ((error) => console.warn(`[fastack] ${error.message}`));
    this.#onDelivered = options.onDelivered;
    const compression = options.compression ?? "gzip";
    if (compression !== "gzip" && compression !== "none") {
      throw new TypeError(`compression must be "gzip" or "none", got ${JSON.stringify(compression)}`);
    }
    this.#compress = compression === "gzip" && typeof CompressionStream === "function";
    if (options.flushOnExit ?? true) exitHook.add(this);
  }

  /** Queues a track event; answers its idempotency key (generated when not given). Never throws, never blocks. */
  track(input: TrackInput): string {
    return this.#add("track", input);
  }

  /** Queues an identify; answers its idempotency key. Never throws, never blocks. */
  identify(input: IdentifyInput): string {
    return this.#add("identify", input);
  }

  /** Counters since the tracker was made, and the current queue. */
  get stats(): TrackerStats {
    return { queued: this.#queue.length - this.#head, inFlight: this.#inflight.size, ...this.#stats };
  }

  /**
   * Sends everything queued so far and resolves once each of those items was
   * delivered or handed to onError: `true`, or `false` when `timeoutMs`
   * passed first (the items stay queued). Holds the process open meanwhile.
   */
  flush(options: FlushOptions = {}): Promise<boolean> {
    const through = this.#seq;
    if (this.#oldestHeld() > through) return Promise.resolve(true);
    return new Promise<boolean>((settleFlush) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const waiter: Waiter = {
        through,
        settle: (ok) => {
          if (timer) clearTimeout(timer);
          this.#waiters = this.#waiters.filter((w) => w !== waiter);
          if (!this.#holdOpen()) this.#sleeping?.unref();
          settleFlush(ok);
        },
      };
      const timeoutMs = options.timeoutMs;
      if (timeoutMs !== undefined && Number.isFinite(timeoutMs)) {
        timer = setTimeout(() => waiter.settle(false), Math.max(0, timeoutMs));
      }
      this.#waiters.push(waiter);
      this.#sleeping?.ref();
      this.#start();
    });
  }

  /**
   * Flushes, then stops: later `track()` calls are reported (`closed`). With
   * `timeoutMs`, whatever is still held then is abandoned (a request in
   * flight is aborted) and reported as `undelivered`. Idempotent.
   */
  close(options: FlushOptions = {}): Promise<void> {
    if (this.#closing) return this.#closing;
    this.#closed = true;
    exitHook.delete(this);
    this.#closing = (async () => {
      const ok = await this.flush(options);
      if (this.#timer) clearTimeout(this.#timer);
      this.#timer = undefined;
      if (ok) return;
      this.#abort.abort();
      const left = [...this.#inflight, ...this.#queue.slice(this.#head)].sort((a, b) => a.seq - b.seq);
      this.#inflight.clear();
      this.#queue = [];
      this.#head = 0;
      this.#queuedBytes = 0;
      this.#fail(
        "undelivered",
        left.map((p) => p.item),
        `close() gave up after ${options.timeoutMs} ms with ${left.length} item(s) undelivered ` +
          "(one in flight may have been stored: resend with the same idempotency key)",
      );
      this.#checkWaiters();
    })();
    return this.#closing;
  }

  /** @internal beforeExit: the process is about to end with items still held. */
  exitFlush(): void {
    if (this.#oldestHeld() !== Infinity) void this.close({ timeoutMs: this.#exitTimeoutMs });
  }

  // ---- intake -------------------------------------------------------------

  #add(type: "track" | "identify", input: TrackInput | IdentifyInput): string {
    const given = (input as { idempotencyKey?: unknown } | null | undefined)?.idempotencyKey;
    const key = typeof given === "string" ? given : randomUUID();
    let item: TrackerItem | undefined;
    try {
      const resolved = resolve({ ...input, idempotencyKey: key });
      item = { type, idempotencyKey: key, input: resolved } as TrackerItem;
      if (this.#closed) {
        this.#failSoon("closed", item, "tracked after close(): not sent");
        return key;
      }
      const invalid = check(type, resolved);
      if (invalid) {
        this.#failSoon("invalid", item, `not sent: ${invalid}`);
        return key;
      }
      const wire =
        type === "track"
          ? batchItem("track", resolved as Resolved<TrackInput>)
          : batchItem("identify", resolved as Resolved<IdentifyInput>);
      const json = JSON.stringify(wire);
      const bytes = Buffer.byteLength(json, "utf8");
      if (bytes > MAX_EVENT_BYTES) {
        this.#failSoon("too_large", item, `not sent: ${bytes} bytes serialised, the server takes at most ${MAX_EVENT_BYTES}`);
        return key;
      }
      if (this.#queue.length - this.#head + this.#inflight.size >= this.#maxQueueSize) {
        this.#drop(item);
        return key;
      }
      this.#queue.push({ item, json, bytes, seq: ++this.#seq });
      this.#queuedBytes += bytes;
      this.#schedule();
    } catch (err) {
      item ??= { type, idempotencyKey: key, input: { ...(input as object), idempotencyKey: key } } as TrackerItem;
      this.#failSoon("invalid", item, `not sent: ${(err as Error)?.message ?? String(err)}`, err);
    }
    return key;
  }

  #drop(item: TrackerItem): void {
    this.#stats.dropped++;
    this.#drops.push(item);
    if (this.#drops.length === 1) queueMicrotask(() => this.#reportDrops());
  }

  #reportDrops(): void {
    const items = this.#drops;
    if (items.length === 0) return;
    this.#drops = [];
    this.#fail("dropped", items, `queue full (maxQueueSize ${this.#maxQueueSize}): ${items.length} item(s) dropped`);
  }

  // ---- sending ------------------------------------------------------------

  #schedule(): void {
    if (this.#worker || this.#abort.signal.aborted) return;
    const queued = this.#queue.length - this.#head;
    if (queued >= this.#maxBatch || this.#queuedBytes + queued + ENVELOPE_BYTES >= MAX_REQUEST_BYTES || this.#waiters.length) {
      this.#start();
    } else if (!this.#timer) {
      this.#timer = setTimeout(() => {
        this.#timer = undefined;
        this.#start();
      }, this.#flushIntervalMs);
      this.#timer.unref?.();
    }
  }

  #start(): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    if (this.#worker || this.#abort.signal.aborted || this.#queue.length === this.#head) return;
    this.#worker = this.#run().finally(() => {
      this.#worker = undefined;
      if (this.#queue.length > this.#head) this.#schedule();
    });
  }

  async #run(): Promise<void> {
    while (this.#queue.length > this.#head && !this.#abort.signal.aborted) {
      await this.#deliver(this.#take());
    }
  }

  /** Up to maxBatch items, at most 4 MiB as a request, moved to in-flight. */
  #take(): Pending[] {
    const batch: Pending[] = [];
    let bytes = ENVELOPE_BYTES;
    while (batch.length < this.#maxBatch && this.#head < this.#queue.length) {
      const next = this.#queue[this.#head]!;
      const add = next.bytes + (batch.length > 0 ? 1 : 0);
      if (batch.length > 0 && bytes + add > MAX_REQUEST_BYTES) break;
      batch.push(next);
      bytes += add;
      this.#head++;
      this.#queuedBytes -= next.bytes;
      this.#inflight.add(next);
    }
    if (this.#head === this.#queue.length) {
      this.#queue = [];
      this.#head = 0;
    } else if (this.#head > 4096 && this.#head * 2 > this.#queue.length) {
      this.#queue = this.#queue.slice(this.#head);
      this.#head = 0;
    }
    return batch;
  }

  /** Sends `items` until each is delivered or reported. Never throws. */
  async #deliver(items: Pending[]): Promise<void> {
    let failures = 0;
    while (items.length > 0) {
      if (this.#abort.signal.aborted) return;
      let answer: { response: Response; body: unknown; compressed: boolean };
      try {
        answer = await this.#post(items);
      } catch (err) {
        if (this.#abort.signal.aborted) return;
        failures++;
        if (failures > this.#maxRetries) {
          this.#settleFailed("retries_exhausted", items, `no answer after ${failures} attempt(s): ${describe(err)}`, undefined, err);
          return;
        }
        this.#stats.retries++;
        if (!(await this.#pause(this.#backoff(failures)))) return;
        continue;
      }
      const { response, body } = answer;
      if (response.status >= 200 && response.status < 300) {
        const acks = (body as { items?: Ack[] } | undefined)?.items ?? [];
        this.#settleDelivered(items, acks);
        return;
      }
      const problem = ApiError.from(response, body);
      if (response.status === 415 && answer.compressed) {
        // A server without compressed bodies: send as is from now on.
        this.#compress = false;
        console.warn("[fastack] the server refused a gzip batch (415); sending batches uncompressed");
        continue;
      }
      const retryAfterMs = parseRetryAfter(response.headers.get("retry-after"));
      if (response.status === 429) {
        this.#stats.rateLimited++;
        const wait = retryAfterMs ?? this.#backoff(1);
        if (!(await this.#pause(wait + Math.random() * (wait * 0.1 + 50)))) return;
        continue;
      }
      if (response.status >= 500) {
        failures++;
        if (failures > this.#maxRetries) {
          this.#settleFailed("retries_exhausted", items, `still ${problem.message} after ${failures} attempt(s)`, problem);
          return;
        }
        this.#stats.retries++;
        if (!(await this.#pause(Math.max(this.#backoff(failures), retryAfterMs ?? 0)))) return;
        continue;
      }
      // Refused, and nothing of the request was kept (all or nothing).
      const named = namedItems(problem, items.length);
      if (named) {
        // The server named the culprits: report them, send the rest again.
        this.#settleFailed("rejected", items.filter((_, i) => named.has(i)), `refused: ${problem.message}`, problem);
        items = items.filter((_, i) => !named.has(i));
        failures = 0;
        continue;
      }
      if (items.length > 1 && SPLITTABLE.has(response.status)) {
        // Something in here is refused but not named: halve until it is alone.
        const mid = items.length >>> 1;
        await this.#deliver(items.slice(0, mid));
        await this.#deliver(items.slice(mid));
        return;
      }
      this.#settleFailed("rejected", items, `refused: ${problem.message}`, problem);
      return;
    }
  }

  async #post(items: Pending[]): Promise<{ response: Response; body: unknown; compressed: boolean }> {
    const json = `{"batch":[${items.map((p) => p.json).join(",")}]}`;
    const compressed = this.#compress && json.length >= COMPRESS_FROM;
    const payload: string | Uint8Array = compressed ? await gzip(json) : json;
    const deadline = withDeadline(this.#requestTimeoutMs, this.#abort.signal);
    try {
      this.#stats.requests++;
      this.#stats.bytesSent += typeof payload === "string" ? Buffer.byteLength(payload) : payload.byteLength;
      const { response, data, error } = await this.#t.api.POST("/v1/core/batch", {
        // The body is serialised once, when queued, and re-sent byte for byte.
        body: PLACEHOLDER,
        bodySerializer: () => payload,
        headers: compressed ? { "content-encoding": "gzip" } : undefined,
        signal: deadline.signal,
      });
      return { response, body: response.ok ? data : error, compressed };
    } finally {
      deadline.done();
    }
  }

  #backoff(failures: number): number {
    const cap = Math.min(this.#retryMaxMs, this.#retryBaseMs * 2 ** Math.min(failures - 1, 30));
    return cap / 2 + Math.random() * (cap / 2);
  }

  /** Waits `ms`; false when the tracker was aborted meanwhile. Holds the process open only while someone awaits flush()/close(). */
  #pause(ms: number): Promise<boolean> {
    const signal = this.#abort.signal;
    if (signal.aborted) return Promise.resolve(false);
    return new Promise((done) => {
      const finish = (ok: boolean) => {
        clearTimeout(timer);
        if (this.#sleeping === timer) this.#sleeping = undefined;
        signal.removeEventListener("abort", onAbort);
        done(ok);
      };
      const onAbort = () => finish(false);
      const timer = setTimeout(() => finish(true), ms);
      if (!this.#holdOpen()) timer.unref?.();
      this.#sleeping = timer;
      signal.addEventListener("abort", onAbort, { once: true });
    });
  }

  #holdOpen(): boolean {
    return this.#waiters.length > 0;
  }

  // ---- outcomes -----------------------------------------------------------

  #settleDelivered(items: Pending[], acks: Ack[]): void {
    for (const p of items) this.#inflight.delete(p);
    this.#stats.delivered += items.length;
    for (const ack of acks) if (ack?.duplicate) this.#stats.duplicates++;
    if (this.#onDelivered) {
      try {
        this.#onDelivered(
          items.map((p) => p.item),
          acks,
        );
      } catch (err) {
        console.error("[fastack] onDelivered threw", err);
      }
    }
    this.#checkWaiters();
  }

  #settleFailed(kind: TrackerErrorKind, items: Pending[], message: string, problem?: ApiError, cause?: unknown): void {
    if (items.length === 0) return;
    for (const p of items) this.#inflight.delete(p);
    this.#fail(
      kind,
      items.map((p) => p.item),
      message,
      problem,
      cause,
    );
    this.#checkWaiters();
  }

  #failSoon(kind: TrackerErrorKind, item: TrackerItem, message: string, cause?: unknown): void {
    // Reported after track() returned, so onError never runs inside it.
    queueMicrotask(() => this.#fail(kind, [item], message, undefined, cause));
  }

  #fail(kind: TrackerErrorKind, items: TrackerItem[], message: string, problem?: ApiError, cause?: unknown): void {
    this.#stats.failed += items.length;
    try {
      this.#onError(new TrackerError(kind, message, items, problem, cause));
    } catch (err) {
      console.error("[fastack] onError threw", err);
    }
  }

  /** seq of the oldest item not yet delivered or reported (Infinity when none). */
  #oldestHeld(): number {
    let oldest = this.#queue.length > this.#head ? this.#queue[this.#head]!.seq : Infinity;
    for (const p of this.#inflight) if (p.seq < oldest) oldest = p.seq;
    return oldest;
  }

  #checkWaiters(): void {
    if (this.#waiters.length === 0) return;
    const oldest = this.#oldestHeld();
    for (const w of [...this.#waiters]) if (oldest > w.through) w.settle(true);
  }
}

const PLACEHOLDER = { batch: [] as BatchItem[] };

/** Smaller batches are sent as is: compressing them saves little. */
const COMPRESS_FROM = 1024;

async function gzip(text: string): Promise<Uint8Array> {
  const stream = new Blob([text]).stream().pipeThrough(new CompressionStream("gzip"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

/** Refusals the server would certainly answer; the rest is left to the server (which names the item). */
function check(type: "track" | "identify", input: Resolved<TrackInput> | Resolved<IdentifyInput>): string | undefined {
  if (type === "track") {
    const event = (input as TrackInput).event;
    if (typeof event !== "string" || event === "") return "`event` is required (a non-empty string)";
  }
  const { userId, anonymousId, idempotencyKey } = input;
  if (userId === undefined && anonymousId === undefined) return "one of `userId` or `anonymousId` is required";
  for (const [name, v] of [
    ["userId", userId],
    ["anonymousId", anonymousId],
  ] as const) {
    if (v !== undefined && (typeof v !== "string" || v === "")) return `\`${name}\` must be a non-empty string`;
  }
  if (idempotencyKey === "") return "`idempotencyKey` must not be empty";
  const bag = type === "track" ? (input as TrackInput).properties : (input as IdentifyInput).traits;
  if (bag !== undefined && (typeof bag !== "object" || bag === null || Array.isArray(bag))) {
    return `\`${type === "track" ? "properties" : "traits"}\` must be an object`;
  }
  return undefined;
}

/** Item indexes named by the problem, when every error names one. */
function namedItems(problem: ApiError, count: number): Set<number> | undefined {
  if (problem.errors.length === 0) return undefined;
  const named = new Set<number>();
  for (const e of problem.errors) {
    if (typeof e.index !== "number" || !Number.isInteger(e.index) || e.index < 0 || e.index >= count) return undefined;
    named.add(e.index);
  }
  return named;
}

function describe(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as { cause?: unknown }).cause;
    return cause instanceof Error ? `${err.message} (${cause.message})` : err.message;
  }
  return String(err);
}

function nonNegative(value: number | undefined, fallback: number, name: string): number {
  if (value === undefined) return fallback;
  if (typeof value !== "number" || Number.isNaN(value) || value < 0) throw new RangeError(`${name} must be a number >= 0`);
  return value;
}

function integerIn(value: number | undefined, fallback: number, min: number, max: number, name: string): number {
  if (value === undefined) return fallback;
  if (!Number.isInteger(value) || value < min || value > max) throw new RangeError(`${name} must be an integer in ${min}..${max}`);
  return value;
}

/** One `beforeExit` listener for every live tracker. */
const exitHook = {
  live: new Set<Tracker>(),
  listening: false,
  listener: () => {
    for (const t of [...exitHook.live]) t.exitFlush();
  },
  add(t: Tracker) {
    this.live.add(t);
    if (!this.listening) {
      process.on("beforeExit", this.listener);
      this.listening = true;
    }
  },
  delete(t: Tracker) {
    this.live.delete(t);
    if (this.live.size === 0 && this.listening) {
      process.off("beforeExit", this.listener);
      this.listening = false;
    }
  },
};
