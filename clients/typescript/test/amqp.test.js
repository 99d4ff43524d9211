// verifyAmqp against real messages: a server with FASTACK_AMQP_URL publishes
// core.event.tracked and job.completed to exchanges of this test's own. Needs
// RabbitMQ at FASTACK_TEST_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2f):
// skipped without one, a failure with FASTACK_TEST_REQUIRE_SERVICES=1.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { connect as tcpConnect } from "node:net";
import { after, before, test } from "node:test";
import { Client, WebhookVerificationError, verifyAmqp } from "fastack";
import { startServer, waitFor } from "./helpers.js";

const url = process.env.FASTACK_TEST_AMQP_URL || "amqp://guest:guest@127.0.0.1:5672/%2f";
const required = ["1", "true"].includes(process.env.FASTACK_TEST_REQUIRE_SERVICES ?? "");

async function reachable() {
  const { hostname, port } = new URL(url);
  return new Promise((ok) => {
    const s = tcpConnect({ host: hostname, port: Number(port || 5672), timeout: 2_000 });
    s.once("connect", () => (s.destroy(), ok(true)));
    s.once("error", () => ok(false));
    s.once("timeout", () => (s.destroy(), ok(false)));
  });
}

const up = await reachable();
if (!up && required) throw new Error(`RabbitMQ is not reachable at ${url} (FASTACK_TEST_REQUIRE_SERVICES is set)`);

const suffix = randomUUID().slice(0, 8);
const exchanges = { core: `sdk-ts.core.${suffix}`, job: `sdk-ts.job.${suffix}` };
let server;
let conn;
let channel;
const messages = [];

before(async () => {
  if (!up) return;
  const amqp = await import("amqplib");
  conn = await amqp.connect(url);
  channel = await conn.createChannel();
  const { queue } = await channel.assertQueue("", { exclusive: true });
  for (const ex of Object.values(exchanges)) {
    await channel.assertExchange(ex, "topic", { durable: true });
    await channel.bindQueue(queue, ex, "#");
  }
  await channel.consume(queue, (msg) => msg && messages.push(msg), { noAck: true });
  server = await startServer({
    env: {
      FASTACK_AMQP_URL: url,
      FASTACK_CLOUDEVENTS_SOURCE: "//sdk-ts-test",
      FASTACK_CORE_EVENTS_EXCHANGE: exchanges.core,
      FASTACK_JOB_EVENTS_EXCHANGE: exchanges.job,
    },
  });
});

after(async () => {
  await server?.dispose();
  if (channel) for (const ex of Object.values(exchanges)) await channel.deleteExchange(ex).catch(() => {});
  await conn?.close().catch(() => {});
});

test("a real core.event.tracked and job.completed message verify; tampering does not", { skip: !up && `no RabbitMQ at ${url}` }, async () => {
  const key = (await server.cli("keys", "external-hmac")).trim();
  assert.match(key, /^[0-9a-f]{64}$/);
  const client = new Client({ apiKey: server.apiKey, baseUrl: server.baseUrl });
  const ack = await client.track({ event: "Streamed", userId: "amqp", properties: { n: 1 } });
  const msg = await waitFor(() => messages.find((m) => m.content.includes(ack.id)), { what: "the AMQP message" });
  const { headers } = msg.properties;
  const { exchange, routingKey } = msg.fields;
  assert.equal(exchange, exchanges.core);
  assert.equal(routingKey, "core.event.tracked");
  const payload = verifyAmqp(key, headers, msg.content, exchange, routingKey);
  assert.equal(payload.id, ack.id);

  const reason = (fn) => {
    try {
      fn();
    } catch (e) {
      assert.ok(e instanceof WebhookVerificationError);
      return e.reason;
    }
    return "accepted";
  };
  assert.equal(reason(() => verifyAmqp(key, headers, Buffer.concat([msg.content, Buffer.from(" ")]), exchange, routingKey)), "signature_mismatch");
  assert.equal(reason(() => verifyAmqp(key, headers, msg.content, exchanges.job, routingKey)), "signature_mismatch");
  assert.equal(reason(() => verifyAmqp(key, headers, msg.content, exchange, "job.completed")), "signature_mismatch");
  assert.equal(reason(() => verifyAmqp(key, { ...headers, "ce-tenantid": "someone-else" }, msg.content, exchange, routingKey)), "signature_mismatch");
  assert.equal(reason(() => verifyAmqp(key, headers, msg.content, exchange, routingKey, { now: (Number(headers.t) + 301) * 1000 })), "timestamp_out_of_window");

  const now = Date.now();
  const { job_id } = await client.exports.create({ from: new Date(now - 86_400_000), to: new Date(now + 86_400_000) });
  const jm = await waitFor(() => messages.find((m) => m.fields.routingKey === "job.completed" && m.content.includes(job_id)), {
    what: "the job.completed message",
  });
  assert.equal(jm.fields.exchange, exchanges.job);
  const job = verifyAmqp(key, jm.properties.headers, jm.content, jm.fields.exchange, jm.fields.routingKey);
  assert.equal(job.job_id, job_id);
});
