// The tracker while the server is SIGKILLed mid-flush and restarted on the
// same data dir and port: every event delivered exactly once.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, test } from "node:test";
import { Client, Tracker } from "fastack";
import { Server, eventsOfRun, freePort, sleep, waitFor } from "./helpers.js";

let server;
after(() => server?.dispose());

test("SIGKILL mid-flush, restart on the same port: every event exactly once", async (t) => {
  // A short processing lease: the killed node's lease on the tenant expires soon after the restart.
  server = await new Server({ port: await freePort(), env: { FASTACK_LEASE_TTL_MS: "2000" } }).start();
  const port = server.port;
  const run = randomUUID();
  const t0 = Date.now();
  const N = 3000;
  const delivered = [];
  const errors = [];
  let requests = 0;
  let killed;
  const tracker = new Tracker({
    apiKey: server.apiKey,
    baseUrl: server.baseUrl,
    maxBatch: 100,
    flushIntervalMs: 10,
    retryBaseMs: 100,
    retryMaxMs: 800,
    maxRetries: 100,
    requestTimeoutMs: 5_000,
    onError: (e) => errors.push(e),
    onDelivered: (items, acks) => delivered.push(...items.map((item, i) => ({ item, ack: acks[i] }))),
    fetch: (req) => {
      requests++;
      const res = fetch(req);
      // Kill the server while the 8th request is on its way: it may or may not
      // have been committed; either way the resend must not double anything.
      if (requests === 8) killed = sleep(Math.random() * 40).then(() => server.kill());
      return res;
    },
  });
  for (let seq = 0; seq < N; seq++) tracker.track({ event: "Crash", userId: `u-${seq % 13}`, properties: { run, seq } });

  await waitFor(() => killed !== undefined, { what: "the kill" });
  await killed;
  const deliveredAtKill = tracker.stats.delivered;
  assert.ok(deliveredAtKill < N, "killed mid-flush");
  await sleep(1_000); // down for a second: connections refused, the tracker backs off
  await server.start();
  assert.equal(server.port, port);

  assert.equal(await tracker.flush({ timeoutMs: 90_000 }), true);
  await tracker.close();
  assert.deepEqual(errors.map((e) => e.message), []);
  const stats = tracker.stats;
  t.diagnostic(`delivered ${deliveredAtKill} before the kill; then ${JSON.stringify(stats)} in ${Date.now() - t0} ms`);
  assert.equal(stats.delivered, N);
  assert.ok(stats.retries > 0, `the tracker retried (${JSON.stringify(stats)})`);

  const client = new Client({ apiKey: server.apiKey, baseUrl: server.baseUrl });
  const t1 = Date.now();
  const events = await waitFor(async () => {
    const evs = await eventsOfRun(client, run);
    return evs.length >= N && evs;
  }, { timeoutMs: 90_000, what: `${N} events after the restart` });
  t.diagnostic(`all ${N} readable ${Date.now() - t1} ms later`);
  await sleep(500); // anything doubled would show up by now
  const final = await eventsOfRun(client, run);
  assert.equal(final.length, N, "no event doubled");
  assert.equal(events.length, N);
  assert.deepEqual(
    final.map((e) => e.properties.seq).sort((a, b) => a - b),
    Array.from({ length: N }, (_, i) => i),
  );
  const ackIds = delivered.map((d) => d.ack.id);
  assert.equal(new Set(ackIds).size, N);
  assert.deepEqual(new Set(final.map((e) => e.id)), new Set(ackIds));
});
