/** Timestamps as the API wants them: RFC 3339 with an explicit offset. */

const pad = (n: number, width = 2): string => String(n).padStart(width, "0");

/**
 * `date` (default: now) as RFC 3339 in the machine's local offset, with
 * milliseconds: `2026-11-30T09:15:00.123+01:00`. The server keeps the
 * offset it is given and returns it as sent.
 */
export function rfc3339Local(date: Date = new Date()): string {
  const ms = date.getTime();
  if (!Number.isFinite(ms)) throw new RangeError("invalid Date");
  const offsetMin = -date.getTimezoneOffset();
  const sign = offsetMin >= 0 ? "+" : "-";
  const abs = Math.abs(offsetMin);
  return (
    `${pad(date.getFullYear(), 4)}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}` +
    `T${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}` +
    `.${pad(date.getMilliseconds(), 3)}${sign}${pad(Math.floor(abs / 60))}:${pad(abs % 60)}`
  );
}

/** An `occurred_at` value: a Date in the local offset, a string as given. */
export function toOccurredAt(value: Date | string | undefined): string {
  if (value === undefined) return rfc3339Local();
  if (value instanceof Date) return rfc3339Local(value);
  if (typeof value === "string") return value;
  throw new TypeError("occurredAt must be a Date or an RFC 3339 string");
}

/** A query bound (`from`, `to`): a Date as UTC (`…Z`), a string as given. */
export function toInstant(value: Date | string, name: string): string {
  if (value instanceof Date) {
    if (!Number.isFinite(value.getTime())) throw new RangeError(`${name} is an invalid Date`);
    return value.toISOString();
  }
  if (typeof value === "string") return value;
  throw new TypeError(`${name} must be a Date or an RFC 3339 string`);
}
