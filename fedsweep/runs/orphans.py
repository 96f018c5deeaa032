"""No ``fedsweep run`` stays RUNNING in MLflow after its process is gone (docs/run.md, "Where runs go").

A live run carries who writes it (``fedsweep.pid``, ``fedsweep.host``, the process's start time,
so a reused pid is told apart) and a heartbeat (``fedsweep.heartbeat``, every
:data:`HEARTBEAT_S` seconds). A process killed with SIGKILL (or a machine that went down) cannot
close its run; every fedsweep command that opens the store (run, tune, report, ui, log) ends the
runs whose writer is gone: on this machine, its process no longer exists; on another, its
heartbeat is older than :data:`STALE_S`. Such a run ends KILLED, ``fedsweep.status`` interrupted,
with the last round it logged and, when its checkpoint folder holds a checkpoint, the command that
continues it (``fedsweep.continue_with``).
"""
from __future__ import annotations

import os
import shlex
import socket
import sys
import time
from pathlib import Path

HEARTBEAT_S = 60.0
#: A run written from another machine is taken as gone when its heartbeat is this old: ten missed
#: beats, never a live run's (a beat goes through the run's writer, which a failing store delays,
#: so a run whose store was down for longer is also ended here, and its `--resume` reopens it).
STALE_S = 10 * HEARTBEAT_S


def _started(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22), None where unknown."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()[19]


def writer_tags(checkpoint_dir: str | Path | None = None) -> dict[str, str]:
    """The tags naming this process as the run's writer (and where its checkpoints go)."""
    command = " ".join(shlex.quote(a) for a in ["fedsweep", *sys.argv[1:]]) if _from_cli() else ""
    return {"fedsweep.pid": str(os.getpid()), "fedsweep.host": socket.gethostname(),
            "fedsweep.pid_started": _started(os.getpid()) or "", "fedsweep.heartbeat": str(int(time.time())),
            **({"fedsweep.checkpoint_dir": str(Path(checkpoint_dir).resolve())} if checkpoint_dir else {}),
            **({"fedsweep.command": command} if command else {})}


def _from_cli() -> bool:
    return bool(sys.argv) and (Path(sys.argv[0]).name in ("fedsweep", "cli.py") or sys.argv[0].endswith("fedsweep.cli"))


def gone(tags: dict, now: float | None = None) -> str | None:
    """Why the run's writer is gone ('process 123 on this machine ended', ...), or None while it may live."""
    pid, host = tags.get("fedsweep.pid"), tags.get("fedsweep.host")
    if not pid or not host:
        return None
    if host == socket.gethostname():
        started = _started(int(pid))
        if started is None:
            return f"its process {pid} on this machine has ended"
        if tags.get("fedsweep.pid_started") and started != tags["fedsweep.pid_started"]:
            return f"its process {pid} on this machine has ended (the pid is another process's now)"
        return None
    beat = float(tags.get("fedsweep.heartbeat") or 0)
    age = (now or time.time()) - beat
    if beat and age > STALE_S:
        return f"its process {pid} on {host} has not written for {int(age // 60)} min"
    return None


def continue_with(tags: dict) -> str | None:
    """The command that continues the run from its checkpoint, if its folder holds one (this machine)."""
    from fedsweep.runs.checkpoints import LAST
    folder, command = tags.get("fedsweep.checkpoint_dir"), tags.get("fedsweep.command")
    if not folder or not (Path(folder) / LAST).is_file():
        return None
    words = shlex.split(command) if command else []
    kept, skip = [], False
    for w in words:   # the command as it was, but resuming from the newest checkpoint
        if skip:
            skip = False
            continue
        if w == "--resume":
            skip = True
            continue
        if not w.startswith("--resume="):
            kept.append(w)
    last = str(Path(folder) / LAST)
    return " ".join([*(shlex.quote(w) for w in kept), "--resume", shlex.quote(last)]) if kept else \
        f"fedsweep run CONFIG --checkpoint-dir {shlex.quote(folder)} --resume {shlex.quote(last)}"


def end_orphaned_runs(uri: str, say=None) -> list[str]:
    """End the RUNNING runs of every experiment of the store at ``uri`` whose writer is gone
    (module docstring); returns one line per run ended. Never fails the command that calls it: a
    store that cannot be read or written here is left as it is."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        return _end_orphans(uri, say)
    except Exception:  # noqa: BLE001 - a store that fails is said by the command's own use of it
        return []


def _end_orphans(uri: str, say) -> list[str]:
    from mlflow.entities import RunTag

    from fedsweep.runs.tracking import open_store, sqlite_path
    if uri.startswith("sqlite:///") and not sqlite_path(uri).is_file():
        return []
    client = open_store(uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    lines = []
    for i in range(0, len(ids), 100):
        for run in client.search_runs(ids[i:i + 100], filter_string="attributes.status = 'RUNNING'", max_results=50_000):
            why = gone(run.data.tags)
            if why is None:
                continue
            history = client.get_metric_history(run.info.run_id, "train/loss")
            last = max((m.step for m in history), default=0)
            resume = continue_with(run.data.tags)
            tags = {"fedsweep.status": "interrupted",
                    "fedsweep.error": f"{why} without ending this run (killed?), after round {last}",
                    **({"fedsweep.continue_with": resume} if resume else {})}
            client.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in tags.items()])
            client.set_terminated(run.info.run_id, status="KILLED")
            line = (f"[mlflow] run {run.info.run_name} ({run.info.run_id}) was left RUNNING: {why}; ended KILLED "
                    f"after round {last}" + (f"; continue it with: {resume}" if resume else ""))
            say(line)
            lines.append(line)
    return lines
