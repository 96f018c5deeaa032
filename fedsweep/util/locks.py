"""One driver per sweep, one writer creating a store: advisory file locks (``flock``).

The kernel drops an ``flock`` when its holder exits, by SIGKILL too, so a lock that can be taken
while its file still names another driver was left by a driver that died: that is how a stale lock
is told from a live one, with no PID guessing. Linux and macOS; on file systems without ``flock``
(some network mounts) the locks are skipped.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import sys
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from fedsweep.util.errors import ConfigError


class SweepLock:
    """``<storage>/<sweep>.lock``, held while a ``fedsweep tune`` of that sweep runs.

    Its text is the holder's record (pid, host, start time, its process group and Ray session),
    so a second driver can say who runs the sweep, and one that takes over a stale lock can end
    what the dead driver's local Ray instance left running (:func:`end_leftovers`)."""

    def __init__(self, path: Path, sweep: str, busy: str | None = None):
        self.path, self.sweep, self.fd = Path(path), sweep, None
        self.busy = busy or f"sweep {sweep!r} is already running"

    def acquire(self) -> dict:
        """Take the lock or raise ConfigError naming the running driver; returns the record a dead
        driver left (empty if the last one ended cleanly)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return {}                              # no flock here: run unlocked
            held = _read_record(self.path)
            since = held.get("since", "an unknown time")
            raise ConfigError(f"{self.busy} since {since}, pid {held.get('pid', '?')} "
                              f"on {held.get('host', '?')} (lock {self.path}); wait for it, or stop it first") from None
        self.fd = fd
        stale = _read_record(self.path)
        self.write()
        return stale

    def write(self, **extra) -> None:
        record = {"pid": os.getpid(), "pgid": os.getpgid(0), "host": socket.gethostname(),
                  "since": datetime.now().isoformat(timespec="seconds"), **extra}
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, json.dumps(record).encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)                   # an empty lock file: the last driver ended cleanly
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def _read_record(path: Path) -> dict:
    try:
        text = path.read_text().strip()
        return json.loads(text) if text else {}
    except (OSError, ValueError):
        return {}


#: How long a wait on a store folder's lock may last (a holder creates a store's schema in ~2 s), and
#: how long when its holder is stopped (Ctrl-Z, SIGSTOP): it will not let go until it is continued.
STORE_LOCK_TIMEOUT_S = 60.0
STOPPED_HOLDER_TIMEOUT_S = 10.0
#: After this long, a wait says what it waits for.
SAY_AFTER_S = 2.0


@contextmanager
def store_lock(directory: Path, say=None):
    """Serialise MLflow store creation: two processes creating one fresh sqlite store race in its
    schema migration. Held on the store's folder itself, so no extra file is left beside it.

    A wait is never silent or endless: after SAY_AFTER_S it says (``say``, default stderr) which
    process holds the lock, and it gives up with a ConfigError naming that process and the fix after
    STORE_LOCK_TIMEOUT_S, or STOPPED_HOLDER_TIMEOUT_S when the holder is stopped (Ctrl-Z)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        _wait_for_flock(fd, Path(directory), say)
        yield
    finally:
        os.close(fd)


def _wait_for_flock(fd: int, directory: Path, say) -> None:
    start, said = time.monotonic(), False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return                                 # no flock on this file system
        waited = time.monotonic() - start
        if waited < SAY_AFTER_S:   # a store being created holds it ~2 s: wait before asking who
            time.sleep(0.2)
            continue
        holders = lock_holders(directory)
        who = "; ".join(f"pid {pid} ({cmd[:120] or '?'}{', stopped' if state == 'T' else ''})"
                        for pid, cmd, state in holders) or "another process"
        stopped = bool(holders) and all(state == "T" for _, _, state in holders)
        if not said:
            said = True
            line = f"waiting for the MLflow store folder's lock ({directory}), held by {who} ..."
            (say or (lambda m: print(m, file=sys.stderr, flush=True)))(line)
        if waited >= (STOPPED_HOLDER_TIMEOUT_S if stopped else STORE_LOCK_TIMEOUT_S):
            fix = (f"it is stopped (Ctrl-Z or SIGSTOP): continue it (`fg` in its shell, or kill -CONT "
                   f"{holders[0][0]}) or end it, then run this again" if stopped else
                   "it holds the store for longer than creating one takes: let it finish or end it, then run this again")
            raise ConfigError(f"the MLflow store folder {directory} is locked by {who} for {waited:.0f} s; {fix}")
        time.sleep(0.2)


def lock_holders(path: Path) -> list[tuple[int, str, str]]:
    """(pid, command line, state letter: ``T`` stopped) of each process holding an ``flock`` on
    ``path`` (Linux's /proc/locks: its device and inode); [] where that cannot be read."""
    try:
        st = os.stat(path)
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    out = []
    for line in lines:
        fields = line.split()
        if "FLOCK" in fields and "->" not in fields and key in fields:
            pid = int(fields[fields.index(key) - 1])
            seen = _process(pid)
            if pid != os.getpid():
                out.append((pid, " ".join(seen[1].split()), seen[0][0]) if seen else (pid, "", "?"))
    return out


# ---------------------------------------------------------------------------------------------
# What a SIGKILLed driver's local Ray instance leaves behind
# ---------------------------------------------------------------------------------------------

def _process(pid: int | str) -> tuple[list[str], str] | None:
    """(the fields of /proc/<pid>/stat after "pid (comm) ": state, ppid, pgrp, ...; its command line),
    or None where the process is gone or cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split(), cmd


def _processes():
    """(pid, parent pid, process group, command line) of every live process we can see (Linux
    /proc); zombies, which only wait to be reaped, are left out."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        seen = _process(entry.name)
        if seen is not None and seen[0][0] != "Z":
            fields, cmd = seen
            yield int(entry.name), int(fields[1]), int(fields[2]), cmd


def leftovers(record: dict) -> list[int]:
    """The processes a dead driver's local Ray instance left: Ray processes (``ray::`` agents and
    workers, or ones naming its Ray session) in the driver's process group that are orphans, i.e.
    whose chain of parents leaves the group without passing a live non-Ray process (a running
    driver in the same group keeps its own). A cluster reached with ``--address`` never matches:
    its processes are not in the driver's group."""
    pgid, session = record.get("pgid"), record.get("ray_session")
    if not os.path.isdir("/proc") or pgid is None or record.get("host") != socket.gethostname():
        return []
    group = {pid: (ppid, cmd) for pid, ppid, g, cmd in _processes() if g == pgid and pid != os.getpid()}
    ray_like = {pid for pid, (_, cmd) in group.items()
                if cmd.startswith("ray::") or (session and session in cmd) or "/site-packages/ray/" in cmd}

    def orphaned(pid: int) -> bool:
        parent = group[pid][0]
        while parent in group:
            if parent not in ray_like:
                return False                          # under a live driver (or another process of the group)
            parent = group[parent][0]
        return parent != os.getpid()

    return sorted(pid for pid in ray_like if orphaned(pid))


def end_leftovers(record: dict, grace: float = 3.0) -> list[int]:
    """SIGTERM, then SIGKILL after ``grace`` seconds, to :func:`leftovers`; returns their pids once
    they are gone (a SIGKILLed process takes a moment to exit; the new sweep's Ray must not start
    beside it)."""
    pids = leftovers(record)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.time() + grace
        while time.time() < end and set(pids) & {p for p, *_ in _processes()}:
            time.sleep(0.05 if sig == signal.SIGKILL else 0.2)
    return pids
