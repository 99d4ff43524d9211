import { randomUUID } from "node:crypto";
import { ApiError, parseRetryAfter } from "./errors.js";
import { Transport, withDeadline } from "./http.js";
import type { Ack, BatchItem, IdentifyInput, TrackInput } from "./types.js";
import { Spool } from "./spool.js";
import { batchItem, resolve, type Resolved } from "./wire.js";

/** Most items in one `POST /v1/core/batch`. */
export const MAX_BATCH_ITEMS = 500;
/** Largest event the server takes (a batch item as serialised). */
export const MAX_EVENT_BYTES = 32 * 1024;
/** Largest request body the server takes. */
export const MAX_REQUEST_BYTES = 4 * 1024 * 1024;
const ENVELOPE_BYTES = '{"batch":[]}'.length;
/** How long `flush()` and `close()` wait by default (ms): an application's shutdown never hangs on its analytics. */
export const DEFAULT_FLUSH_TIMEOUT_MS = 10_000;
export const DEFAULT_CLOSE_TIMEOUT_MS = 10_000;

/** An item the tracker took, as it reports it back: key and `occurredAt` filled in. */
export type TrackerItem =
  | { type: "track"; idempotencyKey: string; input: Resolved<TrackInput> }
  | { type: "identify"; idempotencyKey: string; input: Resolved<IdentifyInput> };

/**
 * Why items reached `onError`:
 * - `unauthorized` / `forbidden`: the server refused the API key (401 / 403; `problem` says why). The
 *   tracker stops sending: everything it holds and everything tracked later is reported so, unsent.
 * - `rejected`: the server refused them (another 4xx other than 429; `problem` says why). Not retried.
 * - `invalid`: refused before sending (no event name, no id, not JSON-serialisable).
 * - `too_large`: over 32 KiB serialised; never sent (the rest of its batch is).
 * - `dropped`: the queue was full (`maxQueueSize`); never sent.
 * - `closed`: tracked after `close()`; never sent.
 * - `retries_exhausted`: no 2xx after `maxRetries` retries (5xx, network). They may or may
 *   not be stored: resending them with the same idempotency key is safe.
 * - `undelivered`: `close()` ran out of time and there is no spool. Same as above: resend with the same key.
 */
export type TrackerErrorKind =
  | "unauthorized"
  | "forbidden"
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
  /** The server's answer, for `unauthorized`, `forbidden`, `rejected` (and the last one for `retries_exhausted`, when there was one). */
  readonly problem: ApiError | undefined;
  /** Set when `flush()` / `close()` rejected with this error (`throwOnError`): what the call did. */
  readonly result: FlushResult | undefined;

  constructor(kind: TrackerErrorKind, message: string, items: TrackerItem[], problem?: ApiError, cause?: unknown, result?: FlushResult) {
    super(message, cause === undefined ? undefined : { cause });
    this.kind = kind;
    this.items = items;
    this.problem = problem;
    this.result = result;
  }
}

/**
 * What `close()` (and `flush({ detailed: true })`) did. `ok` only when
 * everything was delivered. Each failure is counted in one result: the next
 * after it happened (so one result left unread does not hide it from the
 * next); after a 401/403 every result carries that error.
 */
export interface FlushResult {
  /** Everything delivered: nothing pending, failed or spooled, no error. */
  ok: boolean;
  /** Items tracked before the call still queued or in flight at the deadline (flush(): they stay queued and are retried; close(): always 0). */
  pending: number;
  /** Items handed to onError since the previous result: refused (401/403/422/…), invalid, too large, dropped, undelivered at close() without a spool. */
  failed: number;
  /** Items close() (or the exit flush) wrote to the spool; a tracker started later on it sends them. */
  spooled: number;
  /** The spool file written, if any. */
  spoolFile: string | undefined;
  /** The deadline passed before everything was delivered. */
  timedOut: boolean;
  /** The most serious failure behind the above (`unauthorized` / `forbidden` first; for a deadline, what the last retry saw). */
  error: TrackerError | undefined;
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
  /** How long `flush()` waits when given no `timeoutMs`. Default 10,000 (Infinity: no limit). */
  flushTimeoutMs?: number;
  /** How long `close()` waits when given no `timeoutMs`; then what is left is spooled or reported as `undelivered`. Default 10,000. */
  closeTimeoutMs?: number;
  /**
   * A directory (created 0700 if missing): what `close()` or the exit flush
   * could not deliver by its deadline is written there (JSON lines, 0600,
   * atomically), and a tracker started later on it sends those items first,
   * with their idempotency keys: exactly once. Several processes may share it.
   */
  spoolDir?: string;
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
  /** Stop waiting after this long. Default: the tracker's `flushTimeoutMs` / `closeTimeoutMs` (10 s); `Infinity`: no limit. */
  timeoutMs?: number;
  /** Reject with a `TrackerError` (its `result` set) instead of resolving when not everything was delivered. */
  throwOnError?: boolean;
}

/** `flush({ detailed: true })` resolves the `FlushResult` instead of a boolean. */
export interface DetailedFlushOptions extends FlushOptions {
  detailed: true;
}

interface Pending {
  item: TrackerItem;
  json: string;
  bytes: number;
  seq: number;
  /** Read from the spool (kept for it on a 401/403). */
  fromSpool?: boolean;
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
  readonly #flushTimeoutMs: number;
  readonly #closeTimeoutMs: number;
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
  #closing: Promise<FlushResult> | undefined;
  readonly #abort = new AbortController();
  #drops: TrackerItem[] = [];
  // What results report: failures since the last result, the worst among
  // them, what the last retry saw, a refused key (sticky).
  #failedMark = 0;
  #windowError: TrackerError | undefined;
  #retryProblem: ApiError | undefined;
  #retryCause: unknown;
  #authError: TrackerError | undefined;
  // The spool: the files this tracker claimed, how many of their items are
  // not yet delivered or refused, and those a refused key kept for it.
  readonly #spool: Spool | undefined;
  #claimed: string[] = [];
  #spoolOpen = 0;
  #respool: Pending[] = [];
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
    this.#flushTimeoutMs = nonNegative(options.flushTimeoutMs, DEFAULT_FLUSH_TIMEOUT_MS, "flushTimeoutMs");
    this.#closeTimeoutMs = nonNegative(options.closeTimeoutMs, DEFAULT_CLOSE_TIMEOUT_MS, "closeTimeoutMs");
    this.#onError = options.onError ?? ((error) => console.warn(`[fastack] ${error.message}`));
    this.#onDelivered = options.onDelivered;
    const compression = options.compression ?? "gzip";
    if (compression !== "gzip" && compression !== "none") {
      throw new TypeError(`compression must be "gzip" or "none", got ${JSON.stringify(compression)}`);
    }
    this.#compress = compression === "gzip" && typeof CompressionStream === "function";
    if (options.flushOnExit ?? true) exitHook.add(this);
    if (options.spoolDir !== undefined) {
      this.#spool = new Spool(options.spoolDir);
      this.#loadSpool(this.#spool);
    }
  }

  /** What earlier trackers spooled goes to the front of the queue and is sent at once. */
  #loadSpool(spool: Spool): void {
    const { files, lines } = spool.claim(this.#maxQueueSize);
    if (files.length === 0) return;
    for (const { json, wire } of lines) {
      this.#queue.push({ item: itemOfWire(wire), json, bytes: Buffer.byteLength(json, "utf8"), seq: ++this.#seq, fromSpool: true });
      this.#queuedBytes += Buffer.byteLength(json, "utf8");
    }
    this.#claimed = files;
    this.#spoolOpen = lines.length;
    if (lines.length === 0) this.#spoolSettled([]);
    this.#start();
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
   * Sends everything queued so far and waits until each of those items was
   * delivered or handed to onError, at most `timeoutMs` (default the
   * tracker's `flushTimeoutMs`, 10 s). Resolves `true` only when everything
   * was delivered: `false` when the deadline passed first (the items stay
   * queued and keep being retried: flush() neither drops nor spools) or when
   * items were handed to onError since the previous flush()/close() result
   * (a 401 included). `{ detailed: true }` resolves the `FlushResult`
   * instead; `{ throwOnError: true }` rejects with a `TrackerError` instead of
   * resolving `false`. Holds the process open meanwhile.
   */
  flush(options: DetailedFlushOptions): Promise<FlushResult>;
  flush(options?: FlushOptions): Promise<boolean>;
  flush(options: FlushOptions & { detailed?: boolean } = {}): Promise<boolean | FlushResult> {
    const through = this.#seq;
    const timeoutMs = options.timeoutMs ?? this.#flushTimeoutMs;
    return this.#wait(through, timeoutMs).then((settled) => {
      const result = this.#result(settled ? 0 : this.#heldThrough(through), !settled);
      if (!result.ok) console.warn(`[fastack] flush(): ${describeResult(result)}${result.pending ? " (still queued, retried)" : ""}`);
      if (options.throwOnError && !result.ok) throw resultError("flush()", result);
      return options.detailed ? result : result.ok;
    });
  }

  /**
   * Flushes, then stops, within `timeoutMs` (default the tracker's
   * `closeTimeoutMs`, 10 s). What is not delivered by then is given up (a
   * request in flight is aborted): written to the spool when there is one
   * (`spoolDir`), otherwise reported as `undelivered`. Resolves a
   * `FlushResult` (`ok` only when everything was delivered) and writes a
   * console.warn line when not; `{ throwOnError: true }` rejects with a
   * `TrackerError` instead. Later `track()` calls are reported (`closed`).
   * Idempotent: a second call answers the first call's result.
   */
  close(options: FlushOptions = {}): Promise<FlushResult> {
    if (!this.#closing) {
      this.#closed = true;
      exitHook.delete(this);
      this.#closing = this.#shutdown(options.timeoutMs ?? this.#closeTimeoutMs);
    }
    if (!options.throwOnError) return this.#closing;
    return this.#closing.then((result) => {
      if (!result.ok) throw resultError("close()", result);
      return result;
    });
  }

  async #shutdown(timeoutMs: number): Promise<FlushResult> {
    const started = Date.now();
    const settled = await this.#wait(this.#seq, timeoutMs);
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    let left: Pending[] = [];
    if (!settled) {
      this.#abort.abort();
      left = [...this.#inflight, ...this.#queue.slice(this.#head)].sort((a, b) => a.seq - b.seq);
      this.#inflight.clear();
      this.#queue = [];
      this.#head = 0;
      this.#queuedBytes = 0;
    }
    const keep = this.#respool;
    this.#respool = [];
    let claimed = this.#claimed;
    this.#claimed = [];
    let spooled = 0;
    let spoolFile: string | undefined;
    if (left.length > 0 || keep.length > 0) {
      const why = `not delivered within close()'s ${timeoutMs} ms deadline${this.#lastRetryError()}`;
      if (this.#spool) {
        try {
          spoolFile = this.#spool.write([...keep, ...left].map((p) => p.json));
          spooled = keep.length + left.length;
        } catch (err) {
          console.error(`[fastack] cannot write the spool ${this.#spool.dir}: ${(err as Error).message}`);
          this.#spool.release(claimed); // what came from there stays there
          claimed = [];
          this.#fail("undelivered", left.map((p) => p.item), `${why}; the spool could not be written: ${(err as Error).message}`);
        }
      } else {
        this.#fail(
          "undelivered",
          left.map((p) => p.item),
          `close() gave up: ${left.length} item(s) ${why} (one in flight may have been stored: resend with the same idempotency key)`,
          this.#retryProblem,
          this.#retryCause,
        );
      }
    }
    if (claimed.length > 0) this.#spool?.remove(claimed);
    this.#checkWaiters();
    const result = this.#result(0, !settled, spooled, spoolFile);
    if (!result.ok) console.warn(`[fastack] close() after ${((Date.now() - started) / 1000).toFixed(1)} s: ${describeResult(result)}`);
    return result;
  }

  /** @internal beforeExit: the process is about to end with items still held. */
  exitFlush(): void {
    if (this.#oldestHeld() !== Infinity || this.#respool.length > 0 || this.#claimed.length > 0) {
      void this.close({ timeoutMs: this.#exitTimeoutMs });
    }
  }

  /** Resolves true once every item numbered up to `through` is delivered or reported, false after `timeoutMs`. */
  #wait(through: number, timeoutMs: number): Promise<boolean> {
    if (this.#oldestHeld() > through) return Promise.resolve(true);
    return new Promise<boolean>((settleWait) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const waiter: Waiter = {
        through,
        settle: (ok) => {
          if (timer) clearTimeout(timer);
          this.#waiters = this.#waiters.filter((w) => w !== waiter);
          if (!this.#holdOpen()) this.#sleeping?.unref();
          settleWait(ok);
        },
      };
      if (Number.isFinite(timeoutMs)) timer = setTimeout(() => waiter.settle(false), Math.max(0, timeoutMs));
      this.#waiters.push(waiter);
      this.#sleeping?.ref();
      this.#start();
    });
  }

  /** Items numbered up to `through` still queued or in flight. */
  #heldThrough(through: number): number {
    let n = 0;
    for (const p of this.#inflight) if (p.seq <= through) n++;
    for (let i = this.#head; i < this.#queue.length && this.#queue[i]!.seq <= through; i++) n++;
    return n;
  }

  /** The result of a flush()/close(): failures since the previous result; then counting starts again. */
  #result(pending: number, timedOut: boolean, spooled = 0, spoolFile?: string): FlushResult {
    const failed = this.#stats.failed - this.#failedMark;
    this.#failedMark = this.#stats.failed;
    let error = this.#authError ?? this.#windowError;
    this.#windowError = undefined;
    if (!error && (pending > 0 || spooled > 0)) {
      error = new TrackerError(
        "undelivered",
        `${pending + spooled} item(s) not delivered in time${this.#lastRetryError()}`,
        [],
        this.#retryProblem,
        this.#retryCause,
      );
    }
    const ok = pending === 0 && failed === 0 && spooled === 0 && error === undefined;
    return { ok, pending, failed, spooled, spoolFile, timedOut, error };
  }

  #lastRetryError(): string {
    if (this.#retryProblem) return ` (last error: ${this.#retryProblem.message})`;
    if (this.#retryCause !== undefined) return ` (last error: ${describe(this.#retryCause)})`;
    return "";
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
      if (this.#authError) {
        // A refused key: fail fast with the same error, never sent.
        const { kind, message, problem } = this.#authError;
        this.#failSoon(kind, item, message, undefined, problem);
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
    if (this.#worker || this.#abort.signal.aborted || this.#authError) return;
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
    if (this.#worker || this.#abort.signal.aborted || this.#authError || this.#queue.length === this.#head) return;
    this.#worker = this.#run().finally(() => {
      this.#worker = undefined;
      if (this.#queue.length > this.#head) this.#schedule();
    });
  }

  async #run(): Promise<void> {
    while (this.#queue.length > this.#head && !this.#abort.signal.aborted && !this.#authError) {
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
        this.#retryProblem = undefined;
        this.#retryCause = err;
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
      if (response.status === 401 || response.status === 403) {
        this.#authFailed(problem, items);
        return;
      }
      const retryAfterMs = parseRetryAfter(response.headers.get("retry-after"));
      if (response.status === 429 || response.status >= 500) {
        this.#retryProblem = problem;
        this.#retryCause = undefined;
      }
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

  /**
   * A 401/403: the key is refused, and will be for every later request.
   * Stop sending; this batch and everything queued are reported at once
   * (kind `unauthorized` / `forbidden`), as is everything tracked later;
   * items read from the spool are kept for it instead.
   */
  #authFailed(problem: ApiError, items: Pending[]): void {
    const kind: TrackerErrorKind = problem.status === 401 ? "unauthorized" : "forbidden";
    const first = this.#authError === undefined;
    const all = [...items, ...this.#queue.slice(this.#head)];
    for (const p of items) this.#inflight.delete(p);
    this.#queue = [];
    this.#head = 0;
    this.#queuedBytes = 0;
    const keep = all.filter((p) => p.fromSpool);
    const lose = all.filter((p) => !p.fromSpool);
    this.#respool.push(...keep);
    this.#spoolSettled(keep);
    const message =
      `the server refused the API key (${problem.message}): the tracker stopped sending; ` +
      "every item it holds or is given from now on is reported, unsent";
    if (first) console.error(`[fastack] ${message}`);
    // Reported even with no item (all kept for the spool): the application hears of the key.
    if (lose.length > 0 || first) {
      const error = this.#fail(kind, lose.map((p) => p.item), message, problem);
      this.#authError ??= error;
    }
    this.#checkWaiters();
  }

  /** Items read from the spool are done with (delivered, refused, or kept in #respool): remove the claimed files once all are. */
  #spoolSettled(items: Pending[]): void {
    for (const p of items) if (p.fromSpool) this.#spoolOpen--;
    if (this.#spoolOpen <= 0 && this.#respool.length === 0 && this.#claimed.length > 0) {
      const files = this.#claimed;
      this.#claimed = [];
      this.#spool?.remove(files);
    }
  }

  #settleDelivered(items: Pending[], acks: Ack[]): void {
    for (const p of items) this.#inflight.delete(p);
    this.#retryProblem = undefined;
    this.#retryCause = undefined;
    this.#spoolSettled(items);
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
    this.#spoolSettled(items);
    this.#fail(
      kind,
      items.map((p) => p.item),
      message,
      problem,
      cause,
    );
    this.#checkWaiters();
  }

  #failSoon(kind: TrackerErrorKind, item: TrackerItem, message: string, cause?: unknown, problem?: ApiError): void {
    // Reported after track() returned, so onError never runs inside it.
    queueMicrotask(() => this.#fail(kind, [item], message, problem, cause));
  }

  #fail(kind: TrackerErrorKind, items: TrackerItem[], message: string, problem?: ApiError, cause?: unknown): TrackerError {
    this.#stats.failed += items.length;
    const error = new TrackerError(kind, message, items, problem, cause);
    // The worst since the last result: a refused key first.
    if (!this.#windowError || (isAuth(error) && !isAuth(this.#windowError))) this.#windowError = error;
    try {
      this.#onError(error);
    } catch (err) {
      console.error("[fastack] onError threw", err);
    }
    return error;
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

function isAuth(error: TrackerError): boolean {
  return error.kind === "unauthorized" || error.kind === "forbidden";
}

/** "7 item(s) not delivered (7 spooled to …), deadline reached; unauthorized: …" */
function describeResult(r: FlushResult): string {
  if (r.ok) return "everything delivered";
  const parts: string[] = [];
  if (r.pending) parts.push(`${r.pending} still queued`);
  if (r.spooled) parts.push(`${r.spooled} spooled to ${r.spoolFile}`);
  if (r.failed) parts.push(`${r.failed} handed to onError`);
  let text = `${r.pending + r.failed + r.spooled} item(s) not delivered${parts.length ? ` (${parts.join(", ")})` : ""}`;
  if (r.timedOut) text += ", deadline reached";
  if (r.error) text += `; ${r.error.kind}: ${r.error.message}`;
  return text;
}

/** What `throwOnError` rejects with: the result's error (kind, problem), the result attached. */
function resultError(call: string, result: FlushResult): TrackerError {
  const e = result.error;
  return new TrackerError(e?.kind ?? "undelivered", `${call}: ${describeResult(result)}`, e?.items ?? [], e?.problem, e, result);
}

/** A spooled line (the wire item) as the tracker reports items: camelCase input, key and time filled in. */
function itemOfWire(wire: Record<string, unknown>): TrackerItem {
  const input: Record<string, unknown> = {};
  const pairs: [string, string][] = [
    ["event", "event"],
    ["user_id", "userId"],
    ["anonymous_id", "anonymousId"],
    ["properties", "properties"],
    ["traits", "traits"],
    ["occurred_at", "occurredAt"],
    ["idempotency_key", "idempotencyKey"],
  ];
  for (const [from, to] of pairs) if (wire[from] !== undefined) input[to] = wire[from];
  return { type: wire.type, idempotencyKey: String(wire.idempotency_key ?? ""), input } as unknown as TrackerItem;
}

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
