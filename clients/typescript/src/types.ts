/**
 * Public types. Everything the server answers is the generated wire type
 * (snake_case, exactly as in openapi/openapi.json); what you send is a small
 * camelCase input that the SDK maps onto the wire.
 */
import type { components } from "./generated/schema.js";

type Schemas = components["schemas"];

/** `202` answer to one event: its id, and whether the key was seen before. */
export type Ack = Schemas["Ack"];
/** A stored event (`GET /v1/core/events`, export lines, webhook bodies). */
export type Event = Schemas["EventOut"];
/** One page of `GET /v1/core/events`. */
export type EventsPage = Schemas["EventsPage"];
/** A contact: everything known to be one person. */
export type Contact = Schemas["ContactOut"];
/** A job document (`GET /v1/core/jobs/{id}`). */
export type Job = Schemas["JobOut"];
export type JobResult = Schemas["JobResult"];
export type JobState = Schemas["JobState"];
export type ExportRequest = Schemas["ExportRequest"];
export type ExportAccepted = Schemas["ExportAccepted"];
/** `POST /v1/core/erasures` answer: the erasure's job. */
export type ErasureAccepted = Schemas["ErasureAccepted"];
/** A completed erasure's result: what was removed store by store, verified and signed. */
export type ErasureCertificate = Schemas["ErasureCertificate"];
/** A suppressed identifier (by SHA-256). */
export type Suppression = Schemas["SuppressionOut"];
/** An identifier as kept after an erasure: its kind and SHA-256. */
export type Subject = Schemas["SubjectOut"];
/** RFC 9457 problem document. */
export type Problem = Schemas["Problem"];
export type ProblemCode = Schemas["ProblemCode"];
export type ProblemField = Schemas["ProblemField"];
export type EventType = Schemas["EventType"];
/** Wire bodies. */
export type TrackRequest = Schemas["TrackRequest"];
export type IdentifyRequest = Schemas["IdentifyRequest"];
export type BatchItem = Schemas["BatchItem"];

/** A `Date` (sent in the local offset) or an RFC 3339 string with an offset (sent as is). */
export type Timestamp = Date | string;

export interface TrackInput {
  /** Event name, 1–200 characters. */
  event: string;
  /** One of `userId` / `anonymousId` is required. */
  userId?: string;
  anonymousId?: string;
  properties?: Record<string, unknown>;
  /** Default: now, RFC 3339 with the local offset. */
  occurredAt?: Timestamp;
  /**
   * Default: a random UUID. Reuse the same key (with the same content) to
   * retry safely: the server answers the original id.
   */
  idempotencyKey?: string;
}

export interface IdentifyInput {
  userId?: string;
  anonymousId?: string;
  traits?: Record<string, unknown>;
  occurredAt?: Timestamp;
  idempotencyKey?: string;
}

export type BatchInput = ({ type: "track" } & TrackInput) | ({ type: "identify" } & IdentifyInput);
