// Tracker shutdown against the real server: flush()/close() return by their
// deadline and say what they did not deliver, a refused key is an error, and
// the spool keeps undelivered events across a restart, exactly once.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, readdirSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Client, DEFAULT_CLOSE_TIMEOUT_MS, DEFAULT_FLUSH_TIMEOUT_MS, Tracker, TrackerError } from "fastack";
import { eventsOfRun, freePort, runFixture, sleep, startProxy, startServer, waitFor } from "./helpers.js";

// What a deadline may overrun by on a small, busy machine.
const SLACK_MS = 1_500;

let server;
let client;
const dirs = [];
before(async () => {
  server = await startServer();
  client = new Client({ apiKey: server.apiKey, baseUrl: server.baseUrl });
});
after(async () => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
  await server?.dispose();
});

function spoolDir() {
  const d = mkdtempSync(join(tmpdir(), "fastack-spool-"));
  dirs.push(d);
  return join(d, "spool"); // created by the tracker
}

const files = (dir) => readdirSync(dir).sort();
const spooledLines = (dir) =>
  files(dir)
    .filter((f) => f.endsWith(".jsonl"))
    .flatMap((f) => readFileSync(join(dir, f), "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l)));

/** Captures console.warn / console.error lines while `fn` runs. */
async function capturingConsole(fn) {
  const lines = [];
  const { warn, error } = console;
  console.warn = (...a) => lines.push(a.join(" "));
  console.error = (...a) => lines.push(a.join(" "));
  try {
    return { value: await fn(lines), lines };
  } finally {
    console.warn = warn;
    console.error = error;
  }
}

/** n events of the run, each once: distinct ids, seq 0..n-1 once each (tracks only). */
async function assertExactlyOnce(run, n, event) {
  await waitFor(async () => (await eventsOfRun(client, run, { event })).length >= n, { timeoutMs: 30_000, what: `${n} ${event} events` });
  await sleep(500); // anything doubled would show up by now
  const events = await eventsOfRun(client, run, { event });
  assert.equal(events.length, n, `${events.length} events for ${n} tracked`);
  assert.equal(new Set(events.map((e) => e.id)).size, n, "an event id appears twice");
  assert.deepEqual(
    events.map((e) => e.properties.seq).sort((a, b) => a - b),
    Array.from({ length: n }, (_, i) => i),
    "an item is missing or doubled",
  );
}

describe("deadlines", () => {
  test("close() with no options against a port where nothing listens returns by its 10 s default and says what it did not deliver", async () => {
    assert.equal(DEFAULT_CLOSE_TIMEOUT_MS, 10_000);
    assert.equal(DEFAULT_FLUSH_TIMEOUT_MS, 10_000);
    const port = await freePort(); // nobody listens there
    const errors = [];
    // Retries that never run out: only the deadlines end it.
    const tracker = new Tracker({
      apiKey: "fsk_x",
      baseUrl: `http://127.0.0.1:${port}`,
      onError: (e) => errors.push(e),
      retryBaseMs: 50,
      retryMaxMs: 200,
      maxRetries: 1_000_000,
      flushTimeoutMs: 1_000,
    });
    const keys = [];
    for (let seq = 0; seq < 5; seq++) keys.push(tracker.track({ event: "Nowhere", userId: "u", properties: { seq } }));

    const { value: flushed, lines } = await capturingConsole(async () => {
      const t0 = Date.now();
      const r = await tracker.flush({ detailed: true }); // the tracker's flushTimeoutMs
      const ms = Date.now() - t0;
      assert.ok(ms >= 990 && ms < 1_000 + SLACK_MS, `flush() took ${ms} ms`);
      return r;
    });
    assert.equal(flushed.ok, false);
    assert.deepEqual([flushed.pending, flushed.failed, flushed.spooled, flushed.timedOut], [5, 0, 0, true]);
    assert.equal(flushed.error.kind, "undelivered");
    assert.match(flushed.error.message, /last error: fetch failed/);
    assert.deepEqual(errors, [], "flush() gives nothing up: the items stay queued");
    assert.ok(lines.some((l) => l.includes("flush(): 5 item(s) not delivered (5 still queued)")), lines.join("\n"));
    assert.equal((await capturingConsole(() => tracker.flush({ timeoutMs: 200 }))).value, false);

    const { value: closed, lines: closeLines } = await capturingConsole(async () => {
      const t0 = Date.now();
      const r = await tracker.close(); // the default deadline
      const ms = Date.now() - t0;
      assert.ok(ms >= DEFAULT_CLOSE_TIMEOUT_MS - 10 && ms < DEFAULT_CLOSE_TIMEOUT_MS + SLACK_MS, `close() took ${ms} ms`);
      return r;
    });
    assert.deepEqual(
      [closed.ok, closed.pending, closed.failed, closed.spooled, closed.timedOut, closed.error.kind],
      [false, 0, 5, 0, true, "undelivered"],
    );
    assert.deepEqual(errors.map((e) => [e.kind, e.items.map((i) => i.idempotencyKey)]), [["undelivered", keys]]);
    assert.ok(closeLines.some((l) => /close\(\) after 10\.\d s: 5 item\(s\) not delivered \(5 handed to onError\)/.test(l)), closeLines.join("\n"));
    assert.equal(await tracker.close(), closed, "idempotent: the first call's result");
    await assert.rejects(tracker.close({ throwOnError: true }), (e) => e instanceof TrackerError && e.kind === "undelivered" && e.result === closed);
  });

  test("close({ timeoutMs, throwOnError }) rejects by its deadline", async () => {
    const tracker = new Tracker({ apiKey: "fsk_x", baseUrl: `http://127.0.0.1:${await freePort()}`, onError: () => {}, retryBaseMs: 50 });
    tracker.track({ event: "Nowhere", userId: "u" });
    const t0 = Date.now();
    await capturingConsole(() =>
      assert.rejects(tracker.close({ timeoutMs: 500, throwOnError: true }), (e) => {
        assert.ok(e instanceof TrackerError);
        assert.deepEqual([e.kind, e.result.failed, e.result.timedOut], ["undelivered", 1, true]);
        return true;
      }),
    );
    assert.ok(Date.now() - t0 < 500 + SLACK_MS);
  });
});

test("a wrong API key (401) is an error, not a success: onError (unauthorized), a false flush(), close({ throwOnError }) rejects", async () => {
  const errors = [];
  const tracker = new Tracker({ apiKey: "fsk_wrong", baseUrl: server.baseUrl, flushIntervalMs: 60_000, onError: (e) => errors.push(e) });
  const key = tracker.track({ event: "Refused", userId: "u" });
  assert.equal(typeof key, "string"); // nothing is sent yet
  tracker.track({ event: "Refused", userId: "u" });
  tracker.identify({ userId: "u", traits: { plan: "pro" } });
  const { value: flushed, lines } = await capturingConsole(() => tracker.flush());
  assert.equal(flushed, false);
  assert.deepEqual(errors.map((e) => [e.kind, e.problem?.status, e.problem?.code, e.items.length]), [["unauthorized", 401, "unauthorized", 3]]);
  assert.ok(lines.some((l) => l.includes("refused the API key")), lines.join("\n"));

  // The tracker stopped sending: later items fail fast with the same error.
  const later = tracker.track({ event: "Refused", userId: "u" });
  await Promise.resolve();
  assert.deepEqual(errors.map((e) => e.kind), ["unauthorized", "unauthorized"]);
  assert.equal(errors[1].items[0].idempotencyKey, later);
  assert.equal(tracker.stats.requests, 1);

  const detailed = await capturingConsole(() => tracker.flush({ detailed: true }));
  assert.deepEqual([detailed.value.ok, detailed.value.failed, detailed.value.error.kind], [false, 1, "unauthorized"]);
  await capturingConsole(() =>
    assert.rejects(tracker.close({ throwOnError: true }), (e) => {
      assert.ok(e instanceof TrackerError);
      assert.deepEqual([e.kind, e.problem.status, e.problem.code, e.result.ok], ["unauthorized", 401, "unauthorized", false]);
      return true;
    }),
  );
  // Without throwOnError: the result is not a success either.
  const quiet = new Tracker({ apiKey: "fsk_wrong", baseUrl: server.baseUrl, onError: () => {} });
  quiet.track({ event: "Refused", userId: "u" });
  const { value: result } = await capturingConsole(() => quiet.close());
  assert.deepEqual([result.ok, result.failed, result.error.kind], [false, 1, "unauthorized"]);
});

test("the spool keeps undelivered events across a restart, exactly once (also when the first resend's answers are lost)", async () => {
  const run = randomUUID();
  const spool = spoolDir();
  const n = 30;
  const at = new Date(Date.now() - 3_600_000).toISOString();
  // One event the server already has (same key, same content): its resend from
  // the spool must come back as a duplicate, not as a second event.
  await client.track({ event: "Spooled", userId: "u-0", properties: { run, seq: 0 }, occurredAt: at, idempotencyKey: `spool-${run}` });

  // A: nothing listens; close() spools what it could not deliver.
  const errors = [];
  const a = new Tracker({ apiKey: server.apiKey, baseUrl: `http://127.0.0.1:${await freePort()}`, spoolDir: spool, closeTimeoutMs: 1_000, retryBaseMs: 50, onError: (e) => errors.push(e) });
  const keys = [a.track({ event: "Spooled", userId: "u-0", properties: { run, seq: 0 }, occurredAt: at, idempotencyKey: `spool-${run}` })];
  for (let seq = 1; seq < n; seq++) keys.push(a.track({ event: "Spooled", userId: `u-${seq % 3}`, properties: { run, seq } }));
  keys.push(a.identify({ userId: `u-1-${run}`, anonymousId: `a-1-${run}`, traits: { run, plan: "spooled" } }));
  const t0 = Date.now();
  const { value: result } = await capturingConsole(() => a.close());
  assert.ok(Date.now() - t0 < 1_000 + SLACK_MS);
  assert.deepEqual([result.ok, result.spooled, result.failed, result.timedOut], [false, n + 1, 0, true]);
  assert.deepEqual(errors, [], "spooled items are not handed to onError");
  assert.deepEqual(files(spool), [basename(result.spoolFile)]);
  assert.match(basename(result.spoolFile), /^\d{20}-\d+-[0-9a-f]+\.jsonl$/);
  assert.equal(statSync(result.spoolFile).mode & 0o777, 0o600);
  assert.deepEqual(spooledLines(spool).map((l) => l.idempotency_key), keys, "as queued, in order");

  // B0: a wrong key does not consume the spool: what came from it goes back.
  const b0Errors = [];
  const b0 = new Tracker({ apiKey: "fsk_wrong", baseUrl: server.baseUrl, spoolDir: spool, onError: (e) => b0Errors.push(e) });
  const { value: b0Result } = await capturingConsole(() => b0.close());
  assert.deepEqual([b0Result.ok, b0Result.spooled, b0Result.error.kind], [false, n + 1, "unauthorized"]);
  assert.deepEqual(b0Errors.map((e) => [e.kind, e.items.length]), [["unauthorized", 0]]);
  assert.deepEqual(spooledLines(spool).map((l) => l.idempotency_key).sort(), [...keys].sort());

  // B1: its sends reach the server but every answer is lost; at its deadline
  // it spools the items again, with the same keys.
  const proxy = await startProxy(server.baseUrl, () => "lose-answer");
  try {
    const b1 = new Tracker({ apiKey: server.apiKey, baseUrl: proxy.url, spoolDir: spool, retryBaseMs: 50, onError: (e) => errors.push(e) });
    const { value: b1Result } = await capturingConsole(() => b1.close({ timeoutMs: 1_500 }));
    assert.equal(b1Result.spooled, n + 1);
    assert.ok(proxy.requests >= 1);
  } finally {
    await proxy.close();
  }
  assert.deepEqual(errors, []);
  assert.equal(files(spool).length, 1);
  assert.match(files(spool)[0], /\.jsonl$/);

  // B2, on a working server, sends them first: each one already stored is
  // answered as a duplicate, so every event is stored once.
  const b2 = new Tracker({ apiKey: server.apiKey, baseUrl: server.baseUrl, spoolDir: spool, onError: (e) => errors.push(e) });
  b2.track({ event: "Spooled", userId: "u-2", properties: { run, seq: n } });
  const b2Result = await b2.close();
  assert.equal(b2Result.ok, true);
  assert.deepEqual(errors, []);
  assert.deepEqual([b2.stats.delivered, b2.stats.duplicates], [n + 2, n + 1]);
  assert.deepEqual(files(spool), [], "the delivered spool file is removed");
  await assertExactlyOnce(run, n + 1, "Spooled");
  const contact = await client.contacts.find({ anonymousId: `a-1-${run}` });
  assert.equal(contact?.traits?.plan, "spooled");
});

test("two processes on one spool send each item once; a claim left by a dead process is taken back", async () => {
  const run = randomUUID();
  const spool = spoolDir();
  const dead = `http://127.0.0.1:${await freePort()}`;
  // Four processes that ended against a dead server: their exit flush spooled.
  const produced = await Promise.all(
    [0, 50, 100, 150].map((start) =>
      runFixture("spool-produce.mjs", { API_KEY: server.apiKey, BASE_URL: dead, SPOOL_DIR: spool, RUN: run, START: String(start) }),
    ),
  );
  for (const r of produced) assert.equal(r.code, 0, r.stderr);
  const ready = files(spool);
  assert.equal(ready.length, 4, ready.join(" "));
  assert.equal(spooledLines(spool).length, 200);
  // One file claimed by a process that is gone (it crashed mid-send).
  const gone = Number(spawnSync(process.execPath, ["-e", "console.log(process.pid)"], { encoding: "utf8" }).stdout);
  renameSync(join(spool, ready[0]), join(spool, `${ready[0]}.claimed-${gone}-dead`));

  const consumed = await Promise.all(
    [1, 2].map(() => runFixture("spool-consume.mjs", { API_KEY: server.apiKey, BASE_URL: server.baseUrl, SPOOL_DIR: spool }, 90_000)),
  );
  const outs = consumed.map((r) => {
    assert.equal(r.code, 0, r.stderr);
    return JSON.parse(r.stdout.trim().split("\n").at(-1));
  });
  assert.ok(outs.every((o) => o.ok), JSON.stringify(outs));
  assert.equal(outs[0].delivered + outs[1].delivered, 200, JSON.stringify(outs));
  assert.equal(outs[0].duplicates + outs[1].duplicates, 0, `an item was sent twice: ${JSON.stringify(outs)}`);
  assert.deepEqual(files(spool), []);
  await assertExactlyOnce(run, 200, "Shared");
});

test("a spool line that is not an item is skipped", async () => {
  const run = randomUUID();
  const spool = spoolDir();
  new Tracker({ apiKey: "fsk_x", flushOnExit: false, spoolDir: spool }); // creates the directory
  const item = { type: "track", event: "Handmade", user_id: "u", properties: { run, seq: 0 }, occurred_at: new Date().toISOString(), idempotency_key: `handmade-${run}` };
  writeFileSync(join(spool, `${String(Date.now()).padEnd(20, "0")}-1-abcd.jsonl`), `${JSON.stringify(item)}\nnot json\n[1]\n`);
  const { value: result } = await capturingConsole(async () => {
    const tracker = new Tracker({ apiKey: server.apiKey, baseUrl: server.baseUrl, spoolDir: spool });
    const r = await tracker.close();
    assert.equal(tracker.stats.delivered, 1);
    return r;
  });
  assert.equal(result.ok, true);
  assert.deepEqual(files(spool), []);
  await assertExactlyOnce(run, 1, "Handmade");
});
