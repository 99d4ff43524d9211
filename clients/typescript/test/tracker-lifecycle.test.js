// Tracker behaviour against the real server: close() flushes, the process is
// never held open by an idle tracker, oversized / refused items are reported
// without failing their batch, a bounded queue, 5xx and lost answers retried
// with the same keys.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { Client, Tracker, TrackerError } from "fastack";
import { eventsOfRun, freePort, runFixture, startProxy, startServer, waitFor } from "./helpers.js";

let server;
let client;
before(async () => {
  server = await startServer();
  client = new Client({ apiKey: server.apiKey, baseUrl: server.baseUrl });
});
after(() => server?.dispose());

function collect(extra = {}) {
  const errors = [];
  const delivered = [];
  const tracker = new Tracker({
    apiKey: server.apiKey,
    baseUrl: server.baseUrl,
    flushIntervalMs: 60_000, // only flush()/close() send, unless said otherwise
    onError: (e) => errors.push(e),
    onDelivered: (items, acks) => delivered.push(...items.map((item, i) => ({ item, ack: acks[i] }))),
    ...extra,
  });
  return { tracker, errors, delivered };
}

const readable = (run, n) =>
  waitFor(async () => {
    const evs = await eventsOfRun(client, run);
    return evs.length >= n && evs;
  }, { what: `${n} events` });

describe("lifecycle", () => {
  test("close() flushes what is queued; track() after close() is reported, not sent", async () => {
    const { tracker, errors } = collect();
    const run = randomUUID();
    for (let seq = 0; seq < 25; seq++) tracker.track({ event: "Closed", anonymousId: "a-1", properties: { run, seq } });
    const key = tracker.identify({ userId: "u-close", anonymousId: "a-1", traits: { run } });
    assert.equal(typeof key, "string");
    assert.equal(tracker.stats.queued, 26);
    await tracker.close();
    assert.equal(tracker.stats.delivered, 26);
    assert.equal(tracker.stats.requests, 1);
    assert.equal((await readable(run, 26)).length, 26);

    const late = tracker.track({ event: "Late", userId: "u" });
    await Promise.resolve();
    assert.equal(errors.length, 1);
    assert.equal(errors[0].kind, "closed");
    assert.equal(errors[0].items[0].idempotencyKey, late);
    await tracker.close(); // idempotent
  });

  test("the flush interval sends a partial batch by itself", async () => {
    const { tracker } = collect({ flushIntervalMs: 50 });
    const run = randomUUID();
    tracker.track({ event: "Timed", userId: "u", properties: { run } });
    await waitFor(() => tracker.stats.delivered === 1, { timeoutMs: 5_000, what: "the timed flush" });
    await tracker.close();
  });

  test("an idle tracker does not keep the process alive", async () => {
    const r = await runFixture("idle.mjs", { BASE_URL: server.baseUrl });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /started/);
    assert.ok(r.ms < 5_000, `exited after ${r.ms} ms`);
  });

  test("a script that only calls track() and ends: delivered on beforeExit, then the process ends", async () => {
    const run = randomUUID();
    const r = await runFixture("track-and-exit.mjs", { BASE_URL: server.baseUrl, API_KEY: server.apiKey, RUN: run });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /"delivered":10/);
    assert.ok(r.ms < 10_000, `exited after ${r.ms} ms`);
    assert.equal((await readable(run, 10)).length, 10);
  });

  test("after flush() the process ends at once (no timer or socket of the tracker holds it)", async () => {
    const run = randomUUID();
    const r = await runFixture("flush-then-idle.mjs", { BASE_URL: server.baseUrl, API_KEY: server.apiKey, RUN: run });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /\{"flushed":true,"delivered":1\}/);
    assert.ok(r.ms < 5_000, `exited after ${r.ms} ms`);
  });

  test("server unreachable: a script that ends gives up after exitTimeoutMs and reports the items", async () => {
    const port = await freePort(); // nobody listens there
    const r = await runFixture("track-and-exit.mjs", {
      BASE_URL: `http://127.0.0.1:${port}`,
      API_KEY: "fsk_x",
      RUN: "none",
      EXIT_TIMEOUT_MS: "1000",
    });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /\{"kind":"undelivered","items":10\}/);
    assert.ok(r.ms < 8_000, `exited after ${r.ms} ms`);
  });

  test("flush({ timeoutMs }) answers false when it cannot finish; close({ timeoutMs }) reports the rest", async () => {
    const port = await freePort();
    const errors = [];
    const tracker = new Tracker({ apiKey: "fsk_x", baseUrl: `http://127.0.0.1:${port}`, onError: (e) => errors.push(e), retryBaseMs: 50 });
    tracker.track({ event: "Nowhere", userId: "u" });
    assert.equal(await tracker.flush({ timeoutMs: 300 }), false);
    assert.equal(tracker.stats.inFlight + tracker.stats.queued, 1);
    await tracker.close({ timeoutMs: 300 });
    assert.deepEqual(errors.map((e) => [e.kind, e.items.length]), [["undelivered", 1]]);
    assert.ok(tracker.stats.retries > 0);
  });
});

describe("items the server cannot take", () => {
  test("an item over 32 KiB is reported; the rest of its batch is delivered", async () => {
    const { tracker, errors } = collect();
    const run = randomUUID();
    for (let seq = 0; seq < 5; seq++) tracker.track({ event: "Sized", userId: "u", properties: { run, seq } });
    const big = tracker.track({ event: "Sized", userId: "u", properties: { run, blob: "x".repeat(40 * 1024) } });
    await tracker.close();
    assert.deepEqual(errors.map((e) => [e.kind, e.items[0].idempotencyKey]), [["too_large", big]]);
    assert.equal(tracker.stats.delivered, 5);
    assert.equal((await readable(run, 5)).length, 5);
  });

  test("refused items (422 / 409 naming their index) are reported alone; the others are delivered", async () => {
    const run = randomUUID();
    const taken = `taken-${run}`;
    await client.track({ event: "First", userId: "u", idempotencyKey: taken, properties: { run, first: true } });
    const { tracker, errors, delivered } = collect();
    const good = [];
    good.push(tracker.track({ event: "Good", userId: "u", properties: { run, n: 1 } }));
    const future = tracker.track({ event: "Bad", userId: "u", occurredAt: new Date(Date.now() + 3 * 86_400_000), properties: { run } });
    good.push(tracker.track({ event: "Good", userId: "u", properties: { run, n: 2 } }));
    const conflict = tracker.track({ event: "Other", userId: "u", idempotencyKey: taken, properties: { run } });
    good.push(tracker.identify({ userId: "u", traits: { run } }));
    await tracker.close();

    const rejected = errors.flatMap((e) => e.items.map((i) => [e.kind, e.problem?.code, i.idempotencyKey]));
    assert.deepEqual(rejected.sort(), [
      ["rejected", "idempotency_key_conflict", conflict],
      ["rejected", "occurred_at_in_future", future],
    ].sort());
    assert.ok(errors.every((e) => e instanceof TrackerError && e.problem.status >= 400));
    assert.deepEqual(delivered.map((d) => d.item.idempotencyKey), good);
    assert.equal((await readable(run, 4)).length, 4); // "First" + 3 good
  });

  test("a refusal that names no item: the batch is halved until the culprit is alone", async () => {
    const { tracker, errors, delivered } = collect();
    const run = randomUUID();
    let deep = {};
    for (let i = 0; i < 200; i++) deep = { deep }; // nesting the server refuses
    const keys = [];
    for (let seq = 0; seq < 7; seq++) keys.push(tracker.track({ event: "Halved", userId: "u", properties: { run, seq } }));
    const bad = tracker.track({ event: "Halved", userId: "u", properties: { run, deep } });
    await tracker.close();
    assert.deepEqual(errors.map((e) => [e.kind, e.items.map((i) => i.idempotencyKey)]), [["rejected", [bad]]]);
    assert.ok([400, 422].includes(errors[0].problem.status));
    assert.deepEqual(delivered.map((d) => d.item.idempotencyKey).sort(), keys.sort());
    assert.equal((await readable(run, 7)).length, 7);
  });

  test("invalid input is reported at once and never sent; track() still answers a key", async () => {
    const { tracker, errors } = collect();
    const k1 = tracker.track({ event: "NoId" });
    const k2 = tracker.track({ event: "", userId: "u" });
    const cyclic = {};
    cyclic.self = cyclic;
    const k3 = tracker.track({ event: "Cycle", userId: "u", properties: cyclic });
    const k4 = tracker.identify({ traits: {} });
    await tracker.close();
    assert.deepEqual(errors.map((e) => [e.kind, e.items[0].idempotencyKey]), [
      ["invalid", k1],
      ["invalid", k2],
      ["invalid", k3],
      ["invalid", k4],
    ]);
    assert.equal(tracker.stats.requests, 0);
  });

  test("a bounded queue: beyond maxQueueSize items are dropped, counted and reported (track() never throws)", async () => {
    const { tracker, errors } = collect({ maxQueueSize: 5 });
    const keys = [];
    for (let seq = 0; seq < 8; seq++) keys.push(tracker.track({ event: "Bounded", userId: "u", properties: { seq } }));
    await Promise.resolve();
    assert.equal(errors.length, 1, "drops of one tick are reported together");
    assert.equal(errors[0].kind, "dropped");
    assert.deepEqual(errors[0].items.map((i) => i.idempotencyKey), keys.slice(5));
    assert.equal(tracker.stats.dropped, 3);
    await tracker.close();
    assert.equal(tracker.stats.delivered, 5);
  });

  test("401: not retried, every item reported with the problem (kind unauthorized)", async () => {
    const errors = [];
    const tracker = new Tracker({ apiKey: "fsk_wrong", baseUrl: server.baseUrl, onError: (e) => errors.push(e) });
    tracker.track({ event: "A", userId: "u" });
    tracker.track({ event: "B", userId: "u" });
    const result = await tracker.close();
    assert.equal(result.ok, false);
    assert.equal(tracker.stats.requests, 1);
    assert.deepEqual(errors.map((e) => [e.kind, e.problem.code, e.items.length]), [["unauthorized", "unauthorized", 2]]);
  });
});

describe("retries keep the keys", () => {
  test("5xx answers are retried with backoff; nothing is doubled", async () => {
    const problem = JSON.stringify({ type: "urn:fastack:problem:unavailable", title: "Service Unavailable", status: 503, detail: "try again", code: "unavailable" });
    const proxy = await startProxy(server.baseUrl, (n) =>
      n <= 2 ? { status: 503, headers: { "content-type": "application/problem+json" }, body: problem } : "forward",
    );
    try {
      const { tracker, errors, delivered } = collect({ baseUrl: proxy.url, retryBaseMs: 50 });
      const run = randomUUID();
      for (let seq = 0; seq < 10; seq++) tracker.track({ event: "Retried", userId: "u", properties: { run, seq } });
      await tracker.close();
      assert.deepEqual(errors, []);
      assert.equal(tracker.stats.retries, 2);
      assert.equal(delivered.length, 10);
      assert.equal((await readable(run, 10)).length, 10);
    } finally {
      await proxy.close();
    }
  });

  test("a server that keeps failing: after maxRetries the items are reported (retries_exhausted), not dropped silently", async () => {
    const problem = JSON.stringify({ type: "urn:fastack:problem:internal", title: "Internal Server Error", status: 500, detail: "boom", code: "internal" });
    const proxy = await startProxy(server.baseUrl, () => ({ status: 500, headers: { "content-type": "application/problem+json" }, body: problem }));
    try {
      const { tracker, errors } = collect({ baseUrl: proxy.url, retryBaseMs: 20, maxRetries: 3 });
      const keys = [tracker.track({ event: "Doomed", userId: "u" }), tracker.track({ event: "Doomed", userId: "u" })];
      await tracker.close();
      assert.equal(proxy.requests, 4);
      assert.deepEqual(errors.map((e) => [e.kind, e.problem?.code, e.items.map((i) => i.idempotencyKey)]), [
        ["retries_exhausted", "internal", keys],
      ]);
    } finally {
      await proxy.close();
    }
  });

  test("an answer lost after the server stored the batch: the resend answers the same ids (duplicate)", async () => {
    const proxy = await startProxy(server.baseUrl, (n) => (n === 1 ? "lose-answer" : "forward"));
    try {
      const { tracker, errors, delivered } = collect({ baseUrl: proxy.url, retryBaseMs: 50 });
      const run = randomUUID();
      for (let seq = 0; seq < 10; seq++) tracker.track({ event: "Lost", userId: "u", properties: { run, seq } });
      await tracker.close();
      assert.deepEqual(errors, []);
      assert.equal(proxy.requests, 2);
      assert.equal(tracker.stats.retries, 1);
      assert.ok(delivered.every((d) => d.ack.duplicate), "the resend found every key stored");
      const events = await readable(run, 10);
      await new Promise((r) => setTimeout(r, 300));
      assert.equal((await eventsOfRun(client, run)).length, 10);
      assert.deepEqual(new Set(events.map((e) => e.id)), new Set(delivered.map((d) => d.ack.id)));
    } finally {
      await proxy.close();
    }
  });
});

test("items adding up to more than 4 MiB go out in several requests, each at most 4 MiB", async () => {
  const sizes = [];
  const { tracker, errors } = collect({
    compression: "none", // the limit is on the JSON's bytes; compressed it would be one request
    fetch: async (req) => {
      sizes.push((await req.clone().arrayBuffer()).byteLength);
      return fetch(req);
    },
  });
  const run = randomUUID();
  const blob = "y".repeat(30 * 1024);
  for (let seq = 0; seq < 200; seq++) tracker.track({ event: "Heavy", userId: "u", properties: { run, seq, blob } });
  await tracker.close();
  assert.deepEqual(errors, []);
  assert.equal(tracker.stats.delivered, 200);
  assert.ok(sizes.length >= 2, `${sizes.length} requests`);
  assert.ok(sizes.every((n) => n <= 4 * 1024 * 1024), `sizes ${sizes}`);
  assert.ok(sizes[0] > 3.9 * 1024 * 1024, "the first request is filled up to the limit");
  assert.equal((await readable(run, 200)).length, 200);
});

describe("compressed batches", () => {
  const seen = (proxyLog) => (n, req) => {
    proxyLog.push({ n, encoding: req.headers["content-encoding"], length: Number(req.headers["content-length"] ?? 0) });
    return "forward";
  };

  test("batches of 1 KiB or more go gzip-compressed and are stored exactly as tracked", async () => {
    const log = [];
    const proxy = await startProxy(server.baseUrl, seen(log));
    try {
      const { tracker, errors } = collect({ baseUrl: proxy.url });
      const run = randomUUID();
      const sent = new Map();
      for (let seq = 0; seq < 300; seq++) {
        const properties = { run, seq, text: `café ☕ 𝄞 "quoted" \\ line\nbreak ${seq}`, nested: { a: [1, { b: null }, true] } };
        sent.set(tracker.track({ event: "Squeezed", userId: `u-${seq % 5}`, properties }), properties);
      }
      await tracker.close();
      assert.deepEqual(errors, []);
      assert.equal(tracker.stats.delivered, 300);
      assert.ok(log.length >= 1 && log.every((r) => r.encoding === "gzip"), JSON.stringify(log));
      const raw = [...sent.values()].reduce((n, p) => n + JSON.stringify(p).length, 0);
      assert.ok(tracker.stats.bytesSent * 4 < raw, `${tracker.stats.bytesSent} bytes sent for ${raw} bytes of properties`);
      const events = await readable(run, 300);
      assert.equal(events.length, 300);
      const bySeq = new Map(events.map((e) => [e.properties.seq, e.properties]));
      for (const p of sent.values()) assert.deepEqual(bySeq.get(p.seq), p);
    } finally {
      await proxy.close();
    }
  });

  test("a small batch, and compression: \"none\", go as is", async () => {
    const log = [];
    const proxy = await startProxy(server.baseUrl, seen(log));
    try {
      const small = collect({ baseUrl: proxy.url });
      small.tracker.track({ event: "Tiny", userId: "u" });
      await small.tracker.close();
      const plain = collect({ baseUrl: proxy.url, compression: "none" });
      for (let seq = 0; seq < 50; seq++) plain.tracker.track({ event: "Plain", userId: "u", properties: { seq, pad: "p".repeat(100) } });
      await plain.tracker.close();
      assert.equal(plain.tracker.stats.delivered, 50);
      assert.deepEqual(log.map((r) => r.encoding), [undefined, undefined]);
      assert.throws(() => new Tracker({ apiKey: "k", compression: "br" }), TypeError);
    } finally {
      await proxy.close();
    }
  });

  test("a server that refuses compressed bodies (415) gets the batch again as is, and every later one", async () => {
    const log = [];
    const proxy = await startProxy(server.baseUrl, (n, req) => {
      log.push(req.headers["content-encoding"]);
      return req.headers["content-encoding"]
        ? { status: 415, headers: { "content-type": "application/problem+json" }, body: JSON.stringify({ status: 415, code: "unsupported_media_type", title: "Unsupported Media Type" }) }
        : "forward";
    });
    const warn = console.warn;
    console.warn = () => {};
    try {
      const { tracker, errors } = collect({ baseUrl: proxy.url, maxBatch: 100 });
      const run = randomUUID();
      for (let seq = 0; seq < 200; seq++) tracker.track({ event: "Fallback", userId: "u", properties: { run, seq, pad: "f".repeat(50) } });
      await tracker.close();
      assert.deepEqual(errors, []);
      assert.equal(tracker.stats.delivered, 200);
      assert.deepEqual(log, ["gzip", undefined, undefined]);
      assert.equal((await readable(run, 200)).length, 200);
    } finally {
      console.warn = warn;
      await proxy.close();
    }
  });
});
