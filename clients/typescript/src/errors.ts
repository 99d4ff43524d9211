import type { Job, Problem, ProblemCode, ProblemField } from "./types.js";

/**
 * A non-2xx answer. `code` is the problem document's stable code (one of
 * `ProblemCode`), or `"unknown"` when the answer was not a problem document
 * (a proxy's HTML page, say). `errors` is always an array (empty when the
 * server named no field).
 */
export class ApiError extends Error {
  override readonly name = "ApiError";
  /** HTTP status. */
  readonly status: number;
  readonly code: ProblemCode | "unknown";
  readonly detail: string;
  readonly title: string | undefined;
  readonly type: string | undefined;
  /** One per offending field: `field` is a JSON pointer (`/batch/3/occurred_at`) or a query parameter name. */
  readonly errors: ProblemField[];
  /** `Retry-After` in seconds, when the server sent one (429). */
  readonly retryAfter: number | undefined;
  /** The problem document as received (undefined when the body was not one). */
  readonly problem: Problem | undefined;

  constructor(status: number, problem: Problem | undefined, init: { detail?: string; retryAfter?: number } = {}) {
    const detail = problem?.detail ?? init.detail ?? `HTTP ${status}`;
    const code = problem?.code ?? "unknown";
    super(`${status} ${code}: ${detail}`);
    this.status = status;
    this.code = code;
    this.detail = detail;
    this.title = problem?.title;
    this.type = problem?.type;
    this.errors = Array.isArray(problem?.errors) ? problem.errors : [];
    this.retryAfter = init.retryAfter;
    this.problem = problem;
  }

  /** Builds the error from an answer and its body (parsed JSON, text, or nothing). */
  static from(response: Response, body: unknown): ApiError {
    const retryAfterMs = parseRetryAfter(response.headers.get("retry-after"));
    const retryAfter = retryAfterMs === undefined ? undefined : retryAfterMs / 1000;
    if (isProblem(body)) return new ApiError(response.status, body, { retryAfter });
    const text = typeof body === "string" ? body.slice(0, 200) : undefined;
    return new ApiError(response.status, undefined, {
      detail: text || response.statusText || `HTTP ${response.status}`,
      retryAfter,
    });
  }
}

function isProblem(body: unknown): body is Problem {
  return (
    typeof body === "object" &&
    body !== null &&
    typeof (body as { code?: unknown }).code === "string" &&
    typeof (body as { status?: unknown }).status === "number"
  );
}

/** `Retry-After` (delay-seconds or an HTTP-date) in milliseconds, or undefined. */
export function parseRetryAfter(value: string | null, now = Date.now()): number | undefined {
  if (value === null) return undefined;
  const v = value.trim();
  if (/^\d+(\.\d+)?$/.test(v)) return Math.round(Number(v) * 1000);
  const at = Date.parse(v);
  if (Number.isFinite(at)) return Math.max(0, at - now);
  return undefined;
}

/** `jobs.wait()` ran out of time; `job` is the last state seen. */
export class TimeoutError extends Error {
  override readonly name = "TimeoutError";
  readonly job: Job | undefined;
  constructor(message: string, job?: Job) {
    super(message);
    this.job = job;
  }
}
