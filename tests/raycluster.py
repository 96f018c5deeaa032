"""A real `ray start --head` for tests: its own temp dir and session, stopped exactly (never
`ray stop`, which stops every Ray on the machine)."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def user_env(home: Path, **extra) -> dict:
    """The environment of a user whose HOME is ``home`` and who exported no Ray auth variable."""
    env = {k: v for k, v in os.environ.items() if k not in AUTH_VARS}
    return {**env, "HOME": str(home), "PYTHONUNBUFFERED": "1", **extra}


def session_processes(sid: int) -> list[int]:
    """Live processes of session ``sid`` (Ray's workers make their own process groups, not sessions)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z" and int(fields[3]) == sid:
                found.append(int(entry.name))
    return found


def end_session(sid: int, grace: float = 5.0, signals=(signal.SIGTERM, signal.SIGKILL)) -> None:
    """SIGTERM, then SIGKILL, to every process of session ``sid``."""
    for sig in signals:
        for pid in session_processes(sid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.time() + grace
        while sig == signal.SIGTERM and session_processes(sid) and time.time() < end:
            time.sleep(0.2)


def interrupt(proc: subprocess.Popen, timeout: float, *, group: bool = True) -> None:
    """Ctrl-C to a process we started (to its process group with ``group``) and wait for it; if it has
    not ended within ``timeout`` s, SIGKILL its group. Nothing if it has ended already."""
    if proc.poll() is not None:
        return
    if group:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextmanager
def ray_head(home: Path, *, token: bool = False, num_cpus: int = 2, num_gpus: int = 0, ip: str = "127.0.0.1",
             system_config: dict | None = None):
    """Start a head as a user whose HOME is ``home`` (with a token made by `ray get-auth-token
    --generate` if ``token``) on address ``ip``; yields its address. ``system_config``: Ray's
    internal settings (e.g. how soon a silent node is declared dead)."""
    ray_bin = shutil.which("ray", path=os.path.dirname(sys.executable))
    if ray_bin is None:
        pytest.skip("the `ray` command is not installed beside this Python")
    env = user_env(home)
    if token:
        subprocess.run([ray_bin, "get-auth-token", "--generate"], env=env, check=True, capture_output=True,
                       timeout=60)
        assert (home / ".ray" / "auth_token").is_file()
    temp = tempfile.mkdtemp(prefix="fsray-")          # short: Ray's socket paths live under it
    port = free_port()
    extra = ["--system-config", json.dumps(system_config)] if system_config else []
    proc = subprocess.Popen([ray_bin, "start", "--head", "--node-ip-address", ip, "--port", str(port),
                             "--num-cpus", str(num_cpus), "--num-gpus", str(num_gpus), "--include-dashboard",
                             "false", "--disable-usage-stats", "--temp-dir", temp, *extra],
                            env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            pytest.skip(f"Ray cannot start a head node here: {out.strip().splitlines()[-1:]}")
        yield f"{ip}:{port}"
    finally:
        end_session(proc.pid)                          # the head's session: gcs, raylet, agents, workers
        shutil.rmtree(temp, ignore_errors=True)


@contextmanager
def ray_node(home: Path, address: str, *, num_cpus: int = 1, num_gpus: int = 0, ip: str = "127.0.0.1"):
    """A second node joining the head at ``address`` (on this machine, in a temp dir and process
    session of its own), ended on the way out."""
    ray_bin = shutil.which("ray", path=os.path.dirname(sys.executable))
    temp = tempfile.mkdtemp(prefix="fsnode-")
    proc = subprocess.Popen([ray_bin, "start", "--address", address, "--node-ip-address", ip,
                             "--num-cpus", str(num_cpus), "--num-gpus", str(num_gpus), "--disable-usage-stats",
                             "--temp-dir", temp],
                            env=user_env(home), start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out[-2000:]
        yield
    finally:
        end_session(proc.pid)
        shutil.rmtree(temp, ignore_errors=True)


def can_hide_folders() -> str | None:
    """Why a node cannot be given a disk of its own here (None if it can): that takes a mount
    namespace (root, `unshare`) and loopback addresses beyond 127.0.0.1 (Linux routes 127/8 to lo)."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return "needs Linux's `unshare`"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tmpfs /mnt"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a mount namespace here: {probe.stderr.strip()[:200]}"
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.3", 0))
    except OSError as e:
        return f"cannot use the loopback address 127.0.0.3: {e}"
    return None


class Node:
    """A Ray node of its own: its processes in one session (``sid``), ended by ``kill``."""

    def __init__(self, sid: int, temp: str):
        self.sid, self.temp = sid, temp

    def raylet(self) -> int:
        """The pid of the node's raylet (its view of the file system is ``/proc/<pid>/root``)."""
        return next(pid for pid in session_processes(self.sid)
                    if "raylet" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode())

    def kill(self) -> None:
        """The machine is gone: every process of the node at once, with SIGKILL."""
        end_session(self.sid, grace=0.0, signals=(signal.SIGKILL,))


@contextmanager
def ray_node_without(hidden: list[Path], home: Path, address: str, *, ip: str, num_cpus: int = 2):
    """A node at ``ip`` that joins the head at ``address`` from a mount namespace of its own in which
    each folder of ``hidden`` is an empty tmpfs: another machine, whose disk does not hold what the
    driver wrote there (the rest of the file system it shares, as a network mount would). Yields a
    :class:`Node`; every process of it is ended on the way out."""
    ray_bin = shutil.which("ray", path=os.path.dirname(sys.executable))
    temp = tempfile.mkdtemp(prefix="fsnode-")
    mounts = " && ".join(f"mount -t tmpfs tmpfs {shlex.quote(str(h))}" for h in hidden)
    start = " ".join(shlex.quote(a) for a in [ray_bin, "start", "--address", address, "--node-ip-address", ip,
                                              "--num-cpus", str(num_cpus), "--disable-usage-stats",
                                              "--temp-dir", temp, "--block"])
    with open(Path(temp) / "node.log", "w") as log:
        proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                 f"{mounts} && exec {start}"],
                                env=user_env(home), start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    node = Node(proc.pid, temp)
    try:
        started = time.time()
        while "Ray runtime started" not in (Path(temp) / "node.log").read_text():
            assert proc.poll() is None and time.time() - started < 120, (Path(temp) / "node.log").read_text()[-2000:]
            time.sleep(0.2)
        yield node
    finally:
        node.kill()
        proc.wait()
        shutil.rmtree(temp, ignore_errors=True)
