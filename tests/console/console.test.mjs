// The account console in a real browser: Debian's Chromium driven by
// playwright-core against the real `fastack serve` (embedded default, the
// console on). A local receiver stands in for the customer's endpoint.
//
//   FASTACK_BIN   the binary (default <repo>/target/debug/fastack)
//   CHROMIUM      the browser (default /usr/bin/chromium)
//   SCREENSHOTS   where each page's screenshot goes
//                 (default <repo>/target/console-screenshots)
import { execFile, spawn } from "node:child_process";
import { createHmac, timingSafeEqual } from "node:crypto";
import { closeSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "../..");
const BIN = process.env.FASTACK_BIN || join(root, "target/debug/fastack");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const SHOTS = process.env.SCREENSHOTS || join(root, "target/console-screenshots");
const PASSWORD = "correct horse battery staple";
const run = promisify(execFile);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitFor(fn, what, timeoutMs = 30_000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${last ? `: ${last.message}` : ""}`);
    await sleep(100);
  }
}

/** The receiver: records every request; answers `status` (changeable). */
function receiver() {
  const r = { hits: [], status: 204 };
  r.server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      r.hits.push({ headers: req.headers, body: Buffer.concat(chunks).toString("utf8") });
      res.writeHead(r.status).end();
    });
  });
  return new Promise((ok) =>
    r.server.listen(0, "127.0.0.1", () => {
      r.url = `http://127.0.0.1:${r.server.address().port}/hooks`;
      ok(r);
    }),
  );
}

/** Standard Webhooks: `v1,` + base64 HMAC-SHA256 of `id.timestamp.body`. */
function verifies(secret, hit) {
  const key = Buffer.from(secret.replace(/^whsec_/, ""), "base64");
  const id = hit.headers["webhook-id"];
  const ts = hit.headers["webhook-timestamp"];
  const mac = createHmac("sha256", key).update(`${id}.${ts}.${hit.body}`).digest();
  return hit.headers["webhook-signature"].split(" ").some((s) => {
    const given = Buffer.from(s.replace(/^v1,/, ""), "base64");
    return given.length === mac.length && timingSafeEqual(given, mac);
  });
}

let dir, proc, logPath, env, consoleUrl, apiUrl, apiKey, browser, rx;

function childEnv(extra) {
  const out = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("FASTACK_")) out[k] = v;
  return { ...out, ...extra };
}

async function cli(...args) {
  const { stdout } = await run(BIN, ["admin", ...args, "--json"], { env });
  return JSON.parse(stdout);
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "fastack-console-"));
  mkdirSync(SHOTS, { recursive: true });
  env = childEnv({
    FASTACK_DATA_DIR: join(dir, "data"),
    FASTACK_LISTEN: "127.0.0.1:0",
    FASTACK_CONSOLE_LISTEN: "127.0.0.1:0",
    FASTACK_WEBHOOK_ALLOW_PRIVATE: "true",
    FASTACK_LOG: "info",
  });
  logPath = join(dir, "server.log");
  const fd = openSync(logPath, "a");
  proc = spawn(BIN, ["serve"], { env, stdio: ["ignore", fd, fd] });
  closeSync(fd);
  const log = () => readFileSync(logPath, "utf8");
  const port = (re) => re.exec(log())?.[1];
  consoleUrl = `http://127.0.0.1:${await waitFor(() => port(/account console up addr=127\.0\.0\.1:(\d+)/), "the console")}`;
  apiUrl = `http://127.0.0.1:${await waitFor(() => port(/fastack listening addr=127\.0\.0\.1:(\d+)/), "the api")}`;
  // The CLI's links name the console's real port.
  env.FASTACK_CONSOLE_URL = consoleUrl;
  apiKey = readFileSync(join(dir, "data", "bootstrap-key"), "utf8").trim();
  rx = await receiver();
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
});

after(async () => {
  await browser?.close();
  rx?.server.close();
  proc?.kill("SIGTERM");
  if (process.exitCode) {
    console.error(readFileSync(logPath, "utf8").slice(-6000));
    console.error(JSON.stringify(rx?.hits.map((h) => [h.headers["webhook-event"], h.body.slice(0, 200)])));
  }
  rmSync(dir, { recursive: true, force: true });
});

/** The page at desktop width, and again at a phone's (390 px). */
async function shot(page, name) {
  await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
  const size = page.viewportSize();
  await page.setViewportSize({ width: 390, height: 844 });
  await page.screenshot({ path: join(SHOTS, `${name}-phone.png`), fullPage: true });
  // At a phone's width the header keeps two rows: the sections in one line.
  const nav = page.locator('header nav[aria-label="Console"]');
  if (await nav.count()) {
    const box = await nav.boundingBox();
    assert.ok(box.height < 48, `${name}: the navigation wraps at 390 px (${box.height} px high)`);
    const header = await page.locator("header").boundingBox();
    assert.ok(header.height < 120, `${name}: the header is ${header.height} px high at 390 px`);
  }
  await page.setViewportSize(size);
}

/** A new browser context signed in through a fresh one-time link. */
async function signIn(email, role, tenant = "default", shotName = null) {
  const user = await cli("user", "create", "--tenant", tenant, "--email", email, "--role", role);
  assert.ok(user.sign_in_link.startsWith(`${consoleUrl}/setup?token=`));
  const context = await browser.newContext({ viewport: { width: 1200, height: 900 } });
  const page = await context.newPage();
  await page.goto(user.sign_in_link);
  if (shotName) await shot(page, shotName);
  await page.getByLabel("New password (at least 12 characters)").fill(PASSWORD);
  await page.getByLabel("Repeat it").fill(PASSWORD);
  await page.getByRole("button", { name: "Set password and sign in" }).click();
  await page.waitForURL(`${consoleUrl}/endpoints`);
  return { context, page, user };
}

async function exportJob() {
  const r = await fetch(`${apiUrl}/v1/core/exports`, {
    method: "POST",
    headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ from: "2026-01-01T00:00:00Z", to: "2027-01-01T00:00:00Z" }),
  });
  const text = await r.text();
  assert.equal(r.status, 202, text);
  const job = JSON.parse(text);
  assert.ok(job.job_id, text);
  return job.job_id;
}

test("an owner registers an endpoint, sees its deliveries, replays the failed ones and rotates the secret", async () => {
  const { page } = await signIn("owner@example.com", "owner", "default", "00-set-password");
  await shot(page, "01-notifications-empty");
  assert.equal(await page.locator('nav a[aria-current="page"]').textContent(), "Notifications");

  // Add the endpoint; its secret is shown once, with a copy button.
  await page.getByLabel("URL", { exact: true }).fill(rx.url);
  await page.getByRole("button", { name: "Add endpoint" }).click();
  await page.getByText("Copy this secret now").waitFor();
  const secret = await page.getByLabel("Signing secret").inputValue();
  assert.match(secret, /^whsec_/);
  await page.getByRole("button", { name: "Copy" }).click();
  await page.getByRole("button", { name: "Copied" }).waitFor();
  await shot(page, "02-secret-shown-once");
  await page.getByRole("link", { name: "Go to the endpoint" }).click();
  const endpointUrl = page.url();
  assert.ok(!(await page.content()).includes(secret), "the secret is not shown again");

  // A job's terminal event is delivered and appears in the log.
  const job1 = await exportJob();
  const first = await waitFor(() => rx.hits.find((h) => h.body.includes(job1)), "job.completed at the receiver");
  assert.equal(first.headers["webhook-event"], "job.completed");
  assert.ok(verifies(secret, first));
  await waitFor(async () => {
    await page.reload();
    return (await page.locator('tr[data-status="delivered"]').count()) === 1;
  }, "the delivery in the log");
  await shot(page, "03-endpoint-delivered");
  await page.goto(`${consoleUrl}/jobs`);
  await page.getByRole("link", { name: "Download" }).first().waitFor();
  await shot(page, "04-jobs");

  // The receiver fails: three attempts, then the delivery is failed.
  rx.status = 500;
  // Written as the console shows times: UTC, "YYYY-MM-DD HH:MM:SS UTC".
  const since = new Date(Date.now() - 1000).toISOString().slice(0, 19).replace("T", " ") + " UTC";
  const job2 = await exportJob();
  await waitFor(() => rx.hits.filter((h) => h.body.includes(job2)).length === 3, "three failed attempts", 30_000);
  const failedId = rx.hits.find((h) => h.body.includes(job2)).headers["webhook-id"];
  await page.goto(`${endpointUrl}?status=failed`);
  await waitFor(async () => {
    await page.reload();
    return (await page.locator('tr[data-status="failed"]').count()) === 1;
  }, "the failed delivery in the log");
  const row = page.locator('tr[data-status="failed"]');
  assert.equal(await row.locator("ol.attempts li").count(), 3);
  assert.match(await row.textContent(), /500/);
  await shot(page, "05-endpoint-failed-attempts");

  // Fixed, "replay all failed since" sends it again with its webhook-id.
  rx.status = 204;
  const before = rx.hits.length;
  await page.getByLabel("Replay all failed deliveries since (UTC)").fill(since);
  await page.getByRole("button", { name: "Replay failed" }).click();
  await page.getByText("1 failed deliveries queued again.").waitFor();
  assert.match(page.url(), /[?&]status=failed/, "the replay keeps the log's filter");
  const replayed = await waitFor(() => rx.hits.slice(before).find((h) => h.body.includes(job2)), "the replay");
  assert.equal(replayed.headers["webhook-id"], failedId, "the original webhook-id");
  assert.ok(verifies(secret, replayed), "signed with the endpoint's secret");
  await shot(page, "06-endpoint-replayed");

  // Rotating shows the new secret once; both sign for a day.
  await page.goto(endpointUrl);
  await page.getByRole("button", { name: "Rotate secret" }).click();
  await page.getByText("The previous secret keeps signing").waitFor();
  const rotated = await page.getByLabel("Signing secret").inputValue();
  assert.notEqual(rotated, secret);
  await shot(page, "07-secret-rotated");
  const job3 = await exportJob();
  const signedTwice = await waitFor(() => rx.hits.find((h) => h.body.includes(job3)), "a delivery after rotation");
  assert.ok(verifies(rotated, signedTwice) && verifies(secret, signedTwice));

  for (const [path, name] of [["/keys", "08-keys"], ["/quarantine", "09-quarantine"], ["/plan", "10-plan"]]) {
    await page.goto(`${consoleUrl}${path}`);
    await shot(page, name);
  }
  await page.goto(`${consoleUrl}/jobs/not-a-job/result`);
  await shot(page, "11-error-page");
});

test("a viewer cannot add or replay; forged forms and other tenants are refused", async () => {
  const { page, context } = await signIn("viewer@example.com", "viewer");
  assert.equal(await page.getByRole("button", { name: "Add endpoint" }).count(), 0);
  const endpoint = page.locator("table a").first();
  await endpoint.click();
  assert.equal(await page.getByRole("button", { name: "Replay" }).count(), 0);
  await shot(page, "12-viewer-endpoint");
  const csrf = await page.locator('input[name="csrf"]').first().inputValue();
  // Submitting anyway (with a valid token) is refused.
  const add = await context.request.post(`${consoleUrl}/endpoints`, {
    form: { csrf, url: rx.url, events: "job.completed" },
    maxRedirects: 0,
  });
  assert.equal(add.status(), 403);
  const delivery = await cli("deliveries", "--tenant", "default", "--limit", "1");
  const replay = await context.request.post(`${consoleUrl}/deliveries/${delivery[0].id}/replay`, {
    form: { csrf },
    maxRedirects: 0,
  });
  assert.equal(replay.status(), 403);

  // An owner's form without the session's token is refused.
  const owner = await signIn("second-owner@example.com", "owner");
  const forged = await owner.context.request.post(`${consoleUrl}/keys`, { form: { csrf: "forged" }, maxRedirects: 0 });
  assert.equal(forged.status(), 403);
  assert.match(await forged.text(), /csrf_failed/);

  // Another tenant's endpoint is not found for this tenant's user.
  await cli("tenant", "create", "--name", "globex");
  const theirs = await cli("webhook", "add", "--tenant", "globex", "--url", rx.url);
  const resp = await owner.page.goto(`${consoleUrl}/endpoints/${theirs.id}`);
  assert.equal(resp.status(), 404);
  await shot(owner.page, "13-other-tenant-404");

  // "Sign out everywhere" ends the session in every browser.
  const elsewhere = await browser.newContext();
  await elsewhere.addCookies(await owner.context.cookies());
  const there = await elsewhere.newPage();
  await there.goto(`${consoleUrl}/endpoints`);
  assert.equal(there.url(), `${consoleUrl}/endpoints`);
  await owner.page.goto(`${consoleUrl}/endpoints`);
  await owner.page.getByRole("button", { name: "Sign out everywhere" }).click();
  await owner.page.waitForURL(`${consoleUrl}/signin`);
  await there.goto(`${consoleUrl}/endpoints`);
  assert.equal(there.url(), `${consoleUrl}/signin`);
  await shot(there, "14-signed-out");
});
