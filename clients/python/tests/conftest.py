"""Test harness: every test gets its own real `fastack serve` (embedded
SQLite) in a temp dir on a free port. The binary is FASTACK_BIN, default
<repo>/target/debug/fastack; a missing binary fails the run (never skips)."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

HERE = Path(__file__).resolve().parents[1]  # clients/python
REPO = Path(__file__).resolve().parents[3]
BIN = Path(os.environ.get("FASTACK_BIN") or REPO / "target" / "debug" / "fastack")


def pytest_configure(config: pytest.Config) -> None:
    if not (BIN.is_file() and os.access(BIN, os.X_OK)):
        raise pytest.UsageError(
            f"fastack server binary not found or not executable: {BIN}\n"
            "Build it (cargo build) or point FASTACK_BIN at it. The SDK tests run against the real server."
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env() -> dict[str, str]:
    # fastack refuses unknown FASTACK_* settings, and FASTACK_BIN (ours) is one:
    # the server and the CLI get the environment without any FASTACK_* variable.
    return {k: v for k, v in os.environ.items() if not k.startswith("FASTACK_")}


def python_env(**extra: str) -> dict[str, str]:
    """The environment of a Python child process that imports this source tree."""
    return {**os.environ, "PYTHONPATH": str(HERE), **extra}


class Server:
    """One `fastack serve` on a data dir; start/kill/restart keep dir and port."""

    def __init__(self, data_dir: Path, port: int = 0, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = port
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self._log_offset = 0

    @property
    def env(self) -> dict[str, str]:
        return {
            **base_env(),
            "FASTACK_DATA_DIR": str(self.data_dir),
            "FASTACK_LOG": "info",
            "FASTACK_POLL_INTERVAL_MS": "200",
            **self.extra_env,
        }

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def bootstrap_key(self) -> str:
        return (self.data_dir / "bootstrap-key").read_text().strip()

    def start(self, timeout: float = 30.0) -> Server:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        env = {**self.env, "FASTACK_LISTEN": f"127.0.0.1:{self.port}"}
        log = open(self.log_path, "ab")  # a file, never a pipe that could fill up
        self._log_offset = log.tell()
        try:
            self.proc = subprocess.Popen([str(BIN), "serve"], env=env, stdout=log, stderr=log)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fastack serve exited ({self.proc.returncode}):\n{self.log_tail()}")
            m = re.search(r"fastack listening addr=127\.0\.0\.1:(\d+)", self.log_text())
            if m:
                self.port = int(m.group(1))
                if self.ready():
                    return self
            time.sleep(0.05)
        raise RuntimeError(f"fastack serve did not become ready:\n{self.log_tail()}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def log_text(self) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            return f.read().decode("utf-8", "replace")

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def cli(self, *args: str, env: dict[str, str] | None = None) -> str:
        out = subprocess.run(
            [str(BIN), *args],
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode != 0:
            raise RuntimeError(f"fastack {' '.join(args)} failed ({out.returncode}): {out.stderr}")
        return out.stdout

    def admin(self, *args: str, env: dict[str, str] | None = None) -> Any:
        return json.loads(self.cli("admin", "--json", *args, env=env))


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def make(port: int = 0, env: dict[str, str] | None = None, name: str = "data") -> Server:
        s = Server(tmp_path / name, port=port, env=env)
        servers.append(s)
        return s.start()

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def server(server_factory: Callable[..., Server]) -> Server:
    return server_factory()


@pytest.fixture
def api_key(server: Server) -> str:
    return server.bootstrap_key


# --- helpers -------------------------------------------------------------------

WINDOW_FROM = "2000-01-01T00:00:00Z"


def recent(hours: float = 1) -> str:
    """A fixed-width timestamp `hours` before now, in whole seconds: inside
    `window()` and the server's retention whatever the date (a literal date
    drifts out of both as the calendar moves on)."""
    at = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=hours)
    return at.strftime("%Y-%m-%dT%H:%M:%S+00:00")


def window() -> tuple[str, str]:
    """A read window covering every event a test sends (occurred_at ≈ now)."""
    to = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    frm = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return frm, to


def wait_for(
    predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.2, what: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what or predicate}: last={last!r}")


def sent_body(request: httpx.Request) -> bytes:
    """A request's JSON bytes as the tracker serialised them (inflated when
    it went gzip-compressed)."""
    if request.headers.get("content-encoding") == "gzip":
        return gzip.decompress(request.content)
    return request.content
