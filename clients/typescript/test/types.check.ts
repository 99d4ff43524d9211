// Compiled (not run) by `npm run typecheck` against dist/*.d.ts: the README's
// examples and the public types as a TypeScript user sees them.
import { createServer } from "node:http";
import {
  ApiError,
  Client,
  Tracker,
  TrackerError,
  verifyAmqp,
  verifyWebhook,
  WebhookVerificationError,
  type Ack,
  type Contact,
  type Event,
  type FlushResult,
  type Job,
  type ProblemCode,
  type TrackerItem,
} from "fastack";

export async function readme(): Promise<void> {
  // Tracker
  const tracker = new Tracker({
    apiKey: process.env.FASTACK_API_KEY!,
    baseUrl: "http://127.0.0.1:8080",
    onError: (err) => console.error(err.kind, err.message, err.items.length),
  });
  const key: string = tracker.track({ event: "Signed Up", userId: "u-1", properties: { plan: "pro" } });
  tracker.identify({ userId: "u-1", anonymousId: "device-9", traits: { email: "ada@example.com" } });
  const done: boolean = await tracker.flush({ timeoutMs: 5_000 });
  const detailed: FlushResult = await tracker.flush({ detailed: true });
  const closed: FlushResult = await tracker.close();
  if (!closed.ok) console.warn(closed.pending, closed.failed, closed.spooled, closed.spoolFile, closed.timedOut, closed.error?.kind);
  void key;
  void done;
  void detailed;

  // Deadlines, a spool, and failures that reach the application.
  const spooling = new Tracker({
    apiKey: "fsk_…",
    flushTimeoutMs: 10_000,
    closeTimeoutMs: 10_000,
    spoolDir: "/var/spool/myapp/fastack",
    onError: (err) => {
      if (err.kind === "unauthorized" || err.kind === "forbidden") console.error("fastack refuses our key:", err.problem?.status);
    },
  });
  try {
    const result: FlushResult = await spooling.close({ throwOnError: true });
    void result;
  } catch (err) {
    if (err instanceof TrackerError) console.error(err.kind, err.problem?.code, err.result?.spooled);
  }

  // Client
  const client = new Client({ apiKey: "fsk_…" });
  const ack: Ack = await client.track({ event: "Paid", userId: "u-1", idempotencyKey: "order-42" });
  const acks: Ack[] = await client.batch([
    { type: "track", event: "Viewed", anonymousId: "device-9" },
    { type: "identify", userId: "u-1", traits: { plan: "pro" } },
  ]);
  void ack;
  void acks;
  for await (const e of client.events({ from: new Date(Date.now() - 86_400_000), to: new Date(), event: "Paid" })) {
    const ev: Event = e;
    const when: string = ev.occurred_at;
    void when;
  }
  const contact: Contact | null = await client.contacts.find({ userId: "u-1" });
  if (contact) await client.contacts.get(contact.id);
  const { job_id } = await client.exports.create({ from: "2026-11-01T00:00:00Z", to: "2026-12-01T00:00:00Z" });
  const job: Job = await client.jobs.wait(job_id, { timeoutMs: 120_000 });
  if (job.status === "completed") {
    for await (const line of client.jobs.resultLines(job_id)) void line;
    for await (const e of client.jobs.result(job_id)) void e.id;
  }
  const jobs: Job[] = await client.jobs.list({ status: "failed" });
  void jobs;
  // The typed openapi-fetch client underneath.
  const { data } = await client.raw.GET("/v1/core/jobs/{id}", { params: { path: { id: job_id } } });
  void data?.status;

  // Errors
  try {
    await client.track({ event: "", userId: "u-1" });
  } catch (err) {
    if (err instanceof ApiError) {
      const code: ProblemCode | "unknown" = err.code;
      for (const f of err.errors) console.log(f.field, f.index, f.code, f.message);
      void [err.status, err.detail, err.retryAfter, code];
    }
  }
  const onError = (err: TrackerError) => {
    const items: TrackerItem[] = err.items;
    if (err.kind === "rejected") console.log(err.problem?.code);
    void items;
  };
  void onError;
}

// Webhooks: verify the raw bytes.
createServer(async (req, res) => {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  try {
    const event = verifyWebhook<Event>(process.env.WEBHOOK_SECRET!, req.headers, Buffer.concat(chunks));
    console.log(req.headers["webhook-event"], event.id);
    res.writeHead(204).end();
  } catch (err) {
    res.writeHead(err instanceof WebhookVerificationError ? 401 : 400).end();
  }
});

export function amqp(msg: { content: Buffer; fields: { exchange: string; routingKey: string }; properties: { headers?: Record<string, unknown> } }): void {
  const body = verifyAmqp<Job>(
    process.env.FASTACK_AMQP_KEY!,
    msg.properties.headers ?? {},
    msg.content,
    msg.fields.exchange,
    msg.fields.routingKey,
  );
  void body.job_id;
}
