import { ApiError, TimeoutError } from "./errors.js";
import { Transport, type ApiClient, type TransportOptions } from "./http.js";
import { toInstant } from "./time.js";
import type {
  Ack,
  BatchInput,
  Contact,
  Event,
  ErasureAccepted,
  EventsPage,
  ExportAccepted,
  IdentifyInput,
  Job,
  JobState,
  Subject,
  Suppression,
  Timestamp,
  TrackInput,
} from "./types.js";
import { batchItemOf, identifyBody, resolve, trackBody } from "./wire.js";

export type ClientOptions = TransportOptions;

/** Per-call options. */
export interface CallOptions {
  /** Cancels the request. */
  signal?: AbortSignal;
}

export interface EventsQuery {
  /** Inclusive lower bound of `occurred_at`. A Date is sent as UTC. */
  from: Timestamp;
  /** Exclusive upper bound of `occurred_at`. */
  to: Timestamp;
  /** Only this contact's events (and those of contacts merged into it). At most one of contactId, userId, anonymousId. */
  contactId?: string;
  /** Only the events of the contact this user id resolves to. */
  userId?: string;
  /** Only the events of the contact this anonymous id resolves to. */
  anonymousId?: string;
  /** Only events with this name. */
  event?: string;
  /** Events per request (the API's `limit`, 1–1000; server default 100). */
  pageSize?: number;
}

export interface ExportInput {
  from: Timestamp;
  to: Timestamp;
  /** Only events with this name. */
  event?: string;
  /** Copied to the job and its terminal event (`error` is reserved). */
  metadata?: Record<string, unknown>;
}

/** Whom to erase: 1–5,000 identifiers in all, of any kind. */
export interface ErasureInput {
  userIds?: string[];
  anonymousIds?: string[];
  contactIds?: string[];
  /** Also drop their future events until the suppression is lifted. */
  suppress?: boolean;
  /** Erase only what occurred at or after this instant (the contact then stays). */
  from?: Timestamp;
  /** Erase only what occurred before this instant. */
  to?: Timestamp;
  /** Copied to the job and its terminal event (`error` is reserved). */
  metadata?: Record<string, unknown>;
}

export interface WaitOptions extends CallOptions {
  /** Give up after this long (TimeoutError). Default 60 s. */
  timeoutMs?: number;
  /** Time between polls. Default 250 ms. */
  intervalMs?: number;
}

export type ContactLookup = { userId: string; anonymousId?: never } | { anonymousId: string; userId?: never };

const TERMINAL: ReadonlySet<string> = new Set(["completed", "failed"]);

/**
 * The fastack API. Methods throw `ApiError` for a non-2xx answer; network
 * failures and timeouts reject with fetch's own error (TypeError /
 * DOMException). Nothing is retried here: use `Tracker` for fire-and-forget
 * delivery with retries, or resend with the same `idempotencyKey`.
 */
export class Client {
  readonly #t: Transport;

  constructor(options: ClientOptions) {
    this.#t = new Transport(options);
  }

  /** The typed openapi-fetch client underneath (escape hatch: every operation of the spec). */
  get raw(): ApiClient {
    return this.#t.api;
  }

  /** `POST /v1/core/track`. A missing `idempotencyKey` is generated, a missing `occurredAt` is now. */
  async track(input: TrackInput, options: CallOptions = {}): Promise<Ack> {
    const body = trackBody(resolve(input));
    const { data } = await this.#t.call((signal) => this.#t.api.POST("/v1/core/track", { body, signal }), options.signal);
    return data as Ack;
  }

  /** `POST /v1/core/identify`. */
  async identify(input: IdentifyInput, options: CallOptions = {}): Promise<Ack> {
    const body = identifyBody(resolve(input));
    const { data } = await this.#t.call(
      (signal) => this.#t.api.POST("/v1/core/identify", { body, signal }),
      options.signal,
    );
    return data as Ack;
  }

  /** `POST /v1/core/batch`: 1–500 items, all accepted or none; one Ack per item, in order. */
  async batch(items: readonly BatchInput[], options: CallOptions = {}): Promise<Ack[]> {
    const body = { batch: items.map(batchItemOf) };
    const { data } = await this.#t.call((signal) => this.#t.api.POST("/v1/core/batch", { body, signal }), options.signal);
    return (data as { items: Ack[] }).items;
  }

  /** One page of `GET /v1/core/events` (pass `cursor` = the previous page's `next_cursor`). */
  async eventsPage(query: EventsQuery & { cursor?: string }, options: CallOptions = {}): Promise<EventsPage> {
    const params = {
      query: {
        from: toInstant(query.from, "from"),
        to: toInstant(query.to, "to"),
        contact_id: query.contactId,
        user_id: query.userId,
        anonymous_id: query.anonymousId,
        event: query.event,
        limit: query.pageSize,
        cursor: query.cursor,
      },
    };
    const { data } = await this.#t.call(
      (signal) => this.#t.api.GET("/v1/core/events", { params, signal }),
      options.signal,
    );
    return data as EventsPage;
  }

  /** Every event with `from <= occurred_at < to`, page after page, ordered by `occurred_at` then id. */
  async *events(query: EventsQuery, options: CallOptions = {}): AsyncGenerator<Event, void, undefined> {
    let cursor: string | undefined;
    do {
      const page = await this.eventsPage({ ...query, ...(cursor === undefined ? {} : { cursor }) }, options);
      yield* page.events;
      cursor = page.next_cursor;
    } while (cursor);
  }

  readonly contacts = {
    /** `GET /v1/core/contacts/{id}` (a merged contact's id answers the survivor). Throws ApiError 404 when unknown. */
    get: async (id: string, options: CallOptions = {}): Promise<Contact> => {
      const { data } = await this.#t.call(
        (signal) => this.#t.api.GET("/v1/core/contacts/{id}", { params: { path: { id } }, signal }),
        options.signal,
      );
      return data as Contact;
    },
    /** `GET /v1/core/contacts?user_id=|anonymous_id=`; `null` when there is no such contact. */
    find: async (lookup: ContactLookup, options: CallOptions = {}): Promise<Contact | null> => {
      const query = { user_id: lookup.userId, anonymous_id: lookup.anonymousId };
      try {
        const { data } = await this.#t.call(
          (signal) => this.#t.api.GET("/v1/core/contacts", { params: { query }, signal }),
          options.signal,
        );
        return data as Contact;
      } catch (err) {
        if (err instanceof ApiError && err.status === 404 && err.code === "not_found") return null;
        throw err;
      }
    },
  };

  readonly exports = {
    /** `POST /v1/core/exports`: starts an export job of `[from, to)`; answers its `job_id`. */
    create: async (input: ExportInput, options: CallOptions = {}): Promise<ExportAccepted> => {
      const body: Record<string, unknown> = { from: toInstant(input.from, "from"), to: toInstant(input.to, "to") };
      if (input.event !== undefined) body.event = input.event;
      if (input.metadata !== undefined) body.metadata = input.metadata;
      const { data } = await this.#t.call(
        (signal) =>
          this.#t.api.POST("/v1/core/exports", { body: body as { from: string; to: string }, signal }),
        options.signal,
      );
      return data as ExportAccepted;
    },
  };

  readonly erasures = {
    /**
     * `POST /v1/core/erasures`: erases the people from every store and
     * answers the job's id; `jobs.wait(job_id)` gives its certificate
     * (`result`). Events of theirs accepted before the answer are erased too.
     */
    create: async (input: ErasureInput, options: CallOptions = {}): Promise<ErasureAccepted> => {
      const body: Record<string, unknown> = {};
      if (input.userIds?.length) body.user_ids = input.userIds;
      if (input.anonymousIds?.length) body.anonymous_ids = input.anonymousIds;
      if (input.contactIds?.length) body.contact_ids = input.contactIds;
      if (input.suppress !== undefined) body.suppress = input.suppress;
      if (input.from !== undefined) body.from = toInstant(input.from, "from");
      if (input.to !== undefined) body.to = toInstant(input.to, "to");
      if (input.metadata !== undefined) body.metadata = input.metadata;
      const { data } = await this.#t.call(
        (signal) => this.#t.api.POST("/v1/core/erasures", { body, signal }),
        options.signal,
      );
      return data as ErasureAccepted;
    },
  };

  readonly suppressions = {
    /** `GET /v1/core/suppressions`: suppressed identifiers by hash; with a lookup, whether that one is. */
    list: async (lookup: Partial<ContactLookup> = {}, options: CallOptions = {}): Promise<Suppression[]> => {
      const query = { user_id: lookup.userId, anonymous_id: lookup.anonymousId };
      const { data } = await this.#t.call(
        (signal) => this.#t.api.GET("/v1/core/suppressions", { params: { query }, signal }),
        options.signal,
      );
      return (data as { suppressions: Suppression[] }).suppressions;
    },

    /** `DELETE /v1/core/suppressions`: the identifier's events are processed again (404 ApiError when not suppressed). */
    lift: async (lookup: ContactLookup, options: CallOptions = {}): Promise<Subject> => {
      const query = { user_id: lookup.userId, anonymous_id: lookup.anonymousId };
      const { data } = await this.#t.call(
        (signal) => this.#t.api.DELETE("/v1/core/suppressions", { params: { query }, signal }),
        options.signal,
      );
      return (data as { lifted: Subject }).lifted;
    },
  };

  readonly jobs = {
    /** `GET /v1/core/jobs/{id}`. */
    get: async (id: string, options: CallOptions = {}): Promise<Job> => {
      const { data } = await this.#t.call(
        (signal) => this.#t.api.GET("/v1/core/jobs/{id}", { params: { path: { id } }, signal }),
        options.signal,
      );
      return data as Job;
    },

    /** `GET /v1/core/jobs`: newest first (server default 50, at most 500). */
    list: async (query: { status?: JobState; limit?: number } = {}, options: CallOptions = {}): Promise<Job[]> => {
      const { data } = await this.#t.call(
        (signal) =>
          this.#t.api.GET("/v1/core/jobs", { params: { query: { status: query.status, limit: query.limit } }, signal }),
        options.signal,
      );
      return (data as { jobs: Job[] }).jobs;
    },

    /**
     * Polls the job until it is `completed` or `failed` and answers it (a
     * failed job is answered, not thrown: see `metadata.error.message`).
     * Throws TimeoutError after `timeoutMs`.
     */
    wait: async (id: string, options: WaitOptions = {}): Promise<Job> => {
      const timeoutMs = options.timeoutMs ?? 60_000;
      const intervalMs = options.intervalMs ?? 250;
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const job = await this.jobs.get(id, options);
        if (TERMINAL.has(job.status)) return job;
        const left = deadline - Date.now();
        if (left <= 0) throw new TimeoutError(`job ${id} is still ${job.status} after ${timeoutMs} ms`, job);
        await sleep(Math.min(intervalMs, left), options.signal, true);
      }
    },

    /**
     * `GET /v1/core/jobs/{id}/result` as the raw byte stream (the decrypted
     * NDJSON; hash these bytes to check `result.hmac`). 409
     * `job_not_completed` (ApiError) until the job is completed.
     */
    resultStream: async (id: string, options: CallOptions = {}): Promise<ReadableStream<Uint8Array>> => {
      const { data } = await this.#t.call(
        (signal) =>
          this.#t.api.GET("/v1/core/jobs/{id}/result", { params: { path: { id } }, parseAs: "stream", signal }),
        options.signal,
        true,
      );
      return (data as ReadableStream<Uint8Array> | null) ?? new ReadableStream({ start: (c) => c.close() });
    },

    /** The export's lines, as they stream in (no line ending; empty lines skipped). */
    resultLines: (id: string, options: CallOptions = {}): AsyncGenerator<string, void, undefined> =>
      ndjsonLines(() => this.jobs.resultStream(id, options)),

    /** The export's events, parsed line by line as they stream in. */
    result: (id: string, options: CallOptions = {}): AsyncGenerator<Event, void, undefined> =>
      parseLines(this.jobs.resultLines(id, options)),
  };
}

async function* parseLines(lines: AsyncIterable<string>): AsyncGenerator<Event, void, undefined> {
  for await (const line of lines) yield JSON.parse(line) as Event;
}

/** Splits a byte stream into lines (LF or CRLF), skipping empty ones; cancels the stream if abandoned. */
export async function* ndjsonLines(
  open: () => Promise<ReadableStream<Uint8Array>>,
): AsyncGenerator<string, void, undefined> {
  const stream = await open();
  const reader = stream.getReader();
  const decoder = new TextDecoder("utf-8", { fatal: true });
  let buffered = "";
  let finished = false;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        finished = true;
        break;
      }
      buffered += decoder.decode(value, { stream: true });
      let nl: number;
      while ((nl = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, nl).replace(/\r$/, "");
        buffered = buffered.slice(nl + 1);
        if (line !== "") yield line;
      }
    }
    buffered += decoder.decode();
    const last = buffered.replace(/\r$/, "");
    if (last !== "") yield last;
  } finally {
    if (!finished) await reader.cancel().catch(() => {});
    reader.releaseLock();
  }
}

/** Resolves after `ms` (the timer does not hold the process open), or rejects when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal, ref = false): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    if (!ref) timer.unref?.();
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
