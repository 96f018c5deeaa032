"""In the sweep's driver: what Tune's events become in MLflow and on the terminal.

- :class:`MlflowTrials` (``make_mlflow_callback``) is the only MLflow writer of a sweep: one child
  run per sweep trial (a pack's trials included), found again by its ``ray.trial_id`` and
  ``fedsweep.trial`` tags after a ``--resume``; metric rows written at most every ``FLUSH_SECONDS``
  per run, and all of them at its last report; at the end, the summary and artifacts the worker
  sent with its final report (or, for a stopped or failed trial, ones made from its last checkpoint
  in the sweep's storage). Nothing is read from a worker's disk: the driver may run elsewhere;
- a diverged trial (NaN/inf loss) ends normally with status ``diverged``; a crashed one is retried
  ``max_failures`` times and otherwise marked ``failed``; the sweep goes on either way;
- a run that should have a summary (finished, diverged, stopped) but whose summary and artifacts
  cannot be had ends ``incomplete`` (MLflow FAILED), with the reason as its ``fedsweep.error``:
  never as finished with nothing to score;
- the terminal's view of the sweep is :mod:`fedsweep.sweep.progress`'s.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from fedsweep.config.plugins import plugin_tags
from fedsweep.config.schema import RunConfig
from fedsweep.runs.tracking import MLFLOW_STATUS
from fedsweep.sweep.spec import config_label, drawn_payload
from fedsweep.sweep.trainable import trial_checkpoint

FINAL_STATUSES = ("finished", "stopped", "diverged", "failed", "incomplete")
# Metric rows reach MLflow at most this often per run (and all of them at its last report): a write
# costs the driver ~12 ms (one sqlite commit), the driver is the sweep's only MLflow writer, and a
# pack of 36 configs written every 2 s kept it busy half the time while the workers waited.
FLUSH_SECONDS = 10.0


#: The callback of each sweep this process drives, by its MLflow parent run: the driver closes its
#: writes when Tune returns (a restored sweep's callback is unpickled by Tune, not made here).
SWEEPS: dict[str, object] = {}


def make_mlflow_callback(uri: str, experiment_id: str, parent_id: str, sweep_name: str, store,
                         payloads: list[dict], units: list[list[int]], adopt: bool = False):
    """The driver-side MLflow writer (built lazily so importing fedsweep does not import Ray). One
    child run per sweep trial, a packed one's included: a Tune trial of a pack writes several.
    ``store``: the sweep's folder of the storage (:class:`fedsweep.sweep.storage.Storage`), where the
    trials keep their checkpoints. Writes go through a :class:`~fedsweep.runs.writer.Writer`: a store
    that fails mid-sweep never stops it (they wait, and are retried, or kept for ``--resume``).
    ``adopt``: a confirm look started anew after an interruption: a sweep trial's run from the
    look's first start, if any, is found by its index and continued (not made twice)."""
    from ray import tune

    class MlflowTrials(tune.Callback):
        # What Tune pickles into its experiment state; everything else belongs to one driver process.
        _KEPT = ("uri", "experiment_id", "parent_id", "sweep", "store", "payloads", "units")

        def __init__(self):
            self.uri, self.experiment_id, self.parent_id, self.sweep = uri, experiment_id, parent_id, sweep_name
            self.store, self.payloads, self.units = store, payloads, units
            self._reset()
            self.adopting = adopt

        def _reset(self, restored: bool = False):
            from fedsweep.runs.writer import Writer
            self.writer = Writer(self.uri, say=lambda line: print(f"[mlflow] {line.removeprefix('MLflow: ')}",
                                                                  file=sys.stderr, flush=True))
            self.writer.adopt(PARENT, self.parent_id)
            self.runs: dict[tuple, str] = {}        # (Tune trial id, sweep trial index) -> its writer key
            self.logged: dict[tuple, int] = {}      # -> last round logged or waiting in `pending`
            self.pending: dict[tuple, list] = {}    # -> rows not yet written
            self.flushed: dict[tuple, float] = {}   # -> when rows were last written
            self.closed: set[tuple] = set()         # runs that already hold their final result
            self.final: dict[tuple, str] = {}       # -> status of the member's last report
            self.errors: dict[tuple, str] = {}      # -> why a pack left the member out
            self.tracebacks: dict[tuple, str] = {}  # -> the traceback of the user's code that failed it
            self.engine_logged: set[tuple] = set()  # runs whose `engine_used` param is known
            self.engine_param: dict[tuple, str] = {}  # -> `engine_used`, not yet written
            self.drawn: dict[tuple, dict] = {}      # -> the artifacts of its final report (name -> bytes)
            self.ended: dict[int, tuple[str, str]] = {}   # sweep trial -> (status, error) it ended with here
            self.tune_trials: list = []             # Tune's trials, as of the experiment's end
            self.settled = False                    # a restored sweep's ended trials looked at (_settle)
            self.adopting = False                   # a restarted look's runs found by index (__init__'s adopt)
            # A restored sweep (`--resume`) finds its trials' runs in MLflow; a new one creates them.
            self.restored = restored
            # Imported here, not read as a global: cloudpickle copies a global the class's methods read
            # into Tune's pickle of this class, and this one holds the instance (a cycle that unpickles it
            # before its class has its methods, so without _reset).
            from fedsweep.sweep.callbacks import SWEEPS
            SWEEPS[self.parent_id] = self

        def __getstate__(self):
            return {k: getattr(self, k) for k in self._KEPT}

        def __setstate__(self, state):
            if "store" not in state:   # pickled by a fedsweep that kept checkpoints in a folder only
                from fedsweep.sweep.storage import Storage
                state["store"] = Storage(Path(state.pop("ckpt_dir")).parent)
            self.__dict__.update(state)
            self._reset(restored=True)

        @property
        def client(self):
            """For reads only (a restored sweep finding its runs); every write goes through the writer."""
            if getattr(self, "_client", None) is None:
                from mlflow import MlflowClient
                self._client = MlflowClient(tracking_uri=self.uri)
            return self._client

        def _run_for(self, trial, index: int) -> str:
            """The writer's key of sweep trial ``index``'s run (created, or found again after a resume)."""
            # `searcher: optuna`: the values drawn for the trial, in its payload from its first event on
            self.payloads[index] = drawn_payload(self.payloads[index], trial.config.get("sampled"))
            key = (trial.trial_id, index)
            if key in self.runs:
                return self.runs[key]
            run = self.runs[key] = f"{trial.trial_id}/{index}"
            adopting = self.adopting
            same_trial = "" if adopting else f"tags.`ray.trial_id` = '{trial.trial_id}' and "
            found = (self.restored or adopting) and self.client.search_runs(
                [self.experiment_id], filter_string=f"{same_trial}tags.`fedsweep.trial` = '{index}' and "
                f"tags.`mlflow.parentRunId` = '{self.parent_id}'", max_results=1)
            if found:
                run_id = found[0].info.run_id
                self.writer.adopt(run, run_id)
                if adopting:   # a later --resume finds it by the Tune trial that runs it now
                    self.writer.batch(run, tags={"ray.trial_id": trial.trial_id})
                status = found[0].data.tags.get("fedsweep.status")
                if status in ("finished", "diverged", "stopped"):
                    # Done before an interruption that Tune's last snapshot did not see: Tune
                    # replays the trial from its final checkpoint; its run must stay as it is,
                    # but ended (the driver may have been killed between its last write and that).
                    self.closed.add(key)
                    if found[0].info.status == "RUNNING":
                        self.writer.end(run, MLFLOW_STATUS[status])
                elif status in ("failed", "interrupted"):   # `--resume` retries them: reopen the run
                    self.writer.batch(run, tags={"fedsweep.status": "running"})
                    self.writer.delete_tag(run, "fedsweep.error")   # it goes on; a new failure says its own
                    self.writer.status(run, "RUNNING")
                history = self.client.get_metric_history(run_id, "train/loss")
                self.logged[key] = max((m.step for m in history), default=0)
                self._log_params(run, index, have=found[0].data.params)
            else:
                info = self.payloads[index]
                self.writer.open_run(run, experiment_id=self.experiment_id, name=info.get("name", info["label"]), tags={
                    "mlflow.parentRunId": self.parent_id, "fedsweep.role": "trial", "fedsweep.sweep": self.sweep,
                    "ray.trial_id": trial.trial_id, "fedsweep.trial": str(index), "fedsweep.method": info["method"],
                    "fedsweep.config_id": info["config_id"], "fedsweep.config": config_label(info),
                    "fedsweep.status": "running",
                    **({"fedsweep.draw": str(info["draw"])} if "draw" in info else {}),   # optuna's draw order
                    **({"fedsweep.stage": info["stage"]} if "stage" in info else {}),     # confirm runs
                    **plugin_tags(info.get("plugins", [])),
                    **({"fedsweep.pack": str(trial.config["trial"])} if len(self.units[trial.config["trial"]]) > 1
                       else {})}, params=self._params(index), config=info["run"])
                self.logged[key] = 0
            return run

        def _params(self, index: int) -> dict:
            """The trial's resolved config as params, but ``mlflow.*``: a trial logs nothing itself (its
            payload says ``mlflow.enabled: false``, the driver writes its run), so those keys would say
            what it did not do."""
            return {k: v for k, v in RunConfig(**self.payloads[index]["run"]).flat().items()
                    if not k.startswith("mlflow.")}

        def _log_params(self, run: str, index: int, have: dict | None = None):
            """The sweep trial's config as the run's params, those not in ``have``: a driver killed
            between creating a run and logging them (or between two batches of them) left a run
            without its learning rate or seed, which the resumed sweep fills in."""
            missing = {k: v for k, v in self._params(index).items() if k not in (have or {})}
            if missing:
                self.writer.batch(run, params=missing)

        def on_step_begin(self, iteration, trials, **info):
            if self.restored and not self.settled:
                self._settle(trials)

        def _settle(self, trials) -> None:
            """A resumed sweep's trials that Tune holds as ended, whose MLflow runs are not final (or do
            not exist): their driver was killed after Tune's snapshot and before its writes went through
            (a store locked, or a kill right after the ``[finished]`` line). Tune replays nothing of
            them, so they are finished here, before any trial runs, from their last checkpoint, which
            each trial writes to the storage before its final report: every round, the summary and
            the artifacts, as the driver would have written them."""
            self.settled = True
            settled = 0
            for trial in trials:
                if trial.status != "TERMINATED":   # the others Tune runs again, or retries (errored)
                    continue
                for index in self.units[trial.config["trial"]]:
                    key = (trial.trial_id, index)
                    self._run_for(trial, index)
                    if key in self.closed:
                        continue
                    part = (trial.last_result or {}).get("members", {}).get(str(index), {})
                    self._finish(trial, index, member_status(trial, index), part.get("error", ""))
                    settled += 1
            if settled:
                print(f"[mlflow] finishing the runs of {settled} trial(s) that ended before the sweep was "
                      "interrupted, from their checkpoints", file=sys.stderr, flush=True)

        def on_trial_start(self, iteration, trials, trial, **info):
            for index in self.units[trial.config["trial"]]:
                self._run_for(trial, index)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            for index, part in result.get("members", {}).items():
                key = (trial.trial_id, int(index))
                run = self._run_for(trial, int(index))
                if "resumed_from" in result and key not in self.closed:   # retried or resumed, from its checkpoint
                    self.writer.batch(run, tags={"fedsweep.resumed_from_round": str(result["resumed_from"])})
                done = self.logged.get(key, 0)
                rows = [r for r in part.get("rows", []) if r["round"] > done]
                if rows:
                    self.pending.setdefault(key, []).extend(rows)
                    self.logged[key] = rows[-1]["round"]
                if "artifacts" in part:   # out of the result: Tune keeps the last in its snapshots
                    self.drawn[key] = part.pop("artifacts")
                if "status" in part:
                    self.final[key] = part["status"]
                if part.get("error"):
                    self.errors[key] = part["error"]
                if "traceback" in part:   # the user's code raised: kept with the run (error.txt), not retried;
                    # setdefault: a callback restored from a sweep started before this attribute lacks it
                    self.__dict__.setdefault("tracebacks", {})[key] = part.pop("traceback")
                if part.get("engine") and key not in self.engine_logged:   # what `engine: auto` chose (and
                    self.engine_param[key] = (part["engine"], part.get("engine_why", ""))   # why, where it says)
                    self.engine_logged.add(key)                            # with the next rows written
                if "status" in part or time.time() - self.flushed.get(key, 0.0) >= FLUSH_SECONDS:
                    # A member's last report: its rows now, while its worker draws the artifacts,
                    # rather than at the run's close, which the worker's next trial waits for.
                    self.flush(key)

        def on_experiment_end(self, trials, **info):
            if self.restored and not self.settled:   # every trial had ended: Tune took no step
                self._settle(trials)
            self.tune_trials = list(trials)
            self.flush()            # Tune calls this after an interruption (Ctrl-C) too

        def flush(self, key=None, metrics: dict | None = None, tags: dict | None = None):
            """Hand the writer what waits for run ``key`` (every run's without one): its rows, its
            ``engine_used`` param, and ``metrics`` and ``tags`` given here. The rows go first: a run's
            summary and status never reach the store before every round it has."""
            for k in [key] if key is not None else list({*self.pending, *self.engine_param}):
                self.flushed[k] = time.time()
                self.writer.rows(self.runs[k], self.pending.pop(k, []))
                engine, why = self.engine_param.pop(k, (None, ""))
                params = {"engine_used": engine} if engine else {}
                both = {**(tags or {}), **({"fedsweep.engine_why": why} if why else {})}
                if params or metrics or both:
                    self.writer.batch(self.runs[k], metrics=metrics, params=params, tags=both or None)

        def on_trial_complete(self, iteration, trials, trial, **info):
            for index in self.units[trial.config["trial"]]:
                key = (trial.trial_id, index)
                self._finish(trial, index, self.final.get(key) or member_status(trial, index),
                             self.errors.get(key, ""))

        def on_trial_error(self, iteration, trials, trial, **info):
            error = trial_error(trial)
            for index in self.units[trial.config["trial"]]:
                self._finish(trial, index, "failed", error)

        def _finish(self, trial, index: int, status: str, error: str = ""):
            from fedsweep.runs.run import summarize
            from fedsweep.runs.tracking import run_tags, summary_metrics
            key = (trial.trial_id, index)
            run = self._run_for(trial, index)
            drawn = self.drawn.pop(key, None)
            if key in self.closed:   # a resumed sweep's run that was done before the interruption
                self.flush(key)
                return
            self.closed.add(key)
            tags, metrics, summary = {"fedsweep.status": status}, {}, None
            if status in ("finished", "diverged") and drawn and "summary.json" in drawn:
                summary = {**json.loads(drawn["summary.json"]), "status": status}
            else:   # stopped by a scheduler, or failed: what its last checkpoint holds
                cfg = RunConfig(**self.payloads[index]["run"])
                unit = self.units[trial.config["trial"]]
                history, client_log, why = self._checkpointed(trial, index if len(unit) > 1 else None, unit)
                if history:
                    summary = {**summarize(cfg, history, diverged=status == "diverged"), "status": status}
                    drawn = _artifacts_from(cfg, history, client_log, summary)
                    # rounds the checkpoint holds and no report brought (a killed driver's trial)
                    unsent = [r for r in history if r["round"] > self.logged.get(key, 0)]
                    if unsent:
                        self.pending.setdefault(key, []).extend(unsent)
                        self.logged[key] = unsent[-1]["round"]
                elif status != "failed":   # a run with a result, and nothing to show of it
                    last = "its final report carried none" if status != "stopped" else "stopped by the scheduler"
                    tags["fedsweep.status"] = status = "incomplete"
                    error = f"no summary or artifacts reached the driver ({last}; {why})"
            if summary is not None:
                metrics = {m.key: m.value for m in summary_metrics(summary, 0)}
                self.writer.files(run, drawn)
                tags = run_tags(summary)
            if error:
                tags["fedsweep.error"] = error[:5000]
            if key in getattr(self, "tracebacks", {}):
                self.writer.files(run, {"error.txt": self.tracebacks.pop(key).encode()})
            self.ended[index] = (status, error)
            self.flush(key, metrics=metrics, tags=tags)   # rows still waiting, then the summary and the status
            self.writer.end(run, MLFLOW_STATUS[status])

        def close_open_runs(self) -> int:
            """The runs this driver opened and did not end (Ctrl-C, or Tune stopped on a fault):
            ``interrupted``, KILLED; ``--resume`` reopens them. Returns how many."""
            open_ = [k for k in self.runs if k not in self.closed]
            for key in open_:
                self.flush(key, tags={"fedsweep.status": "interrupted"})
                self.writer.end(self.runs[key], MLFLOW_STATUS["interrupted"])
                self.closed.add(key)
            return len(open_)

        def _checkpointed(self, trial, member: int | None, unit: list[int]) -> tuple[list, list, str]:
            """(history, client log, '') of a trial's checkpoint in the storage (of sweep trial
            ``member`` of a pack's), or ([], [], why there are none)."""
            rel = trial_checkpoint(trial.trial_id)
            try:
                with self.store.reading(rel) as path:
                    if path is None:
                        return [], [], f"no checkpoint at {self.store.where(rel)}"
                    history, client_log = _records_from_checkpoint(path, member, unit)
            except Exception as e:  # noqa: BLE001 - a storage that went away: said in the run's error
                return [], [], f"its checkpoint at {self.store.where(rel)} could not be read: {type(e).__name__}: {e}"
            return history, client_log, "" if history else f"its checkpoint at {self.store.where(rel)} holds no rounds"

    return MlflowTrials()


#: The writer's key of a sweep's parent run.
PARENT = "parent"


def _artifacts_from(cfg: RunConfig, history: list[dict], client_log: list[dict], summary: dict) -> dict[str, bytes]:
    """The artifacts of a run known only by its checkpointed records (a stopped or failed trial)."""
    from fedsweep.sweep.trainable import artifact_files
    return artifact_files(cfg, _HistoryOnly(history, client_log), summary)


class _HistoryOnly:
    """What write_artifacts needs of a module when only the checkpointed records are at hand."""

    def __init__(self, history, client_log=()):
        self.history, self.client_log = history, list(client_log)


def _records_from_checkpoint(path: Path, member: int | None = None,
                             unit: list[int] = ()) -> tuple[list[dict], list[dict]]:
    """(metric history, per-client log) of a trial's checkpoint file, or of sweep trial ``member``
    in a pack's (its members' sweep trials are in the checkpoint; one written before they were is
    the whole ``unit``)."""
    import torch
    ckpt = torch.load(path, weights_only=True, map_location="cpu")
    if member is None:
        state = ckpt["fedsweep"]
    else:
        pack = ckpt["fedsweep_pack"]
        ids = list(pack.get("ids", unit))
        if member not in ids:
            return [], []
        state = pack["members"][ids.index(member)]
    return list(state["history"]), list(state.get("client_log", []))


def trial_error(trial) -> str:
    """The last line of a failed Tune trial's traceback (Tune's error.txt): the exception and its
    message; a fedsweep ConfigError as its one line alone, naming the key."""
    try:
        lines = Path(trial.error_file).read_text(errors="replace").strip().splitlines()
    except (OSError, TypeError):
        return "the trial crashed (no error file)"
    last = next((line.strip() for line in reversed(lines) if line.strip()), "the trial crashed")
    return last.removeprefix("fedsweep.util.errors.ConfigError: ")


def member_status(trial, index: int) -> str:
    """How sweep trial ``index`` of a completed Tune trial ended: its final report's status (finished
    or diverged), else ``stopped`` (a scheduler ended it before its last round)."""
    last = trial.last_result or {}
    part = last.get("members", {}).get(str(index), {})
    return part.get("status", "stopped") if last.get("fedsweep_done") else "stopped"
