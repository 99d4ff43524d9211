// No server: signature vectors, timestamps, error parsing, the package surface.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import * as sdk from "fastack";
import { ApiError, VERSION, WebhookVerificationError, rfc3339Local, verifyAmqp, verifyWebhook } from "fastack";

test("the public names", () => {
  for (const name of ["Client", "Tracker", "ApiError", "verifyWebhook", "verifyAmqp", "TrackerError", "WebhookVerificationError"]) {
    assert.equal(typeof sdk[name], "function", name);
  }
  const pkg = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8"));
  assert.equal(VERSION, pkg.version);
  assert.deepEqual(Object.keys(pkg.dependencies), ["openapi-fetch"]);
});

test("verifyWebhook: the Standard Webhooks reference vector", () => {
  const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
  const headers = {
    "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
    "webhook-timestamp": "1614265330",
    "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
  };
  const body = '{"test": 2432232314}';
  const now = 1614265330 * 1000;
  assert.deepEqual(verifyWebhook(secret, headers, body, { now }), { test: 2432232314 });
  // Several signatures (rotation): any one matching is enough, in any position.
  const rotated = { ...headers, "webhook-signature": `v1,Zm9vYmFy v1a,xx ${headers["webhook-signature"]}` };
  assert.ok(verifyWebhook(secret, rotated, body, { now }));
  // Header names in any case.
  const upper = Object.fromEntries(Object.entries(headers).map(([k, v]) => [k.toUpperCase(), v]));
  assert.ok(verifyWebhook(secret, upper, body, { now }));
  // The secret without its prefix works as well.
  assert.ok(verifyWebhook(secret.slice(6), headers, body, { now }));
  const fail = (fn) => {
    try {
      fn();
    } catch (e) {
      assert.ok(e instanceof WebhookVerificationError);
      return e.reason;
    }
    return "accepted";
  };
  assert.equal(fail(() => verifyWebhook(secret, headers, body.replace("2", "3"), { now })), "signature_mismatch");
  assert.equal(fail(() => verifyWebhook(secret, headers, body, { now: now + 301_000 })), "timestamp_out_of_window");
  assert.equal(fail(() => verifyWebhook(secret, headers, body, { now: now - 301_000 })), "timestamp_out_of_window");
  assert.equal(fail(() => verifyWebhook(secret, { ...headers, "webhook-timestamp": "16142653e0" }, body, { now })), "invalid_timestamp");
  assert.equal(fail(() => verifyWebhook("whsec_", headers, body, { now })), "invalid_key");
  assert.equal(fail(() => verifyWebhook(secret, { ...headers, "webhook-id": undefined }, body, { now })), "missing_header");
});

test("verifyAmqp: a vector computed independently (Python hmac)", () => {
  const key = "2bcf1dc1ddb5c1182c34eb5182f3e4153d40f86568f540002703200c44187d5d";
  const headers = {
    "x-message-signature": "1ae0077b71a6312fdb545c9acda46194d23e9ec7f34fb22bac45a8530d1b2037",
    t: 1764558000,
    "signature-version": "v1",
    "ce-tenantid": Buffer.from("01a22f84-d7e2-711c-ab54-8b1fdc4ce85b"), // amqplib hands long strings as Buffers
    "ce-subject": "01a22f85-1129-7254-9351-3eb6ece76388",
  };
  const body = Buffer.from('{"job_id":"x","status":"completed"}');
  const now = 1764558000 * 1000 + 1000;
  const args = ["fastack.job.events", "job.completed", { now }];
  assert.deepEqual(verifyAmqp(key, headers, body, ...args), { job_id: "x", status: "completed" });
  assert.ok(verifyAmqp(Buffer.from(key, "hex"), headers, body, ...args));
  const fail = (fn) => {
    try {
      fn();
    } catch (e) {
      assert.ok(e instanceof WebhookVerificationError);
      return e.reason;
    }
    return "accepted";
  };
  assert.equal(fail(() => verifyAmqp(key, headers, body, "fastack.job.events", "job.failed", { now })), "signature_mismatch");
  assert.equal(fail(() => verifyAmqp(key, headers, body, "other", "job.completed", { now })), "signature_mismatch");
  assert.equal(fail(() => verifyAmqp(key, headers, Buffer.from("{}"), ...args)), "signature_mismatch");
  assert.equal(fail(() => verifyAmqp(key, { ...headers, "ce-subject": "x" }, body, ...args)), "signature_mismatch");
  assert.equal(fail(() => verifyAmqp(key, { ...headers, "signature-version": "v2" }, body, ...args)), "unsupported_version");
  assert.equal(fail(() => verifyAmqp(key, { ...headers, t: undefined }, body, ...args)), "missing_header");
  assert.equal(fail(() => verifyAmqp(key, { ...headers, "ce-tenantid": undefined }, body, ...args)), "missing_header");
  assert.equal(
    fail(() => verifyAmqp(key, headers, body, "fastack.job.events", "job.completed", { now: now + 301_000 })),
    "timestamp_out_of_window",
  );
  assert.equal(fail(() => verifyAmqp("zz", headers, body, ...args)), "invalid_key");
});

test("rfc3339Local: the machine's offset, half-hour zones included", () => {
  const script = `import { rfc3339Local } from "fastack"; console.log(rfc3339Local(new Date(Date.UTC(2026, 10, 30, 8, 15, 0, 123))))`;
  const at = (tz) =>
    execFileSync(process.execPath, ["--input-type=module", "-e", script], {
      env: { ...process.env, TZ: tz },
      cwd: new URL("..", import.meta.url),
    })
      .toString()
      .trim();
  assert.equal(at("UTC"), "2026-11-30T08:15:00.123+00:00");
  assert.equal(at("Europe/Paris"), "2026-11-30T09:15:00.123+01:00");
  assert.equal(at("Asia/Kolkata"), "2026-11-30T13:45:00.123+05:30");
  assert.equal(at("America/St_Johns"), "2026-11-30T04:45:00.123-03:30");
  const now = rfc3339Local();
  assert.ok(Math.abs(Date.parse(now) - Date.now()) < 5_000);
});

test("ApiError from a problem document and from anything else", () => {
  const problem = {
    type: "urn:fastack:problem:rate_limited",
    title: "Too Many Requests",
    status: 429,
    detail: "rate limit exceeded; retry after 1 s",
    code: "rate_limited",
  };
  const e = ApiError.from(new Response(null, { status: 429, headers: { "retry-after": "1" } }), problem);
  assert.equal(e.status, 429);
  assert.equal(e.code, "rate_limited");
  assert.equal(e.detail, problem.detail);
  assert.deepEqual(e.errors, []);
  assert.equal(e.retryAfter, 1);
  assert.ok(e instanceof Error);
  assert.equal(e.name, "ApiError");

  const html = ApiError.from(new Response(null, { status: 502, statusText: "Bad Gateway" }), "<html>oops</html>");
  assert.equal(html.status, 502);
  assert.equal(html.code, "unknown");
  assert.equal(html.detail, "<html>oops</html>");
});
