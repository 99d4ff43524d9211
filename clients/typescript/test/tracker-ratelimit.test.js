// The tracker under a rate-limited key (429 + Retry-After) delivers every
// event exactly once.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, test } from "node:test";
import { Client, Tracker } from "fastack";
import { eventsOfRun, startServer, waitFor } from "./helpers.js";

let server;
before(async () => {
  server = await startServer();
});
after(() => server?.dispose());

test("a key limited to 2 req/s: every event delivered exactly once, Retry-After honoured", async () => {
  const { secret } = await server.admin("key", "create", "--tenant", "default", "--rate-limit", "2");
  const run = randomUUID();
  const N = 1000;
  const requests = []; // [time, status]
  const delivered = [];
  const errors = [];
  const tracker = new Tracker({
    apiKey: secret,
    baseUrl: server.baseUrl,
    maxBatch: 125, // 8 requests: the 2-token burst is gone after two
    flushIntervalMs: 20,
    onError: (e) => errors.push(e),
    onDelivered: (items, acks) => delivered.push(...items.map((item, i) => ({ item, ack: acks[i] }))),
    fetch: async (req) => {
      const res = await fetch(req);
      requests.push([Date.now(), res.status]);
      return res;
    },
  });
  const keys = [];
  for (let seq = 0; seq < N; seq++) {
    keys.push(tracker.track({ event: "Limited", userId: `u-${seq % 7}`, properties: { run, seq } }));
  }
  assert.equal(new Set(keys).size, N, "track() answers a fresh key per event");
  assert.equal(await tracker.flush({ timeoutMs: 60_000 }), true);
  await tracker.close();

  assert.deepEqual(errors, []);
  const stats = tracker.stats;
  assert.equal(stats.delivered, N);
  assert.ok(stats.rateLimited > 0, `some requests were answered 429 (${JSON.stringify(stats)})`);
  assert.equal(stats.requests, 8 + stats.rateLimited);
  // Retry-After: 1 → the next request waits at least that second.
  for (let i = 0; i < requests.length - 1; i++) {
    if (requests[i][1] === 429) assert.ok(requests[i + 1][0] - requests[i][0] >= 990, "Retry-After honoured");
  }
  assert.deepEqual(
    delivered.map((d) => d.item.idempotencyKey),
    keys,
    "delivered in order, each once",
  );

  // Through the API: N events, each seq once, their ids exactly the acked ids.
  const client = new Client({ apiKey: server.apiKey, baseUrl: server.baseUrl });
  const events = await waitFor(async () => {
    const evs = await eventsOfRun(client, run);
    return evs.length >= N && evs;
  }, { timeoutMs: 60_000, what: `${N} events` });
  assert.equal(events.length, N);
  assert.deepEqual(
    events.map((e) => e.properties.seq).sort((a, b) => a - b),
    Array.from({ length: N }, (_, i) => i),
  );
  assert.deepEqual(new Set(events.map((e) => e.id)), new Set(delivered.map((d) => d.ack.id)));

  // The same items again: the server has every key, with the same content.
  const again = [];
  for (let i = 0; i < N; i += 500) {
    const chunk = delivered.slice(i, i + 500).map(({ item }) => ({ type: item.type, ...item.input }));
    again.push(...(await client.batch(chunk)));
  }
  assert.ok(again.every((a) => a.duplicate));
  assert.deepEqual(
    again.map((a) => a.id),
    delivered.map((d) => d.ack.id),
  );
});
