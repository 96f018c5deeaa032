"""A real `ray start --head` for tests: its own temp dir and session, stopped exactly (never
`ray stop`, which stops every Ray on the machine)."""
from __future__ import annotations

import os
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


def end_session(sid: int, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, to every process of session ``sid``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_processes(sid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.time() + grace
        while sig == signal.SIGTERM and session_processes(sid) and time.time() < end:
            time.sleep(0.2)


@contextmanager
def ray_head(home: Path, *, token: bool = False, num_cpus: int = 2, num_gpus: int = 0):
    """Start a head as a user whose HOME is ``home`` (with a token made by `ray get-auth-token
    --generate` if ``token``); yields its address."""
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
    proc = subprocess.Popen([ray_bin, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port),
                             "--num-cpus", str(num_cpus), "--num-gpus", str(num_gpus), "--include-dashboard",
                             "false", "--disable-usage-stats", "--temp-dir", temp],
                            env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            pytest.skip(f"Ray cannot start a head node here: {out.strip().splitlines()[-1:]}")
        yield f"127.0.0.1:{port}"
    finally:
        end_session(proc.pid)                          # the head's session: gcs, raylet, agents, workers
        shutil.rmtree(temp, ignore_errors=True)


@contextmanager
def ray_node(home: Path, address: str, *, num_cpus: int = 1, num_gpus: int = 0):
    """A second node joining the head at ``address`` (on this machine, in a temp dir and process
    session of its own), ended on the way out."""
    ray_bin = shutil.which("ray", path=os.path.dirname(sys.executable))
    temp = tempfile.mkdtemp(prefix="fsnode-")
    proc = subprocess.Popen([ray_bin, "start", "--address", address, "--node-ip-address", "127.0.0.1",
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
