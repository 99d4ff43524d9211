// events() pages through 2,500 events: each exactly once, in order.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, test } from "node:test";
import { Client } from "fastack";
import { startServer, waitFor } from "./helpers.js";

let server;
before(async () => {
  server = await startServer();
});
after(() => server?.dispose());

test("2,500 events: every page followed to the end, each event once, ordered by occurred_at then id", async (t) => {
  const client = new Client({ apiKey: server.apiKey, baseUrl: server.baseUrl });
  const run = randomUUID();
  const N = 2500;
  const base = Date.now() - 3_600_000;
  // Shuffled times, many shared by two events (ties are ordered by id).
  const order = Array.from({ length: N }, (_, i) => i).sort(() => Math.random() - 0.5);
  const ids = new Set();
  for (let i = 0; i < N; i += 500) {
    const acks = await client.batch(
      order.slice(i, i + 500).map((seq) => ({
        type: "track",
        event: "Paged",
        userId: `p-${seq % 50}`,
        properties: { run, seq },
        occurredAt: new Date(base + Math.floor(seq / 2) * 1000),
      })),
    );
    for (const a of acks) ids.add(a.id);
  }
  assert.equal(ids.size, N);

  // Only this test's events are in [from, to).
  const from = new Date(base - 1000);
  const to = new Date(base + N * 1000);
  await waitFor(
    async () => {
      let n = 0;
      for await (const _ of client.events({ from, to, pageSize: 1000 })) n++;
      return n === N;
    },
    { timeoutMs: 60_000, what: `${N} events readable` },
  );

  for (const pageSize of [1000, 100, undefined]) {
    const seen = [];
    let pages = 0;
    let cursor;
    do {
      const page = await client.eventsPage({ from, to, pageSize, cursor });
      pages++;
      seen.push(...page.events);
      cursor = page.next_cursor;
    } while (cursor);
    const expectedPages = Math.ceil(N / (pageSize ?? 100));
    assert.ok(pages === expectedPages || pages === expectedPages + 1, `pageSize ${pageSize}: ${pages} pages`);
    const viaIterator = [];
    for await (const e of client.events({ from, to, pageSize })) viaIterator.push(e);
    assert.deepEqual(viaIterator.map((e) => e.id), seen.map((e) => e.id));
    assert.equal(seen.length, N);
    assert.deepEqual(new Set(seen.map((e) => e.id)), ids);
    for (let i = 1; i < seen.length; i++) {
      const a = seen[i - 1];
      const b = seen[i];
      const ta = Date.parse(a.occurred_at);
      const tb = Date.parse(b.occurred_at);
      assert.ok(ta < tb || (ta === tb && a.id < b.id), `ordered at ${i}: ${a.occurred_at} ${a.id} / ${b.occurred_at} ${b.id}`);
    }
    t.diagnostic(`pageSize ${pageSize ?? "default"}: ${pages} pages`);
  }
  // The filters travel with every page.
  let named = 0;
  for await (const e of client.events({ from, to, event: "Paged", pageSize: 333 })) named += e.properties.run === run ? 1 : 0;
  assert.equal(named, N);
});
