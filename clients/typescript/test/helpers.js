// Test harness: runs the real fastack binary (FASTACK_BIN, default
// <repo>/target/debug/fastack) on the embedded default, one temp data dir
// per server.
import { execFile, spawn } from "node:child_process";
import { accessSync, constants, mkdtempSync, openSync, closeSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const here = dirname(fileURLToPath(import.meta.url));
export const repoRoot = resolve(here, "../../..");
export const BIN = process.env.FASTACK_BIN || join(repoRoot, "target/debug/fastack");

try {
  accessSync(BIN, constants.X_OK);
} catch {
  throw new Error(
    `fastack binary not found or not executable at ${BIN}: build it (cargo build --bin fastack) or set FASTACK_BIN`,
  );
}

const run = promisify(execFile);
const live = new Set();
process.on("exit", () => {
  for (const s of live) s.proc?.kill("SIGKILL");
});

/** The environment for the binary: ours, without any other FASTACK_* (the server refuses unknown ones, FASTACK_BIN included). */
function childEnv(extra) {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("FASTACK_")) env[k] = v;
  return { ...env, ...extra };
}

/** A port nobody listens on right now (for a server that must come back on the same port). */
export async function freePort() {
  return new Promise((ok, fail) => {
    const srv = createServer();
    srv.once("error", fail);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => ok(port));
    });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Polls `fn` until it answers something truthy; throws (with `what`) after `timeoutMs`. */
export async function waitFor(fn, { timeoutMs = 20_000, intervalMs = 100, what = "condition" } = {}) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v) return v;
      last = v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (last: ${last?.message ?? JSON.stringify(last)})`);
    await sleep(intervalMs);
  }
}

export class Server {
  constructor({ port = 0, env = {} } = {}) {
    this.dataDir = mkdtempSync(join(tmpdir(), "fastack-ts-"));
    this.port = port;
    this.extraEnv = env;
    this.logPath = join(this.dataDir, "server.log");
    this.proc = undefined;
  }

  get env() {
    return childEnv({
      FASTACK_DATA_DIR: join(this.dataDir, "data"),
      FASTACK_LOG: "info",
      FASTACK_POLL_INTERVAL_MS: "200",
      ...this.extraEnv,
    });
  }

  get baseUrl() {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Starts `fastack serve` and waits until /readyz answers 200. */
  async start() {
    const fd = openSync(this.logPath, "a");
    const from = readLog(this.logPath).length;
    this.proc = spawn(BIN, ["serve"], {
      env: { ...this.env, FASTACK_LISTEN: `127.0.0.1:${this.port}` },
      stdio: ["ignore", fd, fd],
    });
    closeSync(fd);
    live.add(this);
    const proc = this.proc;
    let exited;
    proc.once("exit", (code, signal) => (exited = { code, signal }));
    const addr = await waitFor(
      () => {
        if (exited) throw new Error(`fastack serve exited (${JSON.stringify(exited)}):\n${this.tail()}`);
        return /fastack listening addr=127\.0\.0\.1:(\d+)/.exec(readLog(this.logPath).slice(from))?.[1];
      },
      { timeoutMs: 30_000, intervalMs: 50, what: "fastack listening" },
    );
    this.port = Number(addr);
    await waitFor(async () => (await fetch(`${this.baseUrl}/readyz`)).status === 200, { what: "/readyz" });
    this.apiKey ??= readFileSync(join(this.dataDir, "data", "bootstrap-key"), "utf8").trim();
    return this;
  }

  /** SIGKILL, and wait until the process is gone. */
  async kill() {
    const proc = this.proc;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    const gone = new Promise((r) => proc.once("exit", r));
    proc.kill("SIGKILL");
    await gone;
  }

  /** SIGTERM (graceful), SIGKILL after 10 s. */
  async stop() {
    const proc = this.proc;
    if (proc && proc.exitCode === null && proc.signalCode === null) {
      const gone = new Promise((r) => proc.once("exit", r));
      proc.kill("SIGTERM");
      const t = setTimeout(() => proc.kill("SIGKILL"), 10_000);
      await gone;
      clearTimeout(t);
    }
    live.delete(this);
  }

  /** stop() and remove the data dir. */
  async dispose() {
    await this.stop();
    rmSync(this.dataDir, { recursive: true, force: true });
  }

  /** `fastack admin --json …` on this server's data dir. */
  async admin(...args) {
    const { stdout } = await run(BIN, ["admin", "--json", ...args], { env: this.env });
    return JSON.parse(stdout);
  }

  /** Any other `fastack …` command on this data dir; answers stdout. */
  async cli(...args) {
    const { stdout } = await run(BIN, args, { env: this.env });
    return stdout;
  }

  tail(lines = 40) {
    return readLog(this.logPath).split("\n").slice(-lines).join("\n");
  }
}

function readLog(path) {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return "";
  }
}

/** Starts a server for the current test file and stops it afterwards (node:test `before`/`after`). */
export async function startServer(options) {
  return new Server(options).start();
}

/** A wide window around now for GET /v1/core/events. */
export function window() {
  const now = Date.now();
  return { from: new Date(now - 2 * 86_400_000), to: new Date(now + 2 * 86_400_000) };
}

/** Every event of the window with `properties.run === run`. */
export async function eventsOfRun(client, run, extra = {}) {
  const out = [];
  for await (const e of client.events({ ...window(), pageSize: 1000, ...extra })) {
    if (e.properties?.run === run || e.traits?.run === run) out.push(e);
  }
  return out;
}

/**
 * A local HTTP proxy in front of `target` whose `decide(n, req)` (n = 1, 2, …)
 * picks what happens to each request: "forward", "lose-answer" (forwarded,
 * then the connection is cut before the answer), or a response
 * `{ status, headers, body }` of its own (the request is not forwarded).
 */
export async function startProxy(target, decide) {
  const { createServer: createHttpServer } = await import("node:http");
  let n = 0;
  const server = createHttpServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks);
    const what = decide(++n, req);
    if (typeof what === "object") {
      res.writeHead(what.status, what.headers ?? {});
      res.end(what.body ?? "");
      return;
    }
    const headers = { ...req.headers };
    delete headers.host;
    delete headers["content-length"];
    const answer = await fetch(`${target}${req.url}`, {
      method: req.method,
      headers,
      body: body.length ? body : undefined,
    });
    const text = Buffer.from(await answer.arrayBuffer());
    if (what === "lose-answer") {
      req.socket.destroy();
      return;
    }
    res.writeHead(answer.status, Object.fromEntries(answer.headers));
    res.end(text);
  });
  await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    get requests() {
      return n;
    },
    close: () =>
      new Promise((ok) => {
        server.closeAllConnections?.();
        server.close(ok);
      }),
  };
}

/** Runs a fixture script (test/fixtures/NAME.mjs) and answers its exit, output and duration. */
export async function runFixture(name, env, timeoutMs = 30_000) {
  const started = Date.now();
  const child = spawn(process.execPath, [join(here, "fixtures", name)], {
    env: { ...process.env, ...env },
    cwd: here,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d) => (stdout += d));
  child.stderr.on("data", (d) => (stderr += d));
  const killer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
  const [code, signal] = await new Promise((ok) => child.once("exit", (c, s) => ok([c, s])));
  clearTimeout(killer);
  return { code, signal, stdout, stderr, ms: Date.now() - started };
}
