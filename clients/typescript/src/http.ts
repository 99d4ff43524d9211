/** The one HTTP path of the SDK: openapi-fetch over the generated `paths`, auth, timeouts, ApiError. */
import createClient, { type Client as OpenApiClient } from "openapi-fetch";
import { ApiError } from "./errors.js";
import type { paths } from "./generated/schema.js";
import { VERSION } from "./version.js";

export const DEFAULT_BASE_URL = "http://127.0.0.1:8080";

export interface TransportOptions {
  /** `fsk_…` API key. */
  apiKey: string;
  /** Default `http://127.0.0.1:8080`. */
  baseUrl?: string | undefined;
  /** Per-request timeout (until the whole answer is read; for streams, until its headers). Default 30 s. */
  timeoutMs?: number | undefined;
  /** Custom fetch (tests, instrumentation). Default: the global fetch. */
  fetch?: ((input: Request) => Promise<Response>) | undefined;
  /** Extra headers on every request. */
  headers?: Record<string, string> | undefined;
}

export type ApiClient = OpenApiClient<paths>;

/** What openapi-fetch answers. */
interface FetchResult {
  data?: unknown;
  error?: unknown;
  response: Response;
}

export class Transport {
  readonly api: ApiClient;
  readonly timeoutMs: number;

  constructor(options: TransportOptions) {
    if (typeof options?.apiKey !== "string" || options.apiKey === "") {
      throw new TypeError("apiKey is required");
    }
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.api = createClient<paths>({
      baseUrl: options.baseUrl ?? DEFAULT_BASE_URL,
      ...(options.fetch ? { fetch: options.fetch } : {}),
      headers: {
        ...options.headers,
        authorization: `Bearer ${options.apiKey}`,
        "user-agent": `fastack-typescript/${VERSION}`,
      },
    });
  }

  /**
   * Runs one request with a deadline (and the caller's signal); throws
   * ApiError on a non-2xx answer. `keepSignal` leaves the deadline off once
   * the headers are in (streams).
   */
  async call<R extends FetchResult>(
    send: (signal: AbortSignal) => Promise<R>,
    signal?: AbortSignal,
    stream = false,
  ): Promise<R> {
    const deadline = withDeadline(this.timeoutMs, signal);
    try {
      const result = await send(deadline.signal);
      if (!result.response.ok) throw ApiError.from(result.response, result.error);
      return result;
    } finally {
      // A stream keeps the caller's signal but not the deadline.
      deadline.done(stream);
    }
  }
}

/**
 * An AbortSignal that fires after `ms` or when `outer` fires. `done()` clears
 * the timer (and, unless `keepOuter`, stops following `outer`).
 */
export function withDeadline(ms: number, outer?: AbortSignal): { signal: AbortSignal; done(keepOuter?: boolean): void } {
  const controller = new AbortController();
  const onAbort = () => controller.abort(outer?.reason);
  if (outer?.aborted) controller.abort(outer.reason);
  else outer?.addEventListener("abort", onAbort, { once: true });
  let timer: ReturnType<typeof setTimeout> | undefined;
  if (Number.isFinite(ms) && ms > 0) {
    timer = setTimeout(() => {
      controller.abort(new DOMException(`request timed out after ${ms} ms`, "TimeoutError"));
    }, ms);
    // An in-flight request holds the process open by its socket; this timer need not.
    timer.unref?.();
  }
  return {
    signal: controller.signal,
    done(keepOuter = false) {
      if (timer) clearTimeout(timer);
      if (!keepOuter) outer?.removeEventListener("abort", onAbort);
    },
  };
}
