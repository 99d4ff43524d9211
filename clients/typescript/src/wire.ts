/** camelCase inputs → wire bodies (snake_case), keys and timestamps filled in. */
import { randomUUID } from "node:crypto";
import { toOccurredAt } from "./time.js";
import type { BatchInput, BatchItem, IdentifyInput, IdentifyRequest, TrackInput, TrackRequest } from "./types.js";

/** The input with its idempotency key and `occurredAt` decided (as the tracker reports it back). */
export type Resolved<T extends TrackInput | IdentifyInput> = T & { occurredAt: string; idempotencyKey: string };

export function resolve<T extends TrackInput | IdentifyInput>(input: T): Resolved<T> {
  if (typeof input !== "object" || input === null) throw new TypeError("expected an object");
  return {
    ...input,
    occurredAt: toOccurredAt(input.occurredAt),
    idempotencyKey: input.idempotencyKey ?? randomUUID(),
  };
}

// Only the fields that are set: the server refuses `null` and unknown fields.
function set<T extends object, K extends string>(obj: T, key: K, value: unknown): void {
  if (value !== undefined) (obj as Record<string, unknown>)[key] = value;
}

export function trackBody(input: Resolved<TrackInput>): TrackRequest {
  const body = { event: input.event } as TrackRequest;
  set(body, "user_id", input.userId);
  set(body, "anonymous_id", input.anonymousId);
  set(body, "properties", input.properties);
  body.occurred_at = input.occurredAt;
  body.idempotency_key = input.idempotencyKey;
  return body;
}

export function identifyBody(input: Resolved<IdentifyInput>): IdentifyRequest {
  const body = {} as IdentifyRequest;
  set(body, "user_id", input.userId);
  set(body, "anonymous_id", input.anonymousId);
  set(body, "traits", input.traits);
  body.occurred_at = input.occurredAt;
  body.idempotency_key = input.idempotencyKey;
  return body;
}

export function batchItem(type: "track", input: Resolved<TrackInput>): BatchItem;
export function batchItem(type: "identify", input: Resolved<IdentifyInput>): BatchItem;
export function batchItem(type: "track" | "identify", input: Resolved<TrackInput> | Resolved<IdentifyInput>): BatchItem {
  return type === "track"
    ? { type, ...trackBody(input as Resolved<TrackInput>) }
    : { type, ...identifyBody(input as Resolved<IdentifyInput>) };
}

export function batchItemOf(item: BatchInput): BatchItem {
  if (item.type === "track") {
    const { type: _t, ...rest } = item;
    return batchItem("track", resolve(rest));
  }
  if (item.type === "identify") {
    const { type: _t, ...rest } = item;
    return batchItem("identify", resolve(rest));
  }
  throw new TypeError(`batch item type must be "track" or "identify"`);
}
