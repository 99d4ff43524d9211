// Client against the real server: track/identify/batch round trip, duplicates,
// contacts, exports and their NDJSON stream, and errors as ApiError.
import assert from "node:assert/strict";
import { createHash, createHmac, randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { ApiError, Client } from "fastack";
import { eventsOfRun, startServer, waitFor, window } from "./helpers.js";

let server;
let client;
before(async () => {
  server = await startServer();
  client = new Client({ apiKey: server.apiKey, baseUrl: server.baseUrl });
});
after(() => server?.dispose());

describe("round trip", () => {
  test("track, identify and batch are readable through events(); a duplicate answers the same id", async () => {
    const run = randomUUID();
    const user = `u-${run}`;
    const anon = `a-${run}`;
    const t = await client.track({ event: "Signed Up", userId: user, properties: { run, plan: "pro" } });
    assert.equal(t.duplicate, false);
    assert.match(t.id, /^[0-9a-f-]{36}$/);

    // A resend must repeat the content, occurred_at included: give both explicitly.
    const key = `id-${run}`;
    const at = new Date().toISOString();
    const identify = { userId: user, anonymousId: anon, traits: { run, name: "Ada" }, occurredAt: at, idempotencyKey: key };
    const i = await client.identify(identify);
    assert.equal(i.duplicate, false);

    const occurredAt = new Date(Date.now() - 60_000);
    const items = [
      { type: "track", event: "Viewed", anonymousId: anon, properties: { run, n: 1 }, occurredAt },
      { type: "track", event: "Viewed", userId: user, properties: { run, n: 2 }, occurredAt: at, idempotencyKey: `b2-${run}` },
      { type: "identify", userId: user, traits: { run, plan: "pro" } },
    ];
    const acks = await client.batch(items);
    assert.equal(acks.length, 3);
    assert.ok(acks.every((a) => a.duplicate === false));

    // Same key, same content: the original id, duplicate = true.
    const again = await client.identify(identify);
    assert.deepEqual(again, { id: i.id, duplicate: true });
    const batchAgain = await client.batch([items[1]]);
    assert.deepEqual(batchAgain, [{ id: acks[1].id, duplicate: true }]);

    const events = await waitFor(
      async () => {
        const evs = await eventsOfRun(client, run);
        return evs.length >= 5 && evs;
      },
      { what: "5 events" },
    );
    assert.equal(events.length, 5);
    const ids = new Set(events.map((e) => e.id));
    for (const id of [t.id, i.id, ...acks.map((a) => a.id)]) assert.ok(ids.has(id), `event ${id} is listed`);
    const tracked = events.find((e) => e.id === t.id);
    assert.equal(tracked.type, "track");
    assert.equal(tracked.event, "Signed Up");
    assert.equal(tracked.user_id, user);
    assert.deepEqual(tracked.properties, { run, plan: "pro" });
    // occurred_at defaults to now with the local offset (the server writes +00:00 as Z and
    // leaves out a fraction that is zero, one time in a thousand when the SDK sends milliseconds).
    assert.match(tracked.occurred_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,3})?(Z|[+-]\d\d:\d\d)$/);
    const viewed = events.find((e) => e.id === acks[0].id);
    assert.equal(Date.parse(viewed.occurred_at), occurredAt.getTime());

    // Filters: by event name and by contact.
    const onlyViewed = await eventsOfRun(client, run, { event: "Viewed" });
    assert.equal(onlyViewed.length, 2);

    const contact = await client.contacts.find({ userId: user });
    assert.ok(contact);
    assert.ok(contact.user_ids.includes(user));
    assert.ok(contact.anonymous_ids.includes(anon));
    assert.equal(contact.traits.name, "Ada");
    assert.deepEqual((await client.contacts.get(contact.id)).id, contact.id);
    assert.deepEqual((await client.contacts.find({ anonymousId: anon }))?.id, contact.id);
    assert.equal(await client.contacts.find({ userId: `nobody-${run}` }), null);
    const byContact = await eventsOfRun(client, run, { contactId: contact.id });
    assert.equal(byContact.length, 5);
    // The same person by either identifier.
    assert.equal((await eventsOfRun(client, run, { userId: user })).length, 5);
    assert.equal((await eventsOfRun(client, run, { anonymousId: anon })).length, 5);
  });

  test("export: create, wait(), stream the NDJSON; its bytes match result.hmac", async () => {
    const run = randomUUID();
    await client.batch(
      Array.from({ length: 20 }, (_, n) => ({ type: "track", event: "Exported", userId: `x-${run}`, properties: { run, n } })),
    );
    const { from, to } = window();
    await waitFor(async () => (await eventsOfRun(client, run)).length === 20, { what: "20 events" });
    const { job_id } = await client.exports.create({ from, to, event: "Exported", metadata: { source: "sdk-test", run } });
    const job = await client.jobs.wait(job_id, { timeoutMs: 30_000 });
    assert.equal(job.status, "completed", JSON.stringify(job));
    assert.equal(job.kind, "export");
    assert.deepEqual(job.metadata, { source: "sdk-test", run });

    const lines = [];
    for await (const line of client.jobs.resultLines(job_id)) lines.push(line);
    const events = [];
    for await (const e of client.jobs.result(job_id)) events.push(e);
    assert.equal(lines.length, job.result.row_count);
    assert.deepEqual(events.map((e) => JSON.stringify(e)), lines);
    assert.equal(events.filter((e) => e.properties?.run === run).length, 20);

    // The raw bytes hash to result.hmac with the tenant's export key.
    const key = Buffer.from((await server.cli("keys", "external-hmac", "--tenant", "default")).trim(), "hex");
    const chunks = [];
    for await (const c of await client.jobs.resultStream(job_id)) chunks.push(c);
    const bytes = Buffer.concat(chunks);
    assert.equal(bytes.length, job.result.size_bytes);
    assert.equal(createHmac("sha256", key).update(bytes).digest("hex"), job.result.hmac);

    const listed = await client.jobs.list({ status: "completed", limit: 10 });
    assert.ok(listed.some((j) => j.job_id === job_id));
  });
});

describe("errors", () => {
  test("409 idempotency_key_conflict surfaces as ApiError with code and field", async () => {
    const key = `conflict-${randomUUID()}`;
    await client.track({ event: "A", userId: "u", idempotencyKey: key, properties: { v: 1 } });
    const err = await client.track({ event: "A", userId: "u", idempotencyKey: key, properties: { v: 2 } }).catch((e) => e);
    assert.ok(err instanceof ApiError, String(err));
    assert.equal(err.status, 409);
    assert.equal(err.code, "idempotency_key_conflict");
    assert.equal(err.errors[0].field, "/idempotency_key");
    assert.equal(typeof err.detail, "string");
  });

  test("422 invalid_payload names each field (and the batch item index)", async () => {
    const err = await client.track({ event: "A", userId: "u", occurredAt: "2026-11-30T09:15:00" }).catch((e) => e);
    assert.ok(err instanceof ApiError);
    assert.equal(err.status, 422);
    assert.equal(err.code, "invalid_payload");
    assert.deepEqual(
      err.errors.map((e) => [e.field, e.code]),
      [["/occurred_at", "invalid_timestamp"]],
    );

    const noId = await client.identify({ traits: {} }).catch((e) => e);
    assert.equal(noId.status, 422);
    assert.ok(noId.errors.some((e) => e.field === "/user_id" && e.code === "required"));

    const batch = await client
      .batch([
        { type: "track", event: "ok", userId: "u" },
        { type: "track", event: "bad", userId: "u", occurredAt: new Date(Date.now() + 3 * 86_400_000) },
      ])
      .catch((e) => e);
    assert.equal(batch.status, 422);
    assert.equal(batch.code, "occurred_at_in_future");
    assert.equal(batch.errors[0].index, 1);
    assert.equal(batch.errors[0].field, "/batch/1/occurred_at");
  });

  test("413 payload_too_large and 400 batch_too_large", async () => {
    const big = await client.track({ event: "Big", userId: "u", properties: { blob: "x".repeat(40 * 1024) } }).catch((e) => e);
    assert.ok(big instanceof ApiError);
    assert.equal(big.status, 413);
    assert.equal(big.code, "payload_too_large");

    const many = Array.from({ length: 501 }, () => ({ type: "track", event: "Many", userId: "u" }));
    const tooMany = await client.batch(many).catch((e) => e);
    assert.equal(tooMany.status, 400);
    assert.equal(tooMany.code, "batch_too_large");
  });

  test("400 invalid_query, 404 not_found and 401 unauthorized", async () => {
    const q = await client.eventsPage({ from: "yesterday", to: new Date() }).catch((e) => e);
    assert.equal(q.status, 400);
    assert.equal(q.code, "invalid_query");
    assert.equal(q.errors[0].field, "from");

    const nf = await client.contacts.get(randomUUID()).catch((e) => e);
    assert.equal(nf.status, 404);
    assert.equal(nf.code, "not_found");

    const job = await client.jobs.get(randomUUID()).catch((e) => e);
    assert.equal(job.code, "not_found");

    const anon = new Client({ apiKey: "fsk_not_a_key", baseUrl: server.baseUrl });
    const un = await anon.track({ event: "A", userId: "u" }).catch((e) => e);
    assert.ok(un instanceof ApiError);
    assert.equal(un.status, 401);
    assert.equal(un.code, "unauthorized");
  });
});

/** JSON with keys sorted and no whitespace: what a certificate's HMAC covers. */
function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

describe("privacy", () => {
  test("erasures.create: the person is gone, the certificate verifies; the suppression is listed and lifted", async () => {
    const run = randomUUID();
    const user = `gone-${run}`;
    await client.batch([
      { type: "track", event: "Gone", userId: user, properties: { run } },
      { type: "track", event: "Stays", userId: `stay-${run}`, properties: { run } },
    ]);
    await waitFor(async () => (await eventsOfRun(client, run)).length === 2, { what: "2 events" });
    const { job_id } = await client.erasures.create({ userIds: [user], suppress: true, metadata: { ticket: run } });
    const job = await client.jobs.wait(job_id, { timeoutMs: 30_000 });
    assert.equal(job.status, "completed", JSON.stringify(job));
    assert.equal(job.kind, "erasure");
    assert.equal(job.result.stores.tracked_events.events_removed, 1);
    assert.equal(job.result.verification.found, 0);
    const { hmac, integrity, ...signed } = job.result;
    assert.equal(integrity.signature, hmac);
    const key = Buffer.from((await server.cli("keys", "external-hmac", "--tenant", "default")).trim(), "hex");
    assert.equal(createHmac("sha256", key).update(canonical(signed)).digest("hex"), hmac);
    const left = await eventsOfRun(client, run);
    assert.deepEqual(left.map((e) => e.event), ["Stays"]);

    const sha = createHash("sha256").update(user).digest("hex");
    const [suppressed] = await client.suppressions.list({ userId: user });
    assert.equal(suppressed.sha256, sha);
    assert.equal(suppressed.request_id, job_id);
    const lifted = await client.suppressions.lift({ userId: user });
    assert.deepEqual(lifted, { kind: "user_id", sha256: sha });
    await assert.rejects(client.suppressions.lift({ userId: user }), (e) => e instanceof ApiError && e.status === 404);
    await assert.rejects(client.erasures.create({}), (e) => e instanceof ApiError && e.code === "invalid_payload");
  });
});
