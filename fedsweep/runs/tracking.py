"""MLflow: where runs go and how one run is written (batched: one call per kind of record).

Store resolution (as every MLflow tool does it, plus a working default):
``mlflow.tracking_uri`` in the config, else ``$MLFLOW_TRACKING_URI``, else the sqlite store
``sqlite:///<cwd>/mlflow.db`` (MLflow 3.17 refuses the old ``./mlruns`` file store by default).
Artifacts of a sqlite store live beside it in ``mlartifacts/``. :func:`check_store` checks, before
any training, that the store can take the run (MLflow itself would fail, or retry for minutes, only
when the finished run is logged).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from fedsweep.config.schema import ConfigError

DEFAULT_DB = "mlflow.db"
# A run's `fedsweep.status` tag, and the MLflow run status it ends with. A diverged run ran to its
# end but its numbers are not usable: FAILED, so the MLflow UI's status column says so; so is an
# incomplete one (trained, but its summary and artifacts never reached the sweep's driver). An
# interrupted one (Ctrl-C) is KILLED (a sweep's `--resume` reopens it).
MLFLOW_STATUS = {"finished": "FINISHED", "stopped": "FINISHED", "diverged": "FAILED", "failed": "FAILED",
                 "incomplete": "FAILED", "interrupted": "KILLED"}
_MLFLOW_TABLES = {"alembic_version", "experiments"}   # an MLflow store has both, from its first migration


def resolve_tracking_uri(uri: str | None = None) -> str:
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / DEFAULT_DB}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = f"sqlite:///{Path(uri[len('sqlite:///'):]).resolve()}"   # absolute: trials run elsewhere
    elif "://" not in uri:                                               # a bare path means a sqlite file
        uri = f"sqlite:///{Path(uri).resolve()}"
    return uri


def sqlite_path(uri: str) -> Path:
    """The database file of a ``sqlite:///PATH[?options]`` URI."""
    return Path(uri[len("sqlite:///"):].split("?", 1)[0])


def _source(uri: str | None) -> str:
    """Where an unresolved tracking URI comes from, for error messages."""
    if uri:
        return "mlflow.tracking_uri"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return "mlflow.tracking_uri (from $MLFLOW_TRACKING_URI)"
    return "mlflow.tracking_uri (default)"


def _check_sqlite(uri: str, key: str, experiment: str | None = None) -> None:
    from fedsweep.runs.paths import _dir_problem
    db = sqlite_path(uri)
    if str(db) in ("", ".", ":memory:"):
        return
    problem = _dir_problem(db.parent)
    if problem:
        raise ConfigError(f"{key} {uri}: cannot create the store there: {problem}")
    arts = db.parent / "mlartifacts"
    if os.path.lexists(arts) and not arts.is_dir():
        raise ConfigError(f"{key} {uri}: the artifacts folder {arts} is a file, not a folder")
    if arts.is_dir() and not os.access(arts, os.W_OK | os.X_OK):
        raise ConfigError(f"{key} {uri}: the artifacts folder {arts} is not writable")
    if not os.path.lexists(db):
        return   # MLflow creates the folder and the store (~2 s) when the run is logged
    if db.is_dir():
        raise ConfigError(f"{key} {uri}: {db} is a folder, not a sqlite database file")
    if not os.access(db, os.R_OK | os.W_OK):
        raise ConfigError(f"{key} {uri}: the database {db} is not writable")
    with open(db, "rb") as f:
        header = f.read(16)
    if not header:
        return   # an empty file is an empty sqlite database: MLflow creates its tables
    if header != b"SQLite format 3\x00":
        raise ConfigError(f"{key} {uri}: {db} is not a sqlite database")
    import sqlite3
    try:
        con = sqlite3.connect(str(db), timeout=5)   # not mode=ro: that cannot roll back a hot journal
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            found = (con.execute("SELECT version_num FROM alembic_version").fetchone() or [None])[0] \
                if _MLFLOW_TABLES <= tables else None
        finally:
            con.close()
    except sqlite3.Error as e:
        raise ConfigError(f"{key} {uri}: cannot read the database {db} ({e})") from None
    if tables and not _MLFLOW_TABLES <= tables:
        # MLflow would add its ~65 tables to somebody else's database
        shown = ", ".join(sorted(tables)[:4]) + (", ..." if len(tables) > 4 else "")
        raise ConfigError(f"{key} {uri}: {db} is a sqlite database of something else (tables {shown}), not an "
                          f"MLflow store; fedsweep writes nothing into it: give the store a file of its own")
    if found:
        _open_with_mlflow(uri, key, experiment)


def _open_with_mlflow(uri: str, key: str, experiment: str | None = None) -> None:
    """An existing MLflow store, opened as MLflow opens it: MLflow refuses a store of another schema
    version (its own idea of "current" is not simply the newest migration, so ask it rather than
    read its migration scripts); and ``experiment``, if the store has it, not deleted. A store busy
    with another writer (locked past sqlite's 20 s wait) is not refused: runs wait for it as they
    train (fedsweep/runs/writer.py). Costs the MLflow import (~2 s) that logging pays anyway."""
    from mlflow import MlflowClient

    from fedsweep.util.locks import store_lock
    try:
        with store_lock(sqlite_path(uri).parent):   # not mid-creation
            client = MlflowClient(tracking_uri=uri)
            client.search_experiments(max_results=1)
            found = client.get_experiment_by_name(experiment) if experiment else None
    except ConfigError:
        raise                                        # the lock's own line: who holds it, and the fix
    except Exception as e:  # noqa: BLE001 - MLflow's own words, in one line
        if getattr(e, "error_code", None) == "TEMPORARILY_UNAVAILABLE":
            return
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{key} {uri}: MLflow cannot use this store ({first}); if it was made by another "
                          f"MLflow version, back it up, then run: mlflow db upgrade {uri}") from None
    if found is not None:
        refuse_deleted(found, uri)


def refuse_deleted(experiment, uri: str) -> None:
    """A deleted experiment keeps its name in MLflow's trash, and MLflow refuses runs in it."""
    if experiment.lifecycle_stage == "deleted":
        raise ConfigError(
            f"mlflow.experiment: experiment {experiment.name!r} was deleted in {uri} (MLflow keeps it in its trash, "
            f"where its name cannot take runs); restore it (MLFLOW_TRACKING_URI={uri} mlflow experiments restore "
            f"--experiment-id {experiment.experiment_id}), or pick another name")


def check_experiment_name(name: str, key: str = "mlflow.experiment") -> None:
    """A name MLflow takes for an experiment: not empty, at most 500 characters."""
    if not name or not name.strip():
        raise ConfigError(f"{key}: an experiment needs a name (not empty)")
    if len(name) > MAX_EXPERIMENT_NAME:
        raise ConfigError(f"{key}: {len(name)} characters, and MLflow takes at most {MAX_EXPERIMENT_NAME} for an "
                          f"experiment's name ({name[:40]!r}...)")


MAX_EXPERIMENT_NAME = 500   # MLflow 3.17's limit (mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH)


def _check_http(uri: str, key: str, timeout: float) -> None:
    import ssl
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout):
            pass
    except urllib.error.HTTPError:
        return   # it answers (an auth wall or a proxy path prefix may give 401/404): a server is there
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, ssl.SSLError):
            return   # a TLS server answers; its certificates are MLflow's business
        raise ConfigError(f"{key} {uri}: no MLflow server answers there ({reason}); start one "
                          f"(mlflow server --backend-store-uri sqlite:///$PWD/mlflow.db --host 127.0.0.1 "
                          f"--port 5000, or mlflow ui), or use a sqlite:/// store") from None


def check_store(uri: str | None = None, *, timeout: float = 5.0, key: str | None = None,
                experiment: str | None = None) -> str:
    """Check before any work that runs can be logged to the tracking store; returns the resolved URI.

    ``uri`` is resolved as :func:`resolve_tracking_uri` does (None: ``$MLFLOW_TRACKING_URI``, else the
    default sqlite store). Raises :class:`~fedsweep.config.schema.ConfigError` with one line naming ``key``
    (default: ``mlflow.tracking_uri`` and where the URI came from) and the URI when:

    - ``sqlite:///PATH``: PATH's folder is not, and cannot be made, a writable folder (a regular file
      in the way); ``mlartifacts/`` beside it is a file or not writable; PATH exists but is a folder,
      not writable, not a sqlite database, a sqlite database with tables of its own (somebody else's:
      MLflow would add its tables to it), or an MLflow store of another schema version (which
      MLflow refuses with ``mlflow db upgrade``: the store is opened as MLflow opens it, ~2 s with the
      MLflow import). Writes nothing: a missing store is created by MLflow when the run is logged.
    - ``http(s)://``: nothing answers ``GET <uri>/health`` within ``timeout`` seconds (MLflow's own
      client would retry for minutes). Any HTTP answer, even an error status, passes.
    - ``file:``: MLflow 3.17 refuses its file store unless ``MLFLOW_ALLOW_FILE_STORE=true``.

    Other schemes (databricks, postgresql, ...) are left to MLflow.

    ``experiment``: the experiment runs will go to: a name MLflow takes (:func:`check_experiment_name`)
    and, in an existing sqlite store, not a deleted one (:func:`refuse_deleted`).
    """
    if experiment is not None:
        check_experiment_name(experiment)
    key = key or _source(uri)
    resolved = resolve_tracking_uri(uri)
    scheme = resolved.split(":", 1)[0].lower()
    if scheme == "sqlite":
        if resolved.startswith("sqlite:///"):
            _check_sqlite(resolved, key, experiment)
    elif scheme in ("http", "https"):
        _check_http(resolved, key, timeout)
    elif scheme == "file":
        if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() not in ("true", "1"):
            raise ConfigError(f"{key} {resolved}: MLflow 3.17 refuses the file store; use "
                              f"sqlite:////abs/path/mlflow.db (or set MLFLOW_ALLOW_FILE_STORE=true)")
    return resolved


def check_existing_store(uri: str | None = None, *, key: str | None = None) -> str:
    """:func:`check_store` for reading (``fedsweep report``): a sqlite store must also exist already.
    MLflow opening a missing one would create it, an empty store and its tables, wherever a mistyped
    path or the wrong working folder points."""
    key = key or _source(uri)
    resolved = check_store(uri, key=key)
    if resolved.startswith("sqlite:///"):
        db = sqlite_path(resolved)
        if not db.is_file() or db.stat().st_size == 0:
            raise ConfigError(f"{key} {resolved}: no MLflow store there (nothing read, nothing created); run the "
                              f"sweep first, or run this from the folder it ran in, or point mlflow.tracking_uri "
                              f"(the sweep file) or $MLFLOW_TRACKING_URI at its store")
    return resolved


def ui_command(uri: str, *, sweep: str | None = None, experiment: str | None = None,
               run_id: str | None = None) -> str:
    """The command that opens these runs in the MLflow UI (:mod:`fedsweep.sweep.ui`): a sweep file names
    its store and experiment; otherwise the store and experiment are spelled out. A store that is
    an MLflow server is its own UI: its address is the answer."""
    if uri.split(":", 1)[0].lower() in ("http", "https"):
        return f"{uri.rstrip('/')}/#/experiments (the store's own UI)"
    import shlex
    if sweep is not None:
        default = resolve_tracking_uri(None) == uri   # the store fedsweep ui finds by itself, run from here
        return f"fedsweep ui {shlex.quote(sweep)}" + ("" if default else f" --backend-store-uri {uri}")
    words = ["fedsweep", "ui", "--backend-store-uri", uri]
    if experiment is not None:
        words += ["--experiment", experiment]
    if run_id is not None:
        words += ["--run", run_id]
    return shlex.join(words)


def ui_url(experiment_id: str, run_id: str | None = None, port: int = 5000, host: str = "127.0.0.1") -> str:
    """The page of ``mlflow ui`` that shows an experiment's runs (or one run). MLflow 3.17 opens an
    experiment on its GenAI overview (traces: none here) unless the address asks for the model-training
    view (``workflowType``), whatever the experiment's tags say; the choice then sticks in the browser."""
    page = f"runs/{run_id}" if run_id else "runs"
    return f"http://{host}:{port}/#/experiments/{experiment_id}/{page}?workflowType=machine_learning"


def _artifact_root(uri: str) -> str | None:
    if uri.startswith("sqlite:///"):
        return (sqlite_path(uri).parent / "mlartifacts").as_uri()
    return None


def quiet_store_logs() -> None:
    """Nothing from MLflow's store set-up (its schema-creation chatter, and a failed query's whole
    traceback: the error reaches fedsweep, which says it in one line) and only warnings and errors
    from alembic."""
    import logging
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    logging.getLogger("alembic").setLevel(logging.WARNING)


def open_experiment(uri: str, name: str):
    """(an MlflowClient of the store at ``uri``, the id of experiment ``name``, created if missing):
    :func:`open_store`, then :func:`experiment_id`."""
    client = open_store(uri)
    return client, experiment_id(client, name, uri)


def open_store(uri: str):
    """An MlflowClient of the store at ``uri``. Its construction creates a fresh sqlite store's schema
    (alembic migrations, ~2 s); two processes doing that at once fail in the migration, so for a
    sqlite store it happens under a lock on the store's folder."""
    from mlflow import MlflowClient

    from fedsweep.util.locks import store_lock
    if not uri.startswith("sqlite:///"):
        return MlflowClient(tracking_uri=uri)
    folder = sqlite_path(uri).parent
    folder.mkdir(parents=True, exist_ok=True)
    with store_lock(folder):
        return MlflowClient(tracking_uri=uri)


def experiment_id(client, name: str, uri: str) -> str:
    """The id of experiment ``name`` in ``client``'s store, created if missing; two processes creating
    one experiment collide on its unique name, so for a sqlite store under the store folder's lock."""
    from fedsweep.util.locks import store_lock
    if not uri.startswith("sqlite:///"):
        return _get_or_create(client, name, uri)
    with store_lock(sqlite_path(uri).parent):
        return _get_or_create(client, name, uri)


#: MLflow 3's UI opens an experiment on its GenAI overview (traces, latency: empty here) unless the
#: experiment is tagged as one of model-training runs; name and value as MLflow 3.17's UI reads them.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


def _get_or_create(client, name: str, uri: str) -> str:
    key, kind = EXPERIMENT_KIND
    check_experiment_name(name)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        root = _artifact_root(uri)
        return client.create_experiment(name, artifact_location=f"{root}/{artifact_folder(name)}" if root else None,
                                        tags={key: kind})
    refuse_deleted(exp, uri)
    if key not in exp.tags:               # made by an older fedsweep: its runs view from now on
        client.set_experiment_tag(exp.experiment_id, key, kind)
    return exp.experiment_id


def artifact_folder(name: str) -> str:
    """The folder of an experiment's artifacts beside a sqlite store: its name where that is a plain
    folder name, else a safe part of it and a hash (a name may hold '/', or pass a file system's
    255 bytes: MLflow takes 500 characters)."""
    import hashlib
    import re
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._ -]{0,99}", name) and not name.endswith((" ", ".")):
        return name
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:60].strip("._") or "experiment"
    return f"{safe}-{hashlib.sha1(name.encode()).hexdigest()[:10]}"


def dataset_input(run: dict):
    """The run's data as an MLflow dataset input, so the runs table's Dataset column says what data
    a run used: named by dataset, partition and clients (``mnist_5k classes2 N50``), its digest a hash
    of the ``data`` and ``server_data`` config (equal data, equal digest), its profile the split."""
    import hashlib

    from mlflow.entities import Dataset, DatasetInput, InputTag

    from fedsweep.config.names import partition_label
    data, server = run["data"], run.get("server_data") or {}
    name = " ".join([data["name"], partition_label(data["partition"]), f"N{data['num_clients']}"])
    setup = json.dumps({"data": data, "server_data": server}, sort_keys=True, default=str)
    profile = {"clients": data["num_clients"], "partition": data["partition"],
               "test_fraction": data.get("test_fraction"), "train_size": data.get("train_size")}
    if server.get("fraction") or server.get("size"):
        profile["server_data"] = {k: server.get(k) for k in ("fraction", "size")}
    if data.get("validation_fraction"):
        profile["validation"] = {"fraction": data["validation_fraction"], "kind": data.get("validation")}
    source = {"dataset": data["name"], "root": data.get("root")}
    dataset = Dataset(name=name, digest=hashlib.sha1(setup.encode()).hexdigest()[:8], source_type="code",
                      source=json.dumps(source), profile=json.dumps(profile, default=str))
    return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "training")])


def metrics_of(history: list[dict], timestamp_ms: int):
    """MLflow Metric records for every round (step = rounds completed). NaN and ±inf are logged as
    they are (MLflow stores them): a diverged run shows its loss up to and at the round it diverged."""
    from mlflow.entities import Metric
    return [Metric(k, float(v), timestamp_ms, int(h["round"]))
            for h in history for k, v in h.items() if k != "round" and v is not None]


def summary_metrics(summary: dict, timestamp_ms: int):
    """The summary's finite numbers as ``summary/<key>`` metrics, plus ``best/test_accuracy``,
    ``rounds_to_target`` and, with a validation split, ``best/val_accuracy`` and ``val_rounds_to_target``
    (the names of docs/design.md §4.4) where they exist."""
    from mlflow.entities import Metric
    out = [Metric(f"summary/{k}", float(v), timestamp_ms, 0) for k, v in summary.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))]
    for key, name in (("best_test_accuracy", "best/test_accuracy"), ("rounds_to_target", "rounds_to_target"),
                      ("best_val_accuracy", "best/val_accuracy"), ("val_rounds_to_target", "val_rounds_to_target")):
        if summary.get(key) is not None:
            out.append(Metric(name, float(summary[key]), timestamp_ms, 0))
    return out


def run_tags(summary: dict) -> dict[str, str]:
    """``fedsweep.status`` and, for a diverged run, ``fedsweep.diverged_round``."""
    tags = {"fedsweep.status": summary.get("status", "finished")}
    if summary.get("diverged_round") is not None:
        tags["fedsweep.diverged_round"] = str(summary["diverged_round"])
    return tags


def log_params(client, run_id: str, params: dict) -> None:
    """``params`` as the run's MLflow params: values cut at MLflow's 6000 characters, 100 a call
    (MLflow's limit)."""
    from mlflow.entities import Param
    batch = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for i in range(0, len(batch), 100):
        client.log_batch(run_id, params=batch[i:i + 100])
