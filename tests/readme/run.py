#!/usr/bin/env python3
"""The README, executed: every example a newcomer would type, in order.

    tests/readme/run.py [README.md]

Runs the README's `sh`, `python` and `js` code blocks top to bottom, in one
bash session, in a fresh temporary directory (so `./fastack-data` starts
empty), against the binary named by FASTACK_BIN (default
target/debug/fastack). It fails when a command fails or when an output the
README shows no longer matches. The conventions, which the README follows:

* Code blocks tagged `sh` run in bash; `python` blocks run with `python3`
  (the one on PATH at that point, so after `. .venv/bin/activate` the
  virtualenv's); `js` blocks run with `node` as an ES module. Blocks with
  any other tag (`json`, `rust`, `text`, none) are not run.
* A line `#> text` shows output: the output of the commands above it in the
  same block (since the previous `#>` lines) must contain a line matching
  each `#>` line, in order. `…` matches anything. In `python` and `js`
  blocks the same lines start with `#>` and `//>` respectively.
* HTML comments just before a block steer it (GitHub does not show them):
    <!-- readme: skip <why> -->         the block is not run (say why)
    <!-- readme: background -->         the block runs in the background (a
                                         server); its output goes to the log
    <!-- readme: replace A => B -->     A is replaced by B in the block before
                                         it runs (hosts of services, say)
  and anywhere in the text:
    <!-- readme: run <shell> -->        a command the reader does by hand
                                         (waits for a server, stops it)
    <!-- readme: again N [A => B] -->   the N steps and run commands before
                                         it, once more (a reader running them
                                         twice), A read as B in their outputs
* `cargo run --release --` and `./target/release/fastack` are run as the
  binary under test (`fastack` on PATH), so the test needs no release
  build; `cargo install` lines are skipped likewise.
* `curl` fails on an HTTP error status (as with `--fail-with-body`), and a
  step stops at its first failing command (`set -e`).
* Helpers for `readme: run`: `ready <url>` waits up to 60 s for a 2xx,
  `eventually <shell>` retries a command for up to 10 s until it succeeds,
  `stop_servers` stops (SIGTERM) the `fastack serve` processes the README
  started and waits for them, `stop_last` the newest of them.
* Environment for replacements: README_PG_HOST, README_PG_PORT,
  README_PG_USER and README_PG_NAME (a database name on the test PostgreSQL server that does
  not exist yet: the README creates it, as a reader on an empty server
  would; dropped at the end), README_PG_URL (that database's URL),
  README_REDIS_URL, README_AMQP_URL and README_S3_ENDPOINT, from the test
  environment (FASTACK_TEST_PG_URL, FASTACK_TEST_REDIS_URL, …).

Each step has a time limit (120 s). On failure the step, its output and the
log of background processes are printed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

STEP_TIMEOUT = 120
REPO = Path(__file__).resolve().parents[2]

DIRECTIVE = re.compile(r"<!--\s*readme:\s*(\w+)\s*(.*?)\s*-->", re.S)
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
CHECK_PREFIX = {"sh": "#>", "python": "#>", "js": "//>"}
RUNNABLE = set(CHECK_PREFIX)


@dataclass
class Step:
    """One thing to run: code, the lines its output must show, where."""

    lang: str
    code: str
    expect: list[str]
    line: int
    background: bool = False
    hidden: bool = False


@dataclass
class Block:
    lang: str
    lines: list[str]
    line: int
    directives: list[tuple[str, str]] = field(default_factory=list)


def parse(text: str) -> list[Step | tuple[str, str]]:
    """The README as a list of steps (and `run` directives), in order."""
    out: list[Step | tuple[str, str]] = []
    pending: list[tuple[str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            # Directives may span lines: collect the comment whole.
            if "<!--" in lines[i]:
                j = i
                chunk = lines[i]
                while "-->" not in chunk and j + 1 < len(lines):
                    j += 1
                    chunk += "\n" + lines[j]
                for d in DIRECTIVE.finditer(chunk):
                    kind, arg = d.group(1), d.group(2)
                    if kind == "run":
                        out.append(("run", arg, i + 1))  # type: ignore[arg-type]
                    elif kind == "again":
                        out.extend(again(out, arg, i + 1))
                    elif kind in ("skip", "background", "replace"):
                        pending.append((kind, arg))
                    else:
                        sys.exit(f"README.md:{i + 1}: unknown directive readme: {kind}")
                i = j + 1
                continue
            if lines[i].strip() and pending:
                sys.exit(f"README.md:{i + 1}: a readme: directive is not followed by a code block")
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        start = i + 1
        body = []
        i += 1
        while i < len(lines) and not FENCE.match(lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        block = Block(lang, body, start, pending)
        pending = []
        if lang not in RUNNABLE:
            if block.directives:
                sys.exit(f"README.md:{start}: readme: directives on a `{lang}` block, which is not run")
            continue
        out.extend(steps_of(block))
    return out


def again(done: list[Step | tuple[str, str]], arg: str, line: int) -> list[Step | tuple[str, str]]:
    """`again N [A => B]`: the N steps and `run` commands before it, once
    more, in order (a reader running that part a second time), with A read
    as B in the outputs they must show."""
    count, _, swap = arg.partition(" ")
    if not count.isdigit() or int(count) > len(done):
        sys.exit(f"README.md:{line}: readme: again needs a count of the steps before it, got {arg!r}")
    a, b = (s.strip() for s in swap.split("=>", 1)) if "=>" in swap else ("", "")
    out: list[Step | tuple[str, str]] = []
    for item in done[len(done) - int(count):]:
        if isinstance(item, Step):
            expect = [e.replace(a, b) if a else e for e in item.expect]
            out.append(Step(item.lang, item.code, expect, item.line, item.background, item.hidden))
        else:
            out.append(item)
    return out


def steps_of(block: Block) -> list[Step]:
    kinds = dict(block.directives)
    if "skip" in kinds:
        if not kinds["skip"]:
            sys.exit(f"README.md:{block.line}: readme: skip needs a reason")
        return []
    whole = "\n".join(block.lines)
    for kind, arg in block.directives:
        if kind == "replace" and arg.split("=>", 1)[0].strip() not in whole:
            sys.exit(f"README.md:{block.line}: readme: replace: {arg.split('=>', 1)[0].strip()!r} is not in the block")
    prefix = CHECK_PREFIX[block.lang]
    steps: list[Step] = []
    code: list[str] = []
    expect: list[str] = []
    first = block.line

    def flush() -> None:
        nonlocal code, expect, first
        if any(c.strip() for c in code) or expect:
            steps.append(Step(block.lang, rewrite("\n".join(code), block.directives), expect, first))
        code, expect = [], []

    for n, line in enumerate(block.lines):
        stripped = line.strip()
        if stripped.startswith(prefix):
            expect.append(stripped[len(prefix):].strip())
            continue
        if expect:
            flush()
            first = block.line + n + 1
        code.append(line)
    flush()
    if "background" in kinds:
        if len(steps) != 1 or steps[0].expect:
            sys.exit(f"README.md:{block.line}: a background block shows no output")
        steps[0].background = True
    return steps


def rewrite(code: str, directives: list[tuple[str, str]]) -> str:
    for kind, arg in directives:
        if kind == "replace":
            if "=>" not in arg:
                sys.exit(f"readme: replace needs 'A => B', got {arg!r}")
            a, b = (s.strip() for s in arg.split("=>", 1))
            code = code.replace(a, os.path.expandvars(b))
    code = code.replace("cargo run --release --", "fastack")
    code = code.replace("./target/release/fastack", "fastack")
    code = re.sub(r"^cargo install .*$", ": cargo install (the binary under test is on PATH)", code, flags=re.M)
    return code


def pattern(expected: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(p) for p in expected.split("…")))


def matches(expect: list[str], output: str) -> str | None:
    """None when every expected line matches an output line, in order."""
    lines = [line.strip() for line in output.splitlines()]
    at = 0
    for e in expect:
        p = pattern(e)
        while at < len(lines) and not p.fullmatch(lines[at]):
            at += 1
        if at == len(lines):
            return e
        at += 1
    return None


PRELUDE = r"""
set -o pipefail
curl() { command curl --fail-with-body "$@"; }
ready() {
  for _ in $(seq 600); do
    command curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "readme: $1 did not answer within 60 s" >&2; return 1
}
eventually() {
  for _ in $(seq 100); do
    (eval "$1") >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "readme: not true within 10 s: $1" >&2; return 1
}
# The `fastack serve` process a job runs: the job itself, or its child (a
# backgrounded block is a subshell).
server_of() {
  local c
  for c in "$1" $(pgrep -P "$1"); do
    if tr '\0' ' ' < "/proc/$c/cmdline" 2>/dev/null | grep -q ' serve'; then echo "$c"; return 0; fi
  done
  return 1
}
stop_job() {
  local s
  s=$(server_of "$1") || return 1
  kill -TERM "$s" 2>/dev/null
  wait "$1" 2>/dev/null
  while kill -0 "$s" 2>/dev/null; do sleep 0.1; done
  return 0
}
stop_last() {
  local p
  for p in $(jobs -p | tac); do
    stop_job "$p" && return 0
  done
  echo "readme: no server to stop" >&2; return 1
}
stop_servers() {
  local p
  for p in $(jobs -p); do stop_job "$p" || true; done
  return 0
}
"""


class Session:
    """One bash process that keeps variables, the directory and jobs."""

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work = work
        self.scratch = Path(tempfile.mkdtemp(prefix="readme-steps-"))
        self.log = self.scratch / "background.log"
        self.n = 0
        self.mark: dict[Path, int] = {}
        self.last_out = self.scratch / "none.out"
        self.bash = subprocess.Popen(
            ["bash", "--norc", "--noprofile"],
            cwd=work,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        self.send(PRELUDE)

    def send(self, script: str) -> tuple[int, str]:
        self.n += 1
        f = self.scratch / f"step{self.n}.sh"
        # errexit for the step: a failing command ends the session, which
        # is reported as the step's failure.
        # The step's status is its last command's, even when that is an
        # `a && b` list (which errexit does not stop on).
        f.write_text("set -e\n" + script + "\n__readme_rc=$?\nset +e\nreturn $__readme_rc\n")
        out = self.scratch / f"step{self.n}.out"
        self.last_out = out
        rc = self.scratch / f"step{self.n}.rc"
        self.mark = self.sizes()
        # The status comes back through a file, not the session's stdout:
        # processes the step leaves running would hold a pipe open.
        assert self.bash.stdin
        self.bash.stdin.write(f". {f} > {out} 2>&1 < /dev/null; echo $? > {rc}.tmp; mv {rc}.tmp {rc}\n")
        self.bash.stdin.flush()
        deadline = time.monotonic() + STEP_TIMEOUT
        while not rc.exists():
            if self.bash.poll() is not None:
                # errexit ended the session: the step failed.
                return 255, self.output() if out.exists() else ""
            if time.monotonic() > deadline:
                raise TimeoutError(script)
            time.sleep(0.05)
        return int(rc.read_text().strip()), self.output()

    def sizes(self) -> dict[Path, int]:
        return {p: p.stat().st_size for p in self.scratch.glob("*.out")} | (
            {self.log: self.log.stat().st_size} if self.log.exists() else {}
        )

    def output(self) -> str:
        """The last step's output, and what processes started earlier
        (a receiver, a server) wrote meanwhile."""
        text = self.last_out.read_text(errors="replace")
        for p, size in self.mark.items():
            if p != self.last_out and p.exists():
                with p.open("rb") as f:
                    f.seek(size)
                    text += "\n" + f.read().decode(errors="replace")
        return text

    def background(self, script: str) -> None:
        self.n += 1
        f = self.scratch / f"step{self.n}.sh"
        f.write_text(script + "\n")
        self.send(f". {f} >> {self.log} 2>&1 < /dev/null &")

    def close(self) -> None:
        try:
            self.send("stop_servers; kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; true")
        except Exception:
            pass
        try:
            os.killpg(self.bash.pid, 15)
        except ProcessLookupError:
            pass
        self.bash.wait(timeout=30)


def code_for(step: Step) -> str:
    if step.lang == "sh":
        return step.code
    tag = f"__README_{step.lang.upper()}__"
    runner = "python3 -" if step.lang == "python" else "node --input-type=module -"
    return f"{runner} <<'{tag}'\n{step.code}\n{tag}"


def environment(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTACK_") or k == "FASTACK_BIN"}
    binary = Path(os.environ.get("FASTACK_BIN", REPO / "target/debug/fastack")).resolve()
    if not binary.is_file():
        sys.exit(f"FAIL: no fastack binary at {binary} (cargo build --bin fastack, or set FASTACK_BIN)")
    bindir = work / ".readme-bin"
    bindir.mkdir()
    wrapper = bindir / "fastack"
    wrapper.write_text(f'#!/bin/sh\nexec "{binary}" "$@"\n')
    wrapper.chmod(0o755)
    env["PATH"] = f"{bindir}:{env['PATH']}"
    env["README_PG_URL"] = os.environ.get("README_PG_URL", "")
    for var in ("README_PG_HOST", "README_PG_PORT", "README_PG_USER", "README_PG_NAME"):
        env[var] = os.environ.get(var, "")
    env["README_REDIS_URL"] = os.environ.get("FASTACK_TEST_REDIS_URL", "redis://127.0.0.1:6379")
    env["README_AMQP_URL"] = os.environ.get("FASTACK_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
    env["README_S3_ENDPOINT"] = os.environ.get("FASTACK_TEST_S3_ENDPOINT", "")
    # A Python with pyarrow, for the lake's reading example.
    env["README_PYTHON"] = os.environ.get("FASTACK_TEST_PYTHON", "python3")
    return env


def fresh_database() -> str:
    """A database name of its own on the test PostgreSQL, not created yet
    (the README creates it), with its URL and the server's host and user in
    the environment; an empty string when there is no server."""
    base = os.environ.get("FASTACK_TEST_PG_URL", "postgres://postgres@127.0.0.1:5432/test")
    r = subprocess.run(["psql", base, "-qtAc", "select 1"], capture_output=True, text=True)
    if r.returncode != 0:
        if os.environ.get("FASTACK_TEST_REQUIRE_SERVICES") == "1":
            sys.exit(f"FAIL: PostgreSQL is required: {r.stderr.strip()}")
        return ""
    name = f"t_readme_{uuid.uuid4().hex[:12]}"
    server = base.rsplit("/", 1)[0]
    authority = server.split("://", 1)[1]
    user, _, hostport = authority.rpartition("@")
    host, _, port = hostport.partition(":")
    os.environ["README_PG_HOST"] = host
    os.environ["README_PG_PORT"] = port or "5432"
    os.environ["README_PG_USER"] = user.split(":")[0] or "postgres"
    os.environ["README_PG_NAME"] = name
    return server + "/" + name


def main() -> int:
    readme = Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "README.md").resolve()
    plan = parse(readme.read_text())
    work = Path(tempfile.mkdtemp(prefix="fastack-readme-"))
    # The README runs from a checkout: what it names in the tree is there.
    for name in ("clients", "README.md"):
        (work / name).symlink_to(REPO / name)
    # What `pip install ./clients/python` leaves in the tree, if it was not there.
    leftovers = [p for p in (REPO / "clients/python/build", REPO / "clients/python/fastack.egg-info") if not p.exists()]
    pg = fresh_database()
    os.environ["README_PG_URL"] = pg
    env = environment(work)
    session = Session(work, env)
    ran = 0
    failed = False
    started = time.monotonic()
    try:
        for item in plan:
            if isinstance(item, tuple):
                _, cmd, line = item  # type: ignore[misc]
                status, output = session.send(cmd)
                if status != 0:
                    report(readme, line, cmd, status, output, session, "a readme: run command failed")
                    failed = True
                    break
                continue
            step = item
            if step.background:
                session.background(code_for(step))
                ran += 1
                continue
            began = time.monotonic()
            status, output = session.send(code_for(step))
            ran += 1
            first = next((c for c in step.code.splitlines() if c.strip()), "")
            print(f"{readme.name}:{step.line}: {step.lang} ({time.monotonic() - began:.1f} s) {first[:70]}", flush=True)
            if status != 0:
                report(readme, step.line, step.code, status, output, session, "a command failed")
                failed = True
                break
            missing = matches(step.expect, output)
            # Output of what the step started in the background (a receiver
            # printing a delivery) may come a moment later.
            until = time.monotonic() + 10
            while missing is not None and time.monotonic() < until:
                time.sleep(0.2)
                output = session.output()
                missing = matches(step.expect, output)
            if missing is not None:
                report(readme, step.line, step.code, status, output, session,
                       f"the output shows no line matching: {missing}")
                failed = True
                break
    except TimeoutError as e:
        print(f"FAIL: a step ran longer than {STEP_TIMEOUT} s:\n{e}", file=sys.stderr)
        print(session.log.read_text(errors="replace")[-4000:] if session.log.exists() else "", file=sys.stderr)
        failed = True
    finally:
        session.close()
        for p in leftovers:
            shutil.rmtree(p, ignore_errors=True)
        if pg:
            subprocess.run(["psql", pg.rsplit("/", 1)[0] + "/postgres", "-qc",
                            f"drop database if exists {pg.rsplit('/', 1)[1]} with (force)"],
                           capture_output=True)
    if not failed:
        failed = not leftovers_are_ignored_and_secrets_private(work)
    if failed:
        print(f"kept for inspection: {work} and {session.scratch}", file=sys.stderr)
        return 1
    print(f"README: {ran} examples ran, every shown output matched ({time.monotonic() - started:.0f} s)")
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(session.scratch, ignore_errors=True)
    return 0


# Files that hold a secret: readable by their owner only.
SECRETS = ("fastack-data/bootstrap-key", "try/tenant.key")
# Where a `readme: replace` sends what the README writes over a tracked file
# (`fastack openapi > openapi/openapi.json`): the reader's file is tracked.
REDIRECTED = {"openapi.json"}
# The harness's own (the binary under test on PATH as `fastack`).
HARNESS = {".readme-bin"}


def leftovers_are_ignored_and_secrets_private(work: Path) -> bool:
    """Whatever the examples left where they ran is covered by the
    checkout's .gitignore (a reader following them inside the checkout
    leaves nothing for `git status` to show), and secrets are mode 0600."""
    ok = True
    for entry in sorted(work.iterdir()):
        if entry.is_symlink() or entry.name in REDIRECTED | HARNESS:
            continue  # the checkout itself (clients/, README.md)
        name = entry.name + ("/" if entry.is_dir() else "")
        ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", "-q", name])
        if ignored.returncode != 0:
            print(f"FAIL: the examples leave `{name}`, which .gitignore does not cover", file=sys.stderr)
            ok = False
    for secret in SECRETS:
        path = work / secret
        if not path.exists():
            print(f"FAIL: the examples no longer write {secret}; update SECRETS in {__file__}", file=sys.stderr)
            ok = False
        elif path.stat().st_mode & 0o077:
            print(f"FAIL: {secret} is mode {path.stat().st_mode & 0o777:o}, not 0600", file=sys.stderr)
            ok = False
    return ok


def report(readme: Path, line: int, code: str, status: int, output: str, session: Session, why: str) -> None:
    print(f"FAIL: {readme.name}:{line}: {why} (exit status {status})", file=sys.stderr)
    print("---- step\n" + code + "\n---- its output\n" + output[-4000:], file=sys.stderr)
    if session.log.exists():
        print("---- background log (tail)\n" + session.log.read_text(errors="replace")[-3000:], file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
