"""``fedsweep ui``: the MLflow UI on the store fedsweep writes to, at an address that opens the runs.

``mlflow ui`` alone needs the store spelled out, takes port 5000 whatever is on it, and a fresh
browser that opens an experiment from MLflow's list lands on its GenAI overview (MLflow 3.17 opens
the model-training view only when the address asks for it: ``workflowType=machine_learning``). This
starts ``mlflow ui`` on the store a sweep file (or ``run`` config, ``$MLFLOW_TRACKING_URI`` or
``./mlflow.db``) names, on a free port unless told one, waits until it answers, prints the addresses
that open each experiment's runs with the real port, and stops it, with every process it started,
on Ctrl-C.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fedsweep.config.schema import ConfigError

START_TIMEOUT_S = 120.0   # MLflow's import and its server's workers take 5-15 s on 2 busy cores


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port(host: str, port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise ConfigError(f"--port {port}: cannot listen on {host}:{port} ({e.strerror}); another program "
                              f"(another MLflow UI?) has it: leave --port out for a free one") from None


def target_store(target: str | None, uri: str | None,
                 experiment: str | None) -> tuple[str | None, str | None, str | None]:
    """The store, experiment and sweep named by ``fedsweep ui``'s arguments: ``--backend-store-uri`` and
    ``--experiment`` first, else a sweep file's (its ``mlflow:`` section, or its base's) or a run
    config's ``mlflow.tracking_uri`` and experiment."""
    if target is None:
        return uri, experiment, None
    path = Path(target)
    if not path.is_file():
        raise ConfigError(f"{target}: no such file; give a sweep file or run config (its MLflow store and "
                          f"experiment are opened), or leave it out for $MLFLOW_TRACKING_URI or ./mlflow.db")
    from fedsweep.config.registry import as_recorded
    from fedsweep.config.schema import load_yaml
    raw = load_yaml(path) or {}
    if isinstance(raw.get("base"), dict):   # a sweep file
        from fedsweep.sweep.spec import load_sweep
        with as_recorded():   # its plugins are not imported: the UI shows what the runs recorded
            sweep = load_sweep(path)
        return (uri or sweep.mlflow.tracking_uri or sweep.base.get("mlflow", {}).get("tracking_uri"),
                experiment or sweep.mlflow.experiment or sweep.name, sweep.name)
    from fedsweep.config.schema import build_config
    with as_recorded():
        cfg = build_config(raw, [])
    return uri or cfg.mlflow.tracking_uri, experiment or cfg.mlflow.experiment, None


def experiment_pages(uri: str, experiment: str | None, port: int, host: str,
                     sweep: str | None = None) -> list[tuple[str, str]]:
    """(what, address) for the named experiment, else every experiment that holds runs (newest
    first). For a sweep: first its saved views (a row per selected config, a row per tuning config:
    :mod:`fedsweep.reports.view`), then its parent run (the report), then every run."""
    from mlflow import MlflowClient

    from fedsweep.runs.tracking import ui_url
    client = MlflowClient(tracking_uri=uri)
    if experiment is not None:
        found = client.get_experiment_by_name(experiment)
        if found is None or found.lifecycle_stage != "active":
            names = sorted(e.name for e in client.search_experiments())
            shown = ", ".join(repr(n) for n in names[:20]) or "none"
            raise ConfigError(f"experiment {experiment!r}: not in the store {uri} ({'deleted' if found else 'no such'}"
                              f" experiment); it holds: {shown}")
        pages = []
        if sweep is not None:
            from fedsweep.reports.view import TAG_PREFIX, view_key, view_url
            if TAG_PREFIX + view_key(sweep) in found.tags:
                written = bool(client.search_runs([found.experiment_id], max_results=1, filter_string=(
                    f"tags.`fedsweep.role` = 'config' and tags.`fedsweep.sweep` = '{sweep}'")))
                later = "" if written else " (filled in by the sweep's report: `fedsweep report`, or tune's end)"
                pages.append((f"{sweep}: one row per selected config, its score, seeds and verdict{later}",
                              view_url(found.experiment_id, sweep, port, host)))
                pages.append((f"{sweep}: one row per tuning config, what selection ranks it by{later}",
                              view_url(found.experiment_id, sweep, port, host, "tuning")))
            parents = client.search_runs([found.experiment_id], max_results=1, order_by=["start_time DESC"],
                                         filter_string=f"tags.`fedsweep.role` = 'sweep' and tags.`fedsweep.sweep` = '{sweep}'")
            if parents:
                pages.append((f"{sweep}: the sweep's run, its report", ui_url(found.experiment_id, parents[0].info.run_id,
                                                                             port=port, host=host)))
        return pages + [(f"{found.name}: every run" if pages else found.name,
                         ui_url(found.experiment_id, port=port, host=host))]
    found = client.search_experiments(order_by=["last_update_time DESC"])
    with_runs = [e for e in found if client.search_runs([e.experiment_id], max_results=1)]
    return [(e.name, ui_url(e.experiment_id, port=port, host=host)) for e in with_runs]


def run_page(uri: str, run_id: str, port: int, host: str) -> tuple[str, str]:
    """(run name, address of its page)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from fedsweep.runs.tracking import ui_url
    try:
        run = MlflowClient(tracking_uri=uri).get_run(run_id)
    except MlflowException:
        raise ConfigError(f"--run {run_id}: no such run in the store {uri}") from None
    return f"run {run.info.run_name}", ui_url(run.info.experiment_id, run_id, port=port, host=host)


def serve(target: str | None = None, *, uri: str | None = None, experiment: str | None = None,
          run_id: str | None = None, port: int | None = None, host: str = "127.0.0.1", out=sys.stdout) -> int:
    """Start ``mlflow ui``, print where to open it, wait for Ctrl-C (or SIGTERM), stop it."""
    from fedsweep.runs.tracking import check_existing_store, quiet_store_logs
    uri, experiment, sweep = target_store(target, uri, experiment)
    key = "--backend-store-uri" if uri else None
    resolved = check_existing_store(uri, key=key)
    if resolved.split(":", 1)[0].lower() in ("http", "https"):   # the store is a server: its UI is there
        print(f"the store {resolved} is an MLflow server: its UI is that address; open it in a browser", file=out)
        return 0
    if not port:   # unset, or 0 (as a socket takes it: any free port)
        port = free_port(host)
    else:
        check_port(host, port)
    quiet_store_logs()
    from fedsweep.runs.orphans import end_orphaned_runs
    end_orphaned_runs(resolved)   # a killed run shown RUNNING for ever would mislead
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host   # an address a browser here opens
    pages = experiment_pages(resolved, experiment, port, shown, sweep)
    if run_id is not None:
        pages = [run_page(resolved, run_id, port, shown)] + pages
    cwd = Path(resolved[len("sqlite:///"):].split("?", 1)[0]).parent if resolved.startswith("sqlite:///") else None
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", resolved, "--host", host, "--port", str(port)]
    print(f"starting the MLflow UI on {resolved} (port {port}; ~15 s on 2 idle cores, longer on a busy "
          "machine) ...", file=out, flush=True)
    import tempfile
    log = tempfile.TemporaryFile(mode="w+")   # not a pipe: a UI that logs every request would fill it and stop
    server = subprocess.Popen(cmd, cwd=cwd, start_new_session=True, stdout=log, stderr=subprocess.STDOUT, text=True,
                              preexec_fn=_end_with_parent)

    def on_signal(signum, frame):   # SIGTERM (`kill PID`) ends it as Ctrl-C does
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        _wait_until_up(server, shown, port, log, out)
        home = f"http://{shown}:{port}/"
        if pages:
            for i, (name, url) in enumerate(pages[:10]):
                print(f"{'open:' if i == 0 else '     '}  {url}   ({name})", file=out)
            if len(pages) > 10:
                print(f"       ... and {len(pages) - 10} more experiments: {home}", file=out)
        else:
            print(f"open:  {home}   (the store holds no runs yet)", file=out)
        print("stop it with Ctrl-C", file=out, flush=True)
        while server.poll() is None:
            time.sleep(0.5)
        raise ConfigError(f"the MLflow UI stopped by itself (exit {server.returncode}): {_tail(log)}")
    except KeyboardInterrupt:
        print("stopping the MLflow UI ...", file=out, flush=True)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop(server)
        log.close()


def _end_with_parent() -> None:
    """In the UI's process, before MLflow starts: SIGTERM it when fedsweep ui dies, however it dies
    (a SIGKILL gives fedsweep no chance to stop the UI's own session; Linux's PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass   # not Linux: Ctrl-C and SIGTERM still stop it


def _wait_until_up(server: subprocess.Popen, host: str, port: int, log, out=sys.stdout) -> None:
    import urllib.request
    start = time.monotonic()
    deadline, said = start + START_TIMEOUT_S, 0
    while True:
        waited = int(time.monotonic() - start)
        if waited >= said + 15:   # a line every 15 s, so a slow start is not a silent one
            said = waited - waited % 15
            print(f"  still starting ({said} s; it gives up at {START_TIMEOUT_S:.0f} s)", file=out, flush=True)
        try:
            urllib.request.urlopen(f"http://{host}:{port}/health", timeout=2)
            return
        except OSError:
            if server.poll() is not None:
                raise ConfigError(f"the MLflow UI did not start (exit {server.returncode}): {_tail(log)}") from None
            if time.monotonic() > deadline:
                raise ConfigError(f"the MLflow UI did not answer on port {port} within {START_TIMEOUT_S:.0f} s") from None
            time.sleep(0.3)


def _tail(log) -> str:
    """The last line the UI wrote (its error, when it stopped)."""
    try:
        log.seek(0)
        lines = [line for line in log.read().strip().splitlines() if line.strip()]
    except (OSError, ValueError):
        lines = []
    return lines[-1][:300] if lines else "no message"


def _stop(server: subprocess.Popen) -> None:
    """The UI and every process it started (its own session: uvicorn's workers), by the group's id:
    SIGTERM, then SIGKILL for what is left after 10 s."""
    def group_alive() -> bool:
        try:
            os.killpg(server.pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    if group_alive():
        os.killpg(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if server.poll() is not None and not group_alive():
            return
        time.sleep(0.1)
    if group_alive():
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    server.wait()
