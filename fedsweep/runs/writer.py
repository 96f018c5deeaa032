"""MLflow writes that never stop training (docs/run.md, "When the MLflow store fails").

A :class:`Writer` takes a process's MLflow writes (a run's creation, params, metric rows, tags,
artifacts, status) as operations, in order, and makes them on a thread of its own: training never
waits for the store and never stops for it. A write that fails is tried again, after pauses that
grow to 30 s, until it goes through; the operations behind it wait their turn, so the store never
holds a later record of a run without the earlier ones (a run marked finished has every round).
What still waits when the work is done is kept in a folder (:meth:`Writer.save`), from which
``fedsweep log FOLDER`` (or, for a sweep, ``fedsweep tune --resume``) writes it later, as it would
have been written.

Operations name runs by a key of the caller's: a run's MLflow id exists only once the store has
created it. Each operation can be made twice without harm (a retry after a write that went
through, a replay after a process that was cut off mid-write): a run is created once per key,
metric rows are written only past the last round the run holds, and everything else overwrites
itself.
"""
from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

from fedsweep.config.schema import ConfigError
from fedsweep.runs.store_errors import Refused, cause, permanent

MAX_PAUSE = 30.0
#: Seconds the last writes may take before "waiting up to ... for the store" is said (no failure seen).
QUIET_WAIT_S = 5.0
RECORDS = "records.json"


class Writer:
    """MLflow writes of one process, made in order on a thread of their own (module docstring).

    ``say`` prints a one-line notice when the store starts failing and when it answers again. With
    ``start=False`` nothing is written: the operations only wait, for :meth:`save`. ``rows_every``:
    seconds at least between two writes of metric rows until :meth:`close` (the rows of the rounds
    between go in one write): a thread that writes all the time slows the training beside it, which
    waits for the interpreter lock (docs/design.md §7: 23 s against 8.8 s without MLflow for a run
    evaluating each of its 4,000 short rounds; 14.3 s writing rows every 5 s)."""

    def __init__(self, uri: str, say=None, start: bool = True, rows_every: float = 0.0):
        self.uri, self.start, self.rows_every = uri, start, rows_every
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.ops: deque[dict] = deque()
        self.ids: dict[str, str] = {}          # run key -> MLflow run id
        self.through: dict[str, int] = {}      # run key -> last round the run holds
        self.failure: tuple[str, bool] | None = None   # (cause, permanent) while the next write fails
        self.failed_since: float | None = None
        self._client = None
        self._experiments: dict[str, str] = {}
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = False
        self._stop = False
        self._hurry = False                    # close(): rows are written at once
        self._rows_written = float("-inf")     # when rows were last written
        self._retry_at = float("-inf")         # after a failed write: not tried again before this

    # -- what callers write ---------------------------------------------------------------------
    def open_run(self, key: str, experiment: str | None = None, name: str = "", *, experiment_id: str | None = None,
                 tags: dict | None = None, params: dict | None = None, config: dict | None = None,
                 reopen: str | None = None) -> None:
        """Create run ``key`` in ``experiment`` (made if missing; or the existing ``experiment_id``)
        with its tags, params and, from a run ``config``, its dataset input; with ``reopen``, the
        MLflow id of an earlier run of the same training (a resumed run), continue that run instead if
        the store still has it with the same params."""
        self.submit({"op": "open", "run": key, "experiment": experiment, "experiment_id": experiment_id,
                     "name": name, "tags": tags or {},
                     "params": {k: str(v)[:6000] for k, v in (params or {}).items()}, "config": config,
                     "reopen": reopen})

    def adopt(self, key: str, run_id: str) -> None:
        """Run ``key`` is the existing run ``run_id`` (its rounds are counted from the store first)."""
        self.submit({"op": "adopt", "run": key, "id": run_id})

    def rows(self, key: str, rows: list[dict]) -> None:
        """Metric rows (one dict a round, ``round`` the step); only rounds past those the run holds."""
        if rows:
            self.submit({"op": "rows", "run": key, "rows": rows, "ts": _now()})

    def batch(self, key: str, *, metrics: dict | None = None, params: dict | None = None,
              tags: dict | None = None) -> None:
        """Metrics at step 0 (a summary), params and tags, in one write where MLflow's limits allow."""
        self.submit({"op": "batch", "run": key, "metrics": metrics or {}, "ts": _now(),
                     "params": {k: str(v)[:6000] for k, v in (params or {}).items()},
                     "tags": {k: str(v)[:8000] for k, v in (tags or {}).items()}})

    def delete_tag(self, key: str, name: str) -> None:
        self.submit({"op": "delete_tag", "run": key, "name": name})

    def files(self, key: str, files: dict[str, bytes]) -> None:
        """Artifacts, name -> content."""
        if files:
            self.submit({"op": "files", "run": key, "files": dict(files)})

    def status(self, key: str, status: str) -> None:
        """The run's MLflow status while it goes on (``RUNNING`` for a reopened run)."""
        self.submit({"op": "status", "run": key, "status": status})

    def end(self, key: str, status: str) -> None:
        """The run's final MLflow status (FINISHED, FAILED, KILLED) and end time."""
        self.submit({"op": "end", "run": key, "status": status})

    def submit(self, op: dict) -> None:
        with self._cv:
            self.ops.append(op)
            self._cv.notify_all()
            if self._thread is None and not self._stop and self.start:
                self._thread = threading.Thread(target=self._loop, name="fedsweep-mlflow", daemon=True)
                self._thread.start()

    def run_id(self, key: str) -> str | None:
        """The MLflow id of run ``key``, once the store has it."""
        return self.ids.get(key)

    def experiment_id(self, name: str) -> str | None:
        """The id of experiment ``name``, once a run was opened in it."""
        return self._experiments.get(name)

    # -- the thread -----------------------------------------------------------------------------
    def _loop(self) -> None:
        pause = 1.0
        while True:
            with self._cv:
                while not self.ops and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                # A write that failed waits out its pause even though new operations arrive (each
                # round submits some): retried at every one, a failing store's growing backlog was
                # rewritten and rolled back each round, and a run went 7x slower once its disk filled.
                wait = max(self._retry_at - time.monotonic(), self._rows_wait())
                if wait > 0:
                    self._cv.wait(wait)
                    continue
                self._merge_rows()
                op, self._busy = self.ops[0], True
            try:
                self.apply(op)
            except Exception as e:  # noqa: BLE001 - every store error waits and is tried again
                with self._cv:
                    self._busy = False
                    self._failed(e)
                    self._retry_at = time.monotonic() + pause   # close() tries once more at once
                    self._cv.notify_all()
                pause = min(2 * pause, MAX_PAUSE)
                continue
            with self._cv:
                self.ops.popleft()
                if op["op"] == "rows":
                    self._rows_written = time.monotonic()
                self._busy = False
                if self.failure is not None:
                    self.say(f"MLflow: the store at {self.uri} answers again after "
                             f"{_seconds(time.monotonic() - self.failed_since)}; writing what waited")
                    self.failure = self.failed_since = None
                self._cv.notify_all()
            pause = 1.0

    def _rows_wait(self) -> float:
        """Seconds until the rows waiting first may be written (``rows_every``); 0 for anything else."""
        if self._hurry or self.ops[0]["op"] != "rows":
            return 0.0
        return self._rows_written + self.rows_every - time.monotonic()

    def _merge_rows(self) -> None:
        """Metric rows of one run waiting one behind the other become one write (a write is a
        commit, ~10 ms on sqlite: a run evaluating every 3 ms round would otherwise outpace it)."""
        first = self.ops[0]
        if first["op"] != "rows":
            return
        rows = list(first["rows"])
        while len(self.ops) > 1 and self.ops[1]["op"] == "rows" and self.ops[1]["run"] == first["run"]:
            rows += self.ops[1]["rows"]
            del self.ops[1]
        if len(rows) > len(first["rows"]):
            self.ops[0] = {**first, "rows": rows}

    def _failed(self, error: BaseException) -> None:
        first = self.failure is None
        self.failure = (cause(error), permanent(error))
        if first:
            self.failed_since = time.monotonic()
            self.say(f"MLflow: the store at {self.uri} failed ({self.failure[0]}); training goes on and its "
                     "records wait here, tried again every few seconds")

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every write to be made; True if all were. Returns at
        once, without a last try, while the store refuses a write for good."""
        end = time.monotonic() + timeout
        with self._cv:
            while self.ops:
                left = end - time.monotonic()
                if left <= 0 or (self.failure is not None and self.failure[1] and not self._busy):
                    return False
                self._cv.wait(min(left, 1.0))
            return True

    def announce_wait(self, grace: float) -> float:
        """One line, once, when writes still wait and the caller is about to wait up to ``grace``
        seconds for them: a driver that stops there says why it is not done. With no failure seen,
        the line waits :data:`QUIET_WAIT_S` for the last writes first (at a run's end they go
        through at once). Returns the seconds spent waiting here."""
        if grace <= 0 or not self.ops or getattr(self, "_announced", False):
            return 0.0
        start = time.monotonic()
        if self.failure is None and self.drain(min(QUIET_WAIT_S, grace)):
            return time.monotonic() - start
        if not self.ops or (self.failure is not None and self.failure[1]):
            return time.monotonic() - start   # done, or refused for good: not waited for
        self._announced = True
        why = self.failure[0] if self.failure is not None else "a write under way has not come back"
        left = max(grace - (time.monotonic() - start), 0.0)
        if left < 1.0:   # the grace is spent: no wait to announce ("waiting up to 0 s")
            self.say(f"MLflow: the store has not taken the last {len(self.ops)} writes ({why}); they are kept on disk")
        else:
            self.say(f"MLflow: waiting up to {_seconds(left)} for the store ({why}); {len(self.ops)} writes wait, "
                     "then what is left is kept on disk")
        return time.monotonic() - start

    def close(self, grace: float) -> bool:
        """Wait up to ``grace`` seconds for the writes, then stop the thread; True if all were made.
        What is left waits in :attr:`ops` for :meth:`save`."""
        with self._cv:
            self._hurry = True
            self._retry_at = float("-inf")
            self._cv.notify_all()
        done = self.drain(max(grace - self.announce_wait(grace), 0.0))
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5.0)   # a write in flight (sqlite waits 20 s on a lock) may outlast it:
        return done                          # what it makes is made once more by the replay, harmlessly

    # -- making one operation -------------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            from fedsweep.runs.tracking import open_store, quiet_store_logs
            quiet_store_logs()   # MLflow logs each failed query's traceback: one line here says it
            self._client = open_store(self.uri)
        return self._client

    def apply(self, op: dict) -> None:
        getattr(self, f"_{op['op']}")(op)

    def _id(self, op: dict) -> str:
        key = op["run"]
        if key not in self.ids:
            raise Refused(f"run {key} was never created (its creation was not kept)")
        if key not in self.through:   # an adopted or replayed run: count the rounds it holds first
            history = self.client.get_metric_history(self.ids[key], "train/loss")
            self.through[key] = max((m.step for m in history), default=0)
        return self.ids[key]

    def _open(self, op: dict) -> None:
        from fedsweep.runs.tracking import dataset_input, log_params
        key = op["run"]
        if key not in self.ids:
            exp_id = op.get("experiment_id") or self._experiment(op["experiment"])
            run = None
            for earlier in self._earlier_runs(op, exp_id):
                run = self._reopened(op, exp_id, earlier)
                if run is not None:
                    break
            if run is None:
                run = self.client.create_run(exp_id, run_name=op["name"], tags=op["tags"])
                self.ids[key], self.through[key] = run.info.run_id, 0
                if op.get("config"):
                    self.client.log_inputs(run.info.run_id, datasets=[dataset_input(op["config"])])
                if op.get("reopen"):   # the earlier run cannot be continued: it ends, pointing here
                    self._superseded(op["reopen"], run.info.run_id)
        have = self.client.get_run(self.ids[key]).data.params
        log_params(self.client, self.ids[key], {k: v for k, v in op["params"].items() if k not in have})

    def _earlier_runs(self, op: dict, exp_id: str) -> list[str]:
        """The MLflow runs an ``open`` may continue: ``reopen`` (the run a resumed training began),
        then the experiment's runs of the same training (``fedsweep.run_uid``), newest first: a
        creation cut off after the store made the run (a process that ended while its write waited on
        a lock) is continued, not made twice, when its kept records are written."""
        runs = [op["reopen"]] if op.get("reopen") else []
        uid = op["tags"].get("fedsweep.run_uid")
        if uid:
            found = self.client.search_runs([exp_id], filter_string=f"tags.`fedsweep.run_uid` = '{uid}'",
                                            order_by=["attributes.start_time DESC"], max_results=20)
            runs += [r.info.run_id for r in found if r.info.run_id not in runs]
        return runs

    def _reopened(self, op: dict, exp_id: str, run_id: str):
        """The earlier run ``run_id`` set running again to continue this training, or None where it
        cannot be (the store lost it; other params)."""
        from mlflow.exceptions import MlflowException
        try:
            run = self.client.get_run(run_id)
        except MlflowException as e:
            if getattr(e, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                raise
            return None
        if run.info.lifecycle_stage != "active" or run.info.experiment_id != exp_id:
            return None
        # Params cannot change in MLflow: a run continued with other ones (more rounds) is a new run.
        # The mlflow.* keys say where and how the run is recorded, not what trains: a run resumed with
        # another retry_seconds or run_name is the same training, continued, and they become tags.
        if any(run.data.params.get(k, v) != v for k, v in op["params"].items() if not k.startswith("mlflow.")):
            return None
        changed = {f"fedsweep.resumed_with.{k}": v for k, v in op["params"].items()
                   if k.startswith("mlflow.") and run.data.params.get(k, v) != v}
        self.ids[op["run"]] = run.info.run_id
        self._id(op)   # the rounds it holds
        self.client.update_run(run.info.run_id, status="RUNNING")
        self._set_tags(run.info.run_id, {**op["tags"], **changed})
        return run

    def _superseded(self, old_id: str, new_id: str) -> None:
        """A resumed run's earlier MLflow run, which the resume could not continue (other params, or
        another experiment): never left RUNNING, and it names the run that goes on."""
        from mlflow.exceptions import MlflowException
        try:
            old = self.client.get_run(old_id)
        except MlflowException:
            return
        self._set_tags(old_id, {"fedsweep.continued_in": new_id,
                                **({"fedsweep.status": "interrupted"} if old.info.status == "RUNNING" else {})})
        if old.info.status == "RUNNING":
            self.client.set_terminated(old_id, status="KILLED")

    def _experiment(self, name: str) -> str:
        if name not in self._experiments:
            from fedsweep.runs.tracking import experiment_id
            try:
                self._experiments[name] = experiment_id(self.client, name, self.uri)
            except ConfigError as e:   # deleted, or a name MLflow cannot take
                raise Refused(str(e)) from None
        return self._experiments[name]

    def _adopt(self, op: dict) -> None:
        self.ids[op["run"]] = op["id"]
        self.through.pop(op["run"], None)

    def _rows(self, op: dict) -> None:
        from fedsweep.runs.tracking import metrics_of
        run_id = self._id(op)
        rows = [r for r in op["rows"] if r["round"] > self.through[op["run"]]]
        for chunk in whole_rounds(rows):   # a cut-off process leaves no round half written
            self.client.log_batch(run_id, metrics=metrics_of(chunk, op["ts"]))
            self.through[op["run"]] = chunk[-1]["round"]

    def _batch(self, op: dict) -> None:
        from mlflow.entities import Metric, Param, RunTag
        run_id = self._id(op)
        metrics = [Metric(k, float(v), op["ts"], 0) for k, v in op["metrics"].items()]
        params = [Param(k, v) for k, v in op["params"].items()]
        tags = [RunTag(k, v) for k, v in op["tags"].items()]
        for i in range(0, max(len(metrics), len(params), len(tags), 1), 100):   # MLflow's limits: 100 params/tags a call
            self.client.log_batch(run_id, metrics=metrics[i:i + 100], params=params[i:i + 100], tags=tags[i:i + 100])

    def _set_tags(self, run_id: str, tags: dict) -> None:
        from mlflow.entities import RunTag
        items = [RunTag(k, str(v)) for k, v in tags.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(run_id, tags=items[i:i + 100])

    def _delete_tag(self, op: dict) -> None:
        from mlflow.exceptions import MlflowException
        run_id = self._id(op)
        if op["name"] in self.client.get_run(run_id).data.tags:
            try:
                self.client.delete_tag(run_id, op["name"])
            except MlflowException as e:   # gone between the read and the delete: done
                if getattr(e, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                    raise

    def _files(self, op: dict) -> None:
        run_id = self._id(op)
        with tempfile.TemporaryDirectory(prefix="fedsweep-") as tmp:
            for name, data in op["files"].items():   # a name may hold folders: plugins/mylab.py
                (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / name).write_bytes(data)
            self.client.log_artifacts(run_id, tmp)

    def _status(self, op: dict) -> None:
        self.client.update_run(self._id(op), status=op["status"])

    def _end(self, op: dict) -> None:
        self.client.set_terminated(self._id(op), status=op["status"])

    # -- keeping and replaying ------------------------------------------------------------------
    def save(self, folder: Path, cause: str | None = None) -> Path:
        """The writes still waiting (and the ids of the runs they name) into ``folder``, for
        :func:`load` and :func:`replay`; artifacts as files beside ``records.json``; ``cause``: why
        they wait. Returns the folder."""
        folder.mkdir(parents=True, exist_ok=True)
        with self._cv:
            ops = list(self.ops)
        kept = []
        for i, op in enumerate(ops):
            if op["op"] == "files":
                sub = folder / "files" / str(i)
                sub.mkdir(parents=True, exist_ok=True)
                for name, data in op["files"].items():
                    (sub / name).parent.mkdir(parents=True, exist_ok=True)
                    (sub / name).write_bytes(data)
                op = {**op, "files": sorted(op["files"])}
            kept.append(op)
        record = {"tracking_uri": self.uri, "ids": self.ids, "ops": kept,
                  "cause": cause or (self.failure[0] if self.failure else None)}
        tmp = folder / (RECORDS + ".tmp")
        tmp.write_text(json.dumps(record, default=str))
        tmp.replace(folder / RECORDS)
        return folder


def whole_rounds(rows: list[dict], limit: int = 1000) -> list[list[dict]]:
    """Rows in chunks of at most ``limit`` metrics (MLflow's per-call limit), each holding whole rounds."""
    chunks, part, size = [], [], 0
    for row in rows:
        n = sum(1 for k, v in row.items() if k != "round" and v is not None)
        if part and size + n > limit:
            chunks.append(part)
            part, size = [], 0
        part.append(row)
        size += n
    return [*chunks, part] if part else chunks


def _now() -> int:
    return int(time.time() * 1000)


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"
