// verifyWebhook against real deliveries of a registered endpoint (a local
// receiver), including a secret rotation; tampered bodies and old timestamps
// are refused.
import assert from "node:assert/strict";
import { createHmac, randomUUID } from "node:crypto";
import { createServer } from "node:http";
import { after, before, test } from "node:test";
import { Client, WebhookVerificationError, verifyWebhook } from "fastack";
import { startServer, waitFor } from "./helpers.js";

let server;
let receiver;
const deliveries = [];
before(async () => {
  server = await startServer({ env: { FASTACK_WEBHOOK_ALLOW_PRIVATE: "true" } });
  receiver = createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    deliveries.push({ headers: req.headers, body: Buffer.concat(chunks) });
    res.writeHead(204).end();
  });
  await new Promise((ok) => receiver.listen(0, "127.0.0.1", ok));
});
after(async () => {
  await server?.dispose();
  receiver?.closeAllConnections?.();
  await new Promise((ok) => receiver?.close(ok));
});

const reason = (fn) => {
  try {
    fn();
  } catch (e) {
    assert.ok(e instanceof WebhookVerificationError, String(e));
    return e.reason;
  }
  assert.fail("accepted");
};

test("a real delivery verifies; a tampered body, an old timestamp and a wrong secret do not", async () => {
  const endpoint = await server.admin(
    "webhook", "add", "--tenant", "default",
    "--url", `http://127.0.0.1:${receiver.address().port}/hook`,
    "--events", "core.event.tracked,job.completed",
  );
  assert.match(endpoint.secret, /^whsec_/);
  const client = new Client({ apiKey: server.apiKey, baseUrl: server.baseUrl });
  const run = randomUUID();
  const ack = await client.track({ event: "Hooked", userId: "hook", properties: { run, text: "é ✓" } });

  const d = await waitFor(() => deliveries.find((x) => x.body.includes(ack.id)), { what: "the delivery" });
  assert.equal(d.headers["webhook-event"], "core.event.tracked");
  assert.match(d.headers["content-type"], /^application\/json/);

  // Node's req.headers, a fetch Headers, a Buffer, a string: all verify.
  const payload = verifyWebhook(endpoint.secret, d.headers, d.body);
  assert.equal(payload.id, ack.id);
  assert.deepEqual(payload.properties, { run, text: "é ✓" });
  verifyWebhook(endpoint.secret, new Headers(d.headers), new Uint8Array(d.body));
  verifyWebhook(endpoint.secret, d.headers, d.body.toString("utf8"));

  // Tampered body (one byte), wrong secret, a signature of another version.
  const tampered = Buffer.from(d.body);
  tampered[tampered.indexOf("hook")] = "H".charCodeAt(0);
  assert.equal(reason(() => verifyWebhook(endpoint.secret, d.headers, tampered)), "signature_mismatch");
  const other = `whsec_${Buffer.alloc(32, 7).toString("base64")}`;
  assert.equal(reason(() => verifyWebhook(other, d.headers, d.body)), "signature_mismatch");
  const v2 = { ...d.headers, "webhook-signature": d.headers["webhook-signature"].replace(/^v1,/, "v2,") };
  assert.equal(reason(() => verifyWebhook(endpoint.secret, v2, d.body)), "signature_mismatch");

  // The same delivery checked 5 minutes + 1 s later is refused ...
  const ts = Number(d.headers["webhook-timestamp"]);
  assert.equal(reason(() => verifyWebhook(endpoint.secret, d.headers, d.body, { now: (ts + 301) * 1000 })), "timestamp_out_of_window");
  assert.ok(verifyWebhook(endpoint.secret, d.headers, d.body, { now: (ts + 299) * 1000 }));
  // ... and so is a correctly signed message with a timestamp 10 minutes old (replay).
  const old = String(Math.floor(Date.now() / 1000) - 600);
  const key = Buffer.from(endpoint.secret.slice("whsec_".length), "base64");
  const id = d.headers["webhook-id"];
  const sig = createHmac("sha256", key).update(`${id}.${old}.`).update(d.body).digest("base64");
  const replay = { ...d.headers, "webhook-timestamp": old, "webhook-signature": `v1,${sig}` };
  assert.equal(reason(() => verifyWebhook(endpoint.secret, replay, d.body)), "timestamp_out_of_window");
  assert.ok(verifyWebhook(endpoint.secret, replay, d.body, { now: Number(old) * 1000 }), "the hand-made signature is right");
  // Missing headers.
  const { ["webhook-signature"]: _drop, ...unsigned } = d.headers;
  assert.equal(reason(() => verifyWebhook(endpoint.secret, unsigned, d.body)), "missing_header");

  // Rotation: deliveries carry two signatures for 24 h; old and new secrets both verify.
  const rotated = await server.admin("webhook", "rotate-secret", "--endpoint", endpoint.id);
  assert.notEqual(rotated.secret, endpoint.secret);
  // The server may still use its cached endpoint for a moment: send until a delivery carries two signatures.
  const twoSigned = await waitFor(
    async () => {
      const a = await client.track({ event: "Hooked again", userId: "hook", properties: { run } });
      return waitFor(() => deliveries.find((x) => x.body.includes(a.id)), { what: "the delivery" }).then((x) =>
        x.headers["webhook-signature"].split(" ").length === 2 ? x : undefined,
      );
    },
    { what: "a delivery signed with both secrets", intervalMs: 300 },
  );
  assert.ok(verifyWebhook(rotated.secret, twoSigned.headers, twoSigned.body));
  assert.ok(verifyWebhook(endpoint.secret, twoSigned.headers, twoSigned.body));
  assert.equal(reason(() => verifyWebhook(other, twoSigned.headers, twoSigned.body)), "signature_mismatch");

  // A job's terminal webhook (job.completed) verifies the same way.
  const now = Date.now();
  const { job_id } = await client.exports.create({ from: new Date(now - 86_400_000), to: new Date(now + 86_400_000) });
  const j = await waitFor(() => deliveries.find((x) => x.headers["webhook-event"] === "job.completed" && x.body.includes(job_id)), {
    what: "the job.completed delivery",
  });
  const job = verifyWebhook(rotated.secret, j.headers, j.body);
  assert.equal(job.job_id, job_id);
  assert.equal(job.status, "completed");
});
