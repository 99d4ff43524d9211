"""The Tracker's on-disk spool (standard library only).

A spool is a directory of files, each holding items the Tracker could not
deliver before its deadline, one item per line: the JSON object sent in a
batch (`{"type":"track",...,"idempotency_key":"..."}`), byte for byte as it
was queued. Because every item keeps its idempotency key, sending a spooled
item the server already stored is answered `duplicate: true`: exactly once.

Files (the TypeScript SDK reads and writes the same format):

- `<time_ns>-<pid>-<random>.jsonl`: ready to be sent, oldest first by name.
  Written to `.<name>.tmp` (mode 0600), flushed to disk, then renamed: a
  reader never sees half a file.
- `<name>.claimed-<pid>-<random>`: taken by a tracker of process `pid`. A
  tracker claims a file by renaming it; of two trackers (or processes)
  renaming the same file, exactly one succeeds, so no item is sent by two
  trackers at once. A claimed file is removed only after everything in it
  was delivered, refused by the server item by item, or written to a new
  ready file; a claim whose process is gone (it crashed) is renamed back
  when a tracker next starts on the directory.

The processes sharing a spool directory must see each other's process ids
(one host, one pid namespace).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

__all__ = ["Spool", "SpoolItems"]

log = logging.getLogger("fastack")

_READY = re.compile(r"^\d{20}-\d+-[0-9a-f]+\.jsonl$")
_CLAIMED = re.compile(r"^(\d{20}-\d+-[0-9a-f]+\.jsonl)\.claimed-(\d+)-[0-9a-f]+$")
_TEMP = re.compile(r"^\.\d{20}-(\d+)-[0-9a-f]+\.jsonl\.tmp$")


class SpoolItems:
    """What a tracker took from the spool: the claimed files and their items."""

    def __init__(self) -> None:
        self.files: list[Path] = []
        self.items: list[bytes] = []
        self.parsed: list[dict[str, Any]] = []


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    return True


class Spool:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._token = secrets.token_hex(4)

    def _fsync_dir(self) -> None:
        try:
            fd = os.open(self.dir, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def write(self, items: list[bytes]) -> Path:
        """Writes `items` as one new ready file, atomically (temp file,
        fsync, rename); returns its path. Raises OSError."""
        name = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(4)}.jsonl"
        temp = self.dir / f".{name}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                for item in items:
                    f.write(item)
                    f.write(b"\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(temp, 0o600)  # whatever the umask
            path = self.dir / name
            os.rename(temp, path)
        except BaseException:
            try:
                os.unlink(temp)
            except OSError:
                pass
            raise
        self._fsync_dir()
        return path

    def recover(self) -> None:
        """Gives back the claims of processes that are gone, and removes
        their half-written temp files."""
        try:
            names = os.listdir(self.dir)
        except OSError as exc:
            log.warning("fastack tracker: cannot list the spool %s: %s", self.dir, exc)
            return
        for name in names:
            m = _CLAIMED.match(name)
            if m and not _alive(int(m.group(2))):
                try:
                    os.rename(self.dir / name, self.dir / m.group(1))
                    log.info("fastack tracker: spool file %s given back (its process %s is gone)", m.group(1), m.group(2))
                except OSError:
                    pass  # another tracker took it back first
                continue
            t = _TEMP.match(name)
            if t and not _alive(int(t.group(1))):
                try:
                    os.unlink(self.dir / name)
                except OSError:
                    pass

    def claim(self, most: int) -> SpoolItems:
        """Claims ready files, oldest first, until at least `most` items are
        held (a file is taken whole), and reads them."""
        taken = SpoolItems()
        self.recover()
        try:
            names = sorted(n for n in os.listdir(self.dir) if _READY.match(n))
        except OSError as exc:
            log.warning("fastack tracker: cannot list the spool %s: %s", self.dir, exc)
            return taken
        for name in names:
            if len(taken.items) >= most:
                break
            claimed = self.dir / f"{name}.claimed-{os.getpid()}-{self._token}"
            try:
                os.rename(self.dir / name, claimed)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    log.warning("fastack tracker: cannot claim spool file %s: %s", name, exc)
                continue  # another tracker claimed it
            try:
                data = claimed.read_bytes()
            except OSError as exc:
                log.warning("fastack tracker: cannot read spool file %s: %s", claimed, exc)
                self.release([claimed])
                continue
            bad = 0
            for line in data.split(b"\n"):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    obj = None
                if not isinstance(obj, dict) or obj.get("type") not in ("track", "identify"):
                    bad += 1
                    continue
                taken.items.append(line)
                taken.parsed.append(obj)
            if bad:
                log.warning("fastack tracker: spool file %s: %d line(s) that are not items skipped", name, bad)
            taken.files.append(claimed)
        return taken

    def release(self, files: list[Path]) -> None:
        """Gives claimed files back (renamed to their ready name): their
        items were not written anywhere else."""
        for path in files:
            m = _CLAIMED.match(path.name)
            if m is None:
                continue
            try:
                os.rename(path, path.with_name(m.group(1)))
            except OSError as exc:
                log.error("fastack tracker: cannot give back spool file %s: %s", path, exc)

    def remove(self, files: list[Path]) -> None:
        """Removes claimed files whose items are delivered, refused or
        written to another file."""
        for path in files:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.error("fastack tracker: cannot remove spool file %s: %s", path, exc)
        if files:
            self._fsync_dir()
