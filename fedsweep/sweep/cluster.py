"""Ray for a sweep: a local instance, or an existing cluster reached with ``--address``.

Token authentication (Ray 2.60, as measured in docs/design.md §7): ``ray start --head`` turns it
on when it finds a token (``$RAY_AUTH_TOKEN``, the file ``$RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``)
and off when it finds none. A driver must be in the same mode: one in token mode without a token
dies in a native check that ends the whole process, and one in the wrong mode retries for 20 s and
then fails with a bare ``ConnectionError``. So before ``ray.init`` fedsweep

1. picks the mode as ``ray start`` does, on this machine: the user's ``RAY_AUTH_MODE`` if set,
   else ``token`` when a token is found, else ``disabled``;
2. asks the head once (a 3 s gRPC call) whether it accepts that: a mismatch is one line that says
   which variable or file to set, before anything is written.

The environment is put back as it was when the sweep ends, so a Python process that runs several
sweeps (or tests) does not carry one cluster's mode into the next.
"""
from __future__ import annotations

import math
import os
import re
import shutil
import signal
import socket
import sys
from contextlib import contextmanager
from pathlib import Path

from fedsweep.util.errors import ConfigError

AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def default_token_path() -> Path:
    return Path.home() / ".ray" / "auth_token"


def find_token() -> tuple[str | None, str]:
    """(token, where it came from) as Ray looks for it; (None, the places looked) if there is none."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip(), "$RAY_AUTH_TOKEN"
    where = os.environ.get("RAY_AUTH_TOKEN_PATH")
    path = Path(where).expanduser() if where else default_token_path()
    label = f"$RAY_AUTH_TOKEN_PATH ({path})" if where else str(path)
    try:
        token = path.read_text().strip()
    except OSError:
        token = ""
    if token:
        return token, label
    return None, f"$RAY_AUTH_TOKEN, {label}"


def auth_mode() -> tuple[str, str | None, str]:
    """(mode, token, where the token came from) for connecting to an existing cluster."""
    token, where = find_token()
    mode = os.environ.get("RAY_AUTH_MODE", "").strip().lower() or ("token" if token else "disabled")
    if mode not in ("token", "disabled"):
        raise ConfigError(f"RAY_AUTH_MODE: {os.environ['RAY_AUTH_MODE']!r} is not allowed; allowed: token, disabled")
    if mode == "token" and token is None:
        raise ConfigError(f"RAY_AUTH_MODE=token but no Ray token found (looked in {where}); run `ray get-auth-token` "
                          "on the head node and set RAY_AUTH_TOKEN, or write it to ~/.ray/auth_token")
    return mode, token, where


def check_reachable(address: str, timeout: float = 3.0) -> tuple[str, int]:
    """Fail in seconds, in one line, where Ray itself would retry a dead address for minutes."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address}: expected HOST:PORT, e.g. 127.0.0.1:6379")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConfigError(f"--address {address}: no Ray head answers there ({e.strerror or e}); start one "
                          f"with `ray start --head --port {port}`") from None
    return host, int(port)


def _head_accepts(address: str, metadata: list, timeout: float = 3.0) -> bool:
    """One gRPC call to the head's GCS (GetClusterId, empty request) with ``metadata``: True if
    answered, False if refused as unauthenticated; a ConfigError if the head does not answer."""
    import grpc
    host, port = check_reachable(address)
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId")   # bytes in, bytes out
        try:
            call(b"", timeout=timeout, metadata=metadata)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAUTHENTICATED:
                raise ConfigError(f"--address {address}: the Ray head does not answer ({e.code().name}: "
                                  f"{e.details()})") from None
            return False
    return True


def check_auth(address: str, mode: str, token: str | None, where: str, timeout: float = 3.0) -> None:
    """The head accepts the credentials ray.init would send in ``mode``; if not, a one-line error
    that says what to set."""
    metadata = [("authorization", f"Bearer {token}")] if mode == "token" else []
    if _head_accepts(address, metadata, timeout):
        return
    if mode == "token":
        raise ConfigError(f"--address {address}: the Ray cluster rejected the token from {where}; set "
                          "RAY_AUTH_TOKEN to the head's token (`ray get-auth-token` on the head)")
    raise ConfigError(f"--address {address}: the Ray cluster requires token authentication and no token "
                      f"was found ({where}); set RAY_AUTH_TOKEN to the head's token (`ray get-auth-token` "
                      "on the head) or copy it to ~/.ray/auth_token")


def check_cluster(address: str) -> str:
    """The auth mode to reach the head at ``address`` with, once the head has accepted it (one line
    saying what to set otherwise). A head that runs without token authentication is joined without
    it, even where a token is found here (a local ``ray.init`` writes ~/.ray/auth_token): a driver in
    token mode demands the token of every Ray process that calls it, those of such a cluster send
    none, and every trial ended with "The actor never ran - it was cancelled before it started running"."""
    mode, token, where = auth_mode()
    if mode == "token" and _head_accepts(address, []):
        if os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "token":
            raise ConfigError(f"--address {address}: RAY_AUTH_MODE=token, but the Ray head there runs without "
                              "token authentication; unset RAY_AUTH_MODE")
        return "disabled"
    check_auth(address, mode, token, where)
    return mode


# Free space a local Ray instance needs for its logs and sockets: ~5 MB for a sweep of sweeps/fedlga.yaml
# (remove_session), more for long sweeps' logs. On a full disk its raylet fails to start and
# ray.init times out after 30 s with a traceback that does not say why.
RAY_MIN_FREE_MB = 50


def ray_temp_dir() -> tuple[Path, str | None]:
    """(the folder a local Ray instance keeps its logs and sockets in, the variable that chose it):
    Ray 2.60's rule (``ray._common.utils.get_default_ray_temp_dir``): ``$RAY_TMPDIR``, else on Linux
    ``$TMPDIR``, else /tmp (another system's temporary folder on Windows), then ``ray`` inside."""
    if "RAY_TMPDIR" in os.environ:
        return Path(os.environ["RAY_TMPDIR"], "ray"), "RAY_TMPDIR"
    if sys.platform.startswith("linux") and "TMPDIR" in os.environ:
        return Path(os.environ["TMPDIR"], "ray"), "TMPDIR"
    import tempfile
    return Path("/tmp" if sys.platform.startswith(("linux", "darwin")) else tempfile.gettempdir(), "ray"), None


def check_local_ray() -> None:
    """What a local Ray instance writes outside the sweep's own folders can be written, checked before
    anything is: ``ray.init`` otherwise fails with a traceback (measured with Ray 2.60 and a read-only
    HOME, a file where its temporary folder goes, a full disk there). It writes two places:

    - its logs and sockets under :func:`ray_temp_dir` (/tmp/ray);
    - a new token at ~/.ray/auth_token where token authentication is on (``RAY_AUTH_MODE`` unset or
      ``token``) and no token is found (:func:`find_token`); nothing under HOME otherwise.
    """
    if _ray_joined():
        return   # the sweep runs on the Ray this process runs already (ray_session), and starts none
    _check_ray_temp_dir()
    mode = os.environ.get("RAY_AUTH_MODE")
    if (mode is None or mode.lower() == "token") and find_token()[0] is None:
        _check_token_folder()


def _check_ray_temp_dir() -> None:
    from fedsweep.runs.paths import _dir_problem
    folder, var = ray_temp_dir()
    folder = Path(os.path.abspath(folder))
    where = f"{var} {os.environ[var]}" if var else f"Ray's temporary folder {folder}"
    problem = _dir_problem(folder)
    if problem:
        raise ConfigError(f"{where}: a local Ray instance keeps its logs and sockets in {folder}, but "
                          f"{problem}; set RAY_TMPDIR to a writable folder (Ray uses RAY_TMPDIR/ray)")
    free = _free_mb(folder)
    if free < RAY_MIN_FREE_MB:
        raise ConfigError(f"{where}: a local Ray instance keeps its logs and sockets in {folder}, but its disk "
                          f"has {free:.1f} MB free (at least {RAY_MIN_FREE_MB} MB needed); free space there, or set "
                          "RAY_TMPDIR to a folder on another disk")


def _check_token_folder() -> None:
    from fedsweep.runs.paths import _dir_problem
    token = default_token_path()
    problem = _dir_problem(token.parent)
    if problem:
        raise ConfigError(f"HOME {Path.home()}: a local Ray instance writes a new token to {token}, but {problem}; "
                          "set HOME to a writable folder, or RAY_AUTH_TOKEN to a token of your own "
                          "(e.g. export RAY_AUTH_TOKEN=$(openssl rand -hex 32))")


def _local_start_failed(e: Exception) -> str:
    """The one line for a local ``ray.init`` that failed although :func:`check_local_ray` passed: a disk
    that filled since (Ray's raylet then fails to start, and ``ray.init`` times out after 30 s with
    "The current node timed out during startup"), a folder made read-only since, ..."""
    folder, _ = ray_temp_dir()
    why = (f"{e.strerror}: {e.filename}" if isinstance(e, OSError) and e.strerror and e.filename
           else (str(e).splitlines() or [type(e).__name__])[0])
    free = _free_mb(folder)
    fix = ("free space there, or set RAY_TMPDIR to a folder on another disk" if not free >= RAY_MIN_FREE_MB
           else "set RAY_TMPDIR to another writable folder")
    return (f"Ray's temporary folder {folder}: a local Ray instance could not start ({why}; {free:.0f} MB free "
            f"there); {fix}")


def _free_mb(path: Path) -> float:
    """Free space, in MB, on the disk where ``path`` is or would be made."""
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free / 1e6
    except OSError:
        return float("nan")


def _node_list(nodes: list[tuple[float, float]], most: int = 4) -> str:
    """'1 node: 2 CPUs, 0 GPUs' / '3 nodes: 2 CPUs, 0 GPUs; 8 CPUs, 1 GPU; ...'."""
    each = "; ".join(f"{c:g} CPUs, {g:g} GPUs" for c, g in nodes[:most]) + ("; ..." if len(nodes) > most else "")
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}: {each}"


def check_trial_fits(cpu: float, gpu: float, address: str | None, source: str = "sweep") -> str | None:
    """Whether one trial's resources (``resources.cpu``, ``resources.gpu``: one bundle, so on one
    node) fit on a node of the running Ray cluster. Tune would otherwise wait for them for ever, and
    its warning (after 60 s) is among the Ray logs fedsweep silences: ``gpu: 1`` on a machine
    without a GPU hung with no word.

    A local instance (no ``address``) never gains resources: a ConfigError naming the key. An
    existing cluster may gain a node (one that joins, or an autoscaler's): the line to print while
    the trials wait. None if a node fits."""
    import ray
    nodes = [(float(n["Resources"].get("CPU", 0.0)), float(n["Resources"].get("GPU", 0.0)))
             for n in ray.nodes() if n.get("Alive")]
    if any(c >= cpu and g >= gpu for c, g in nodes):
        return None
    # the key no node has enough of (both, if each has enough of one but none of both)
    short = [key for key, want, i in (("resources.cpu", cpu, 0), ("resources.gpu", gpu, 1))
             if not any(node[i] >= want for node in nodes)] or ["resources.cpu", "resources.gpu"]
    asked = (f"a trial asks for {cpu:g} CPU{'s' if cpu != 1 else ''} and {gpu:g} GPU{'s' if gpu != 1 else ''} "
             "on one node")
    if address is None:   # one node
        c, g = nodes[0] if nodes else (0.0, 0.0)
        most = {"resources.cpu": c, "resources.gpu": g}
        counted = (" (Ray counts the GPUs that CUDA_VISIBLE_DEVICES and the NVIDIA driver show it)"
                   if "resources.gpu" in short else "")
        raise ConfigError(f"{source}: {' and '.join(short)}: {asked}, but this machine's Ray instance has {c:g} CPUs "
                          f"and {g:g} GPUs{counted}, so no trial could start; set " +
                          " and ".join(f"{k} to {'at most ' if most[k] else ''}{most[k]:g}" for k in short))
    return (f"waiting: {asked}, and no node of the cluster at {address} has that ({_node_list(nodes)}); the "
            f"trials start once one does (a machine that joins with `ray start --address {address}"
            f"{f' --num-gpus {math.ceil(gpu)}' if gpu else ''}`, or a node an autoscaler adds). Ctrl-C stops the sweep")


def nodes_a_trial_fits(cpu: float, gpu: float) -> list[dict]:
    """The alive nodes (``ray.nodes()`` entries) that have a trial's resources: those that may run
    trials, and so must reach the sweep's storage (a head started with ``--num-cpus 0`` need not)."""
    import ray
    return [n for n in ray.nodes() if n.get("Alive") and float(n["Resources"].get("CPU", 0.0)) >= cpu
            and float(n["Resources"].get("GPU", 0.0)) >= gpu]


def _not_the_incomplete_trials(record) -> bool:
    """Drops Tune's closing error line "Trials did not complete: [run_unit_7216d_00002, ...]": fedsweep
    has printed each failed trial by its label, with its error, and the sweep's counts."""
    return not str(record.msg).startswith("Trials did not complete")


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None, mode: str | None = None,
                py_modules: list | None = None):
    """``ray.init`` (a new local instance, or ``address``), ``ray.shutdown`` on the way out; yields
    the Ray session directory (its processes carry it). ``mode``: the auth mode
    :func:`check_cluster` returned for ``address`` (checked here if not given). ``py_modules``: with
    ``address``, the plugins' files and folders Ray ships to every node (its ``runtime_env``), where
    the driver's disk is not. The auth environment is restored after.

    Without ``address``, in a process that already called ``ray.init`` (a notebook's, a script's that
    runs several sweeps): the sweep runs on that Ray, which is left running as it was found; yields
    None, as the session is not the sweep's own (its folder is neither recorded for a driver that
    takes over after a kill, nor deleted)."""
    import logging
    saved = {k: os.environ.get(k) for k in AUTH_VARS}
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Small trials checkpoint often; Ray warns about snapshot frequency on every one of them.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # A crashed trial is one line of fedsweep's ([retrying] / [failed], the error and where its
    # traceback is kept), not Tune's whole traceback for every attempt.
    os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
    # Tune's own per-trial result.json, progress.csv and TensorBoard files repeat every metric row
    # the MLflow runs hold (64 KB a trial of sweeps/fedlga.yaml), written by the driver at every
    # report; fedsweep reads none of them (its trials' state is the experiment state, checkpoints
    # and MLflow). TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=0 brings them back.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "1")   # CPU trials must not grab a GPU
    if not (sys.stdout.isatty() and sys.stderr.isatty()):
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")   # no colour codes in a log file or a pipe
    if address:
        os.environ["RAY_AUTH_MODE"] = mode or check_cluster(address)   # before ray reads its config
    import ray
    for name in ("ray", "ray.tune", "ray.train"):
        logging.getLogger(name).setLevel(logging.ERROR)
    tune_log = logging.getLogger("ray.tune.tune")
    tune_log.addFilter(_not_the_incomplete_trials)
    joined = not address and _ray_joined()   # Ray this process runs already: used, left running
    if not joined:   # (a joined Ray's config is left as it is)
        _refresh_ray_auth()
    restore_printer = _short_raylet_messages()
    try:
        if address:
            try:
                ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR,
                         **({"runtime_env": {"py_modules": py_modules}} if py_modules else {}))
            except Exception as e:  # noqa: BLE001 - shown to the user in one line
                raise ConfigError(f"--address {address}: cannot connect to the Ray cluster ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0] if str(e) else ''})") from None
        elif not joined:
            try:
                ray.init(address="local", include_dashboard=False, log_to_driver=False, num_cpus=num_cpus,
                         logging_level=logging.ERROR)
            except Exception as e:  # noqa: BLE001 - what check_local_ray cannot foresee: one line
                raise ConfigError(_local_start_failed(e)) from None
        with _terminate_as_interrupt():
            yield None if joined else session_dir()
    finally:
        if not joined:
            if not address:
                _stop_monitor()
            ray.shutdown()
        restore_printer()
        tune_log.removeFilter(_not_the_incomplete_trials)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if not joined:
            _refresh_ray_auth()


RAYLET_WIDTH = 200
_RAY_ID = re.compile(r"\b[0-9a-f]{32,}\b")


def raylet_line(message: str) -> str:
    """One of Ray's cluster messages (a node marked dead, a worker killed for memory) as one short
    line: its first sentence, Ray's long ids cut to 8 characters, at most RAYLET_WIDTH characters
    (a node's death was 1,071 characters over several lines)."""
    text = _RAY_ID.sub(lambda m: m.group(0)[:8], " ".join(message.split()))
    first = text.split(". ", 1)[0].rstrip(".") + "."
    return first if len(first) <= RAYLET_WIDTH else first[:RAYLET_WIDTH - 1] + "…"


def _short_raylet_messages():
    """Ray prints its cluster messages to the driver's terminal as ``(raylet) <message>``, through
    ``ray._private.worker.print_to_stdstream`` (even with ``log_to_driver=False``); shorten them to
    :func:`raylet_line` while the sweep runs. Returns the function that puts Ray's own back."""
    try:
        import ray._private.worker as ray_worker
        original = ray_worker.print_to_stdstream
    except (ImportError, AttributeError):        # another Ray: its messages as they are
        return lambda: None

    def shortened(data, *args, **kwargs):
        if data.get("pid") == "raylet":
            data = {**data, "lines": [raylet_line(line) for line in data.get("lines", [])]}
        return original(data, *args, **kwargs)
    ray_worker.print_to_stdstream = shortened

    def restore():
        ray_worker.print_to_stdstream = original
    return restore


@contextmanager
def _terminate_as_interrupt():
    """While Ray runs, SIGTERM (``kill PID``, a batch scheduler's stop) ends the sweep as Ctrl-C does:
    Tune stops its trials, and the driver closes the open runs and Ray. The handler ``ray.init``
    installs would end the process with a native stack dump instead. Main thread only."""
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(os.getpid(), signal.SIGINT))
    try:
        yield
    finally:   # a handler installed from C reads as None and cannot be put back: the default then
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _stop_monitor() -> None:
    """End the autoscaler monitor of the local instance with SIGKILL, before ``ray.shutdown``.

    ``ray.shutdown`` stops Ray's processes one at a time, the GCS before the monitor, each with
    SIGTERM and up to a second to exit. The monitor's SIGTERM handler reports its end to the
    drivers through the GCS, which is gone by then, so every shutdown waited out that whole second
    (a local instance: 1.34 s, 0.33 s with the monitor ended first). The monitor of a one-machine
    instance has nothing to scale and keeps no state. Private API (``_global_node``): best effort;
    whatever is left is ended by ``ray.shutdown`` as before."""
    try:
        import ray._private.worker as worker
        from ray._private import ray_constants
        node = worker._global_node
        for info in node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, []) if node is not None else []:
            info.process.kill()
            info.process.wait(timeout=1)
    except Exception:  # noqa: BLE001 - private API: ray.shutdown stops it otherwise
        pass


def remove_session(path: str | None) -> bool:
    """Delete the folder of a local Ray instance's session (``.../session_<date>_<pid>``) once it is
    shut down, and Ray's ``session_latest`` link if it points there. Ray keeps every session's folder
    (logs, sockets, Tune's staging copies; ~5 MB a sweep of sweeps/fedlga.yaml) until the machine
    restarts, in /tmp, which is memory on many systems (the shared machine fedsweep is developed on
    had 2,371 of them, 3.7 GB, mostly from its tests). Only a folder named ``session_*``; True if
    one was deleted."""
    if not path:
        return False
    folder = Path(path)
    if not folder.name.startswith("session_") or folder.is_symlink() or not folder.is_dir():
        return False
    latest = folder.parent / "session_latest"
    points_here = latest.is_symlink() and os.path.realpath(latest) == os.path.realpath(folder)
    shutil.rmtree(folder, ignore_errors=True)
    if points_here:
        latest.unlink(missing_ok=True)
    return not folder.exists()


def _ray_joined() -> bool:
    """This process has called ``ray.init`` already (found without importing Ray)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def session_dir() -> str | None:
    """The running Ray session's directory (``.../session_<date>_<pid>``), if this process started it."""
    try:
        import ray._private.worker as worker
        node = worker._global_node
        return node.get_session_dir_path() if node is not None else None
    except Exception:  # noqa: BLE001 - private API: best effort
        return None


def _refresh_ray_auth() -> None:
    """Make Ray's cached C++ config and token re-read the environment (as Ray's own
    ``_enable_token_auth`` does); without it a mode set after ``import ray`` is ignored."""
    if "ray._raylet" not in sys.modules:
        return
    from ray._raylet import AuthenticationTokenLoader, Config
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
