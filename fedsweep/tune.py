"""``fedsweep tune``: a sweep file -> Ray Tune trials -> MLflow parent/child runs (DESIGN.md §5).

Layout of the work (measured choices in shared/NOTES-stack.md):

- one function trainable per trial, running the same Lightning path as ``fedsweep run``
  (:func:`fedsweep.run.train`); it reports at every evaluation (so ASHA can stop it) and keeps its
  Lightning checkpoint at a stable path, ``<sweep>/trial_checkpoints/<trial id>.ckpt`` (replaced
  atomically), so a retried or resumed trial continues from there. Tune is given no checkpoints:
  its experiment snapshot can name a checkpoint it has already rotated away, and a sweep killed in
  that window could not restore the trial;
- only the driver writes to MLflow (:class:`MlflowTrials`, a ``tune.Callback``): one child run
  per trial, found again by its ``ray.trial_id`` tag after a retry or a ``--resume``, metrics in
  one ``log_batch`` per report, artifacts from the trial's last checkpoint at the end;
- a diverged trial (NaN/inf loss) ends normally with status ``diverged``; a crashed one is retried
  ``max_failures`` times and otherwise marked ``failed``; the sweep goes on either way.
"""
from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

from fedsweep.config import ConfigError, RunConfig
from fedsweep.sweep import SweepConfig, Trial, check_report, expand, load_sweep, trial_table

STATE_FILE = "fedsweep_sweep.json"
# The trials' resolved configs, written when a sweep starts: Tune's grid holds only their indices
# (a grid of thousands of full configs costs Tune quadratic time to expand), and `--resume` runs
# exactly the trials the sweep started with, even if the sweep file was edited since.
TRIALS_FILE = "fedsweep_trials.json"
# A trial's `fedsweep.status` tag, and the MLflow run status it ends with. A diverged trial ran to
# its end but its numbers are not usable: FAILED, so the MLflow UI's status column says so. An
# interrupted one (Ctrl-C) is KILLED until `--resume` reopens it.
MLFLOW_STATUS = {"finished": "FINISHED", "stopped": "FINISHED", "diverged": "FAILED", "failed": "FAILED",
                 "interrupted": "KILLED"}
FINAL_STATUSES = ("finished", "stopped", "diverged", "failed")


# ---------------------------------------------------------------------------------------------
# Inside a trial (a Ray worker process)
# ---------------------------------------------------------------------------------------------

def trial_checkpoint(ckpt_dir: str | Path, trial_id: str) -> Path:
    return Path(ckpt_dir) / f"{trial_id}.ckpt"


def _tune_reporter(checkpoint_every: int, ckpt_path: Path):
    import lightning as L

    class TuneReporter(L.Callback):
        """Reports each evaluation to Tune with the rows since the last report (and a checkpoint)."""

        def __init__(self):
            # History rows already reported. A resumed trial starts at 0 and re-sends what its
            # checkpoint restored: the checkpoint may be newer than the last report the driver
            # logged, and the driver drops rounds it already has.
            self.sent = 0
            self.evals = 0

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            # The last round is reported once, after fit, with the summary: a scheduler may stop the
            # trial at any report, and the one it sees at the end must already say "done".
            last_round = module.rounds_done == module.cfg.rounds
            if "test/accuracy" in module.history[-1] and not module.diverged and not last_round:
                self.evals += 1
                self.report(trainer, module, checkpoint=self.evals % checkpoint_every == 0)

        def report(self, trainer, module, checkpoint: bool, final: dict | None = None):
            from ray import tune
            rows = module.history[self.sent:]
            self.sent = len(module.history)
            last = module.history[-1] if module.history else {}
            evals = [h for h in module.history if "test/accuracy" in h]
            metrics = {"round": last.get("round", 0), "rows": rows,
                       "test/accuracy": evals[-1]["test/accuracy"] if evals else 0.0,
                       "test/loss": evals[-1]["test/loss"] if evals else math.inf,
                       "best/test_accuracy": max((h["test/accuracy"] for h in evals), default=0.0),
                       **(final or {})}
            if checkpoint:   # before the report: the driver reads it when the trial completes
                ckpt_path.parent.mkdir(parents=True, exist_ok=True)
                tmp = ckpt_path.with_suffix(".tmp")
                trainer.save_checkpoint(tmp)
                tmp.replace(ckpt_path)
            tune.report(metrics)

    return TuneReporter()


def run_trial(config: dict, payloads: list[dict]) -> None:
    """The Ray Tune function trainable: one federated run (``payloads[config["trial"]]``), resumed
    from its checkpoint if any."""
    from ray import tune

    from fedsweep.run import summarize, train
    cfg = RunConfig(**payloads[config["trial"]]["run"])
    ckpt = trial_checkpoint(config["ckpt_dir"], tune.get_context().get_trial_id())
    reporter = _tune_reporter(config["checkpoint_every"], ckpt)
    module = train(cfg, progress=False, resume=ckpt if ckpt.is_file() else None, callbacks=[reporter])
    summary = summarize(cfg, module.history, module.diverged)
    final = {"fedsweep_done": True, "status": summary["status"],
             **{f"summary/{k}": v for k, v in summary.items() if isinstance(v, (int, float)) and v is not None
                and not isinstance(v, bool)}}
    reporter.report(module.trainer, module, checkpoint=True, final=final)


# ---------------------------------------------------------------------------------------------
# In the driver
# ---------------------------------------------------------------------------------------------

def make_mlflow_callback(uri: str, experiment_id: str, parent_id: str, sweep_name: str, ckpt_dir: str,
                         payloads: list[dict]):
    """The driver-side MLflow writer (built lazily so importing fedsweep does not import Ray)."""
    from ray import tune

    class MlflowTrials(tune.Callback):
        def __init__(self):
            self.uri, self.experiment_id, self.parent_id, self.sweep = uri, experiment_id, parent_id, sweep_name
            self.ckpt_dir, self.payloads = ckpt_dir, payloads
            self.runs: dict[str, str] = {}          # trial_id -> MLflow run id
            self.logged: dict[str, int] = {}        # trial_id -> last round logged
            self.closed: set[str] = set()           # trials whose run already holds its final result

        def __getstate__(self):                      # pickled into Tune's experiment state
            return {k: v for k, v in self.__dict__.items() if k not in ("runs", "logged", "closed", "_client")}

        def __setstate__(self, state):
            self.__dict__.update(state)
            self.runs, self.logged, self.closed = {}, {}, set()

        @property
        def client(self):
            if getattr(self, "_client", None) is None:
                from mlflow import MlflowClient
                self._client = MlflowClient(tracking_uri=self.uri)
            return self._client

        def _run_for(self, trial) -> str:
            if trial.trial_id in self.runs:
                return self.runs[trial.trial_id]
            found = self.client.search_runs(
                [self.experiment_id], filter_string=f"tags.`ray.trial_id` = '{trial.trial_id}' and "
                f"tags.`mlflow.parentRunId` = '{self.parent_id}'", max_results=1)
            if found:
                run_id = found[0].info.run_id
                status = found[0].data.tags.get("fedsweep.status")
                if status in ("finished", "diverged", "stopped"):
                    # Done before an interruption that Tune's last snapshot did not see: Tune
                    # replays the trial from its final checkpoint; its run must stay as it is.
                    self.closed.add(trial.trial_id)
                elif status in ("failed", "interrupted"):   # `--resume` retries them: reopen the run
                    self.client.set_tag(run_id, "fedsweep.status", "running")
                    self.client.update_run(run_id, status="RUNNING")
                history = self.client.get_metric_history(run_id, "train/loss")
                self.logged[trial.trial_id] = max((m.step for m in history), default=0)
            else:
                info = self.payloads[trial.config["trial"]]
                cfg = RunConfig(**info["run"])
                run_id = self.client.create_run(self.experiment_id, run_name=info["label"], tags={
                    "mlflow.parentRunId": self.parent_id, "fedsweep.role": "trial", "fedsweep.sweep": self.sweep,
                    "ray.trial_id": trial.trial_id, "fedsweep.method": info["method"],
                    "fedsweep.config_id": info["config_id"], "fedsweep.status": "running"}).info.run_id
                from mlflow.entities import Param
                params = [Param(k, str(v)[:6000]) for k, v in cfg.flat().items()]
                for i in range(0, len(params), 100):
                    self.client.log_batch(run_id, params=params[i:i + 100])
                self.logged[trial.trial_id] = 0
            self.runs[trial.trial_id] = run_id
            return run_id

        def on_trial_start(self, iteration, trials, trial, **info):
            self._run_for(trial)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            from fedsweep.tracking import metrics_of
            run_id = self._run_for(trial)
            done = self.logged.get(trial.trial_id, 0)
            rows = [r for r in result.get("rows", []) if r["round"] > done]
            if rows:
                metrics = metrics_of(rows, int(time.time() * 1000))
                for i in range(0, len(metrics), 1000):
                    self.client.log_batch(run_id, metrics=metrics[i:i + 1000])
                self.logged[trial.trial_id] = rows[-1]["round"]

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._finish(trial, completed_status(trial))

        def on_trial_error(self, iteration, trials, trial, **info):
            self._finish(trial, "failed")

        def _finish(self, trial, status: str):
            from mlflow.entities import RunTag

            from fedsweep.run import summarize, write_artifacts
            from fedsweep.tracking import run_tags, summary_metrics
            run_id = self._run_for(trial)
            if trial.trial_id in self.closed:
                return
            self.closed.add(trial.trial_id)
            cfg = RunConfig(**self.payloads[trial.config["trial"]]["run"])
            history, client_log = _records_from_checkpoint(trial_checkpoint(self.ckpt_dir, trial.trial_id))
            tags = {"fedsweep.status": status}
            if history:
                summary = summarize(cfg, history, diverged=status == "diverged")
                summary["status"] = status
                self.client.log_batch(run_id, metrics=summary_metrics(summary, int(time.time() * 1000)))
                with tempfile.TemporaryDirectory() as tmp:
                    write_artifacts(cfg.model_copy(update={"mlflow": cfg.mlflow.model_copy(update={"log_model": False})}),
                                    _HistoryOnly(history, client_log), summary, Path(tmp))
                    self.client.log_artifacts(run_id, tmp)
                tags = run_tags(summary)
            self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
            self.client.set_terminated(run_id, status=MLFLOW_STATUS[status])

    return MlflowTrials()


class _HistoryOnly:
    """What write_artifacts needs of a module when only the checkpointed records are at hand."""

    def __init__(self, history, client_log=()):
        self.history, self.client_log = history, list(client_log)


def _records_from_checkpoint(path: Path) -> tuple[list[dict], list[dict]]:
    """(metric history, per-client log) of a trial's checkpoint; empty if there is none."""
    import torch
    if not path.is_file():
        return [], []
    state = torch.load(path, weights_only=True, map_location="cpu")["fedsweep"]
    return list(state["history"]), list(state.get("client_log", []))


def completed_status(trial) -> str:
    """How a trial that completed ended: its final report's status (finished or diverged), else
    ``stopped`` (a scheduler ended it before its last round)."""
    last = trial.last_result or {}
    return last.get("status", "stopped") if last.get("fedsweep_done") else "stopped"


def trial_status(trial) -> str:
    """fedsweep's word for where a Tune trial stands: pending, running, finished, diverged, stopped
    or failed."""
    if trial.status == "TERMINATED":
        return completed_status(trial)
    return "failed" if trial.status == "ERROR" else trial.status.lower()


def make_progress_callback(payloads: list[dict], stream=None):
    """A live view of the whole sweep: one line per finished trial and a status line every 10 s.
    Counts come from Tune's list of every trial, so a resumed sweep counts what ran before too."""
    from ray import tune

    class Progress(tune.Callback):
        def __init__(self):
            self.total, self.best, self.last_print = len(payloads), None, 0.0

        def _label(self, trial) -> str:
            return payloads[trial.config["trial"]]["label"]

        def _line(self, trials) -> str:
            counts: dict[str, int] = {}
            for t in trials:
                s = trial_status(t)
                counts[s] = counts.get(s, 0) + 1
            parts = [f"{v} {k}" for k, v in sorted(counts.items())]
            best = f" | best {self.best[0]:.4f} ({self.best[1]})" if self.best else ""
            return f"[sweep] {self.total} trials: {', '.join(parts)}{best}"

        def _print(self, text):
            print(text, file=stream or sys.stderr, flush=True)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            acc = result.get("best/test_accuracy")
            if acc is not None and (self.best is None or acc > self.best[0]):
                self.best = (acc, self._label(trial))
            if time.time() - self.last_print > 10:
                self.last_print = time.time()
                self._print(self._line(trials))

        def on_trial_complete(self, iteration, trials, trial, **info):
            last = trial.last_result or {}
            acc = last.get("best/test_accuracy", float("nan"))
            self._print(f"[{completed_status(trial)}] {self._label(trial)}: best acc {acc:.4f} "
                        f"after {last.get('round', 0)} rounds")

        def on_trial_error(self, iteration, trials, trial, **info):
            self._print(f"[failed] {self._label(trial)} (see {trial.local_path})")

        def on_experiment_end(self, trials, **info):
            self._print(self._line(trials))

    return Progress()


# ---------------------------------------------------------------------------------------------
# The sweep
# ---------------------------------------------------------------------------------------------

def _trial_payload(t: Trial, sweep: SweepConfig) -> dict:
    run = t.config.model_dump(mode="json")
    run["mlflow"]["enabled"] = False                       # the driver writes MLflow
    if run["device"] == "auto" and sweep.resources.gpu == 0:
        run["device"] = "cpu"                              # Ray leaves CUDA visible to CPU trials
    for key in ("root", ):                                 # trials run in Ray's working dirs
        if run["data"].get(key):
            run["data"][key] = str(Path(run["data"][key]).resolve())
    if run["heterogeneity"].get("trace"):
        run["heterogeneity"]["trace"] = str(Path(run["heterogeneity"]["trace"]).resolve())
    return {"run": run, "method": t.method, "seed": t.seed, "config_id": t.config_id, "label": t.label,
            "index": t.index}


def storage_dir(sweep: SweepConfig, root: str | Path | None = None) -> Path:
    return (Path(root) if root else Path.cwd() / "fedsweep_runs").resolve()


def _discard(exp_dir: Path, state_path: Path) -> None:
    """Delete a finished or restarted sweep's folder, and only a folder fedsweep made: its state
    file must be inside. Anything else under that name is the user's, and is left alone."""
    if not state_path.is_file():
        raise ConfigError(f"{exp_dir} exists and was not made by fedsweep (no {STATE_FILE} inside); it is left "
                          "as it is: give the sweep another `name`, or another --storage")
    shutil.rmtree(exp_dir)


def tune_sweep(path: str | Path, *, resume: bool = False, restart: bool = False, address: str | None = None,
               dry_run: bool = False, storage: str | Path | None = None, out=None) -> dict:
    """Run (or resume) a sweep; returns counts of trial outcomes and the MLflow parent run id.

    Everything that can be checked is checked before anything is written: the sweep file, the
    cluster (reachable, same authentication mode), the storage folder and the MLflow store. A
    second driver of a running sweep is refused (:class:`~fedsweep.locks.SweepLock`); one that
    finds the lock of a killed driver ends what that driver's local Ray instance left running."""
    from fedsweep.paths import check_writable_dir
    from fedsweep.tracking import check_store
    out = out or sys.stdout
    sweep = load_sweep(path)
    trials = expand(sweep, source=str(path))
    check_report(sweep, trials, source=str(path))   # a typo here would only surface after the sweep
    if dry_run:
        print(f"{sweep.name}: {len(trials)} trials", file=out)
        print(trial_table(trials), file=out)
        return {"trials": len(trials)}

    mode = None
    if address:
        from fedsweep.cluster import check_cluster
        mode = check_cluster(address)                  # reachable, and in the head's auth mode
    root = storage_dir(sweep, storage)
    check_writable_dir(root, "--storage")
    uri = check_store(sweep.mlflow.tracking_uri or sweep.base.get("mlflow", {}).get("tracking_uri"))
    exp_dir = root / sweep.name
    state_path = exp_dir / STATE_FILE
    if resume and not state_path.is_file():
        raise ConfigError(f"--resume: no sweep {sweep.name!r} to resume under {root}")
    if resume and not (exp_dir / TRIALS_FILE).is_file():
        raise ConfigError(f"--resume: {exp_dir} was made by an older fedsweep (no {TRIALS_FILE}); "
                          "start it over with --restart")

    from fedsweep.locks import SweepLock, end_leftovers
    with SweepLock(root / f"{sweep.name}.lock", sweep.name) as lock:
        stale = lock.acquire()
        ended = end_leftovers(stale) if stale else []
        if ended:
            print(f"ended {len(ended)} Ray processes left by a killed fedsweep driver (pid {stale.get('pid')})",
                  file=sys.stderr)
        if not resume and exp_dir.exists():
            state = json.loads(state_path.read_text()) if state_path.is_file() else {}
            if state.get("finished") or restart or not state_path.is_file():
                _discard(exp_dir, state_path)          # refuses a folder that is not a fedsweep sweep's
            else:
                raise ConfigError(f"sweep {sweep.name!r} has an unfinished run in {exp_dir}; continue it with "
                                  f"--resume, or start over with --restart")
        return _run_sweep(sweep, trials, Path(path), root, uri, resume=resume, address=address, mode=mode,
                          lock=lock)


def _run_sweep(sweep: SweepConfig, trials: list[Trial], path: Path, root: Path, uri: str, *, resume: bool,
               address: str | None, mode: str | None, lock) -> dict:
    from fedsweep.cluster import ray_session
    from fedsweep.run import quiet_logs
    from fedsweep.tracking import open_experiment
    quiet_logs()
    exp_dir = root / sweep.name
    state_path = exp_dir / STATE_FILE
    with ray_session(address, mode=mode) as session:
        lock.write(ray_session=session)   # what a driver taking over after a SIGKILL must end
        from ray import tune
        experiment = sweep.mlflow.experiment or sweep.name
        client, exp_id = open_experiment(uri, experiment)
        if resume:
            state = json.loads(state_path.read_text())
            parent_id = state["parent_run_id"]
            payloads = json.loads((exp_dir / TRIALS_FILE).read_text())
            client.set_terminated(parent_id, status="RUNNING")
            tuner = tune.Tuner.restore(str(exp_dir), trainable=_trainable(sweep, payloads), resume_errored=True)
        else:
            parent_id = _create_parent(client, exp_id, sweep, trials, path)
            exp_dir.mkdir(parents=True, exist_ok=True)
            payloads = [_trial_payload(t, sweep) for t in trials]
            (exp_dir / TRIALS_FILE).write_text(json.dumps(payloads))
            state_path.write_text(json.dumps({"parent_run_id": parent_id, "tracking_uri": uri,
                                              "experiment": experiment, "finished": False}))
            tuner = _new_tuner(sweep, payloads, root, uri, exp_id, parent_id)
        total = len(payloads)
        print(f"{sweep.name}: {total} trials; MLflow experiment {experiment!r} at {uri}", file=sys.stderr)
        tuner.fit()
        interrupted = _close_interrupted(client, exp_id, parent_id)
        counts = _outcomes(client, exp_id, parent_id)
        unfinished = max(total - sum(counts.get(s, 0) for s in FINAL_STATUSES), 0)
        state = json.loads(state_path.read_text())
        state["finished"] = unfinished == 0
        state_path.write_text(json.dumps(state))
        client.set_terminated(parent_id, status="FINISHED" if unfinished == 0 else "KILLED")
        return {"trials": total, "parent_run_id": parent_id, "tracking_uri": uri, "experiment": experiment,
                "unfinished": unfinished, "interrupted_runs": interrupted, **counts}


def _trainable(sweep: SweepConfig, payloads: list[dict]):
    """``run_trial`` with the trials' configs put once into Ray's object store (every node reads them
    there) and each trial's resources."""
    from ray import tune
    return tune.with_resources(tune.with_parameters(run_trial, payloads=payloads),
                               {"cpu": sweep.resources.cpu, "gpu": sweep.resources.gpu})


def _new_tuner(sweep, payloads, root, uri, exp_id, parent_id):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    scheduler = None
    if sweep.scheduler is not None:
        s = sweep.scheduler
        scheduler = ASHAScheduler(time_attr="round", metric=s.metric, mode=s.mode, grace_period=s.grace_period,
                                  reduction_factor=s.reduction_factor,
                                  max_t=max(p["run"]["rounds"] for p in payloads))
    ckpt_dir = str(root / sweep.name / "trial_checkpoints")
    param_space = {"trial": tune.grid_search(list(range(len(payloads)))),
                   "checkpoint_every": sweep.checkpoint_every, "ckpt_dir": ckpt_dir}
    return tune.Tuner(
        _trainable(sweep, payloads), param_space=param_space,
        tune_config=tune.TuneConfig(scheduler=scheduler, reuse_actors=True,
                                    max_concurrent_trials=sweep.max_concurrent),
        run_config=tune.RunConfig(
            name=sweep.name, storage_path=str(root), verbose=0,
            failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
            callbacks=[make_mlflow_callback(uri, exp_id, parent_id, sweep.name, ckpt_dir, payloads),
                       make_progress_callback(payloads)]))


def _create_parent(client, exp_id: str, sweep: SweepConfig, trials: list[Trial], path: Path) -> str:
    from mlflow.entities import Param
    run = client.create_run(exp_id, run_name=sweep.name, tags={"fedsweep.role": "sweep",
                                                               "fedsweep.sweep": sweep.name})
    params = [Param("sweep.trials", str(len(trials))), Param("sweep.seeds", str(sweep.seeds)),
              Param("sweep.methods", ",".join(sorted({t.method for t in trials}))),
              *[Param(f"sweep.grid.{k}", str(v)[:6000]) for k, v in sweep.grid.items()]]
    client.log_batch(run.info.run_id, params=params[:100])
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(path, Path(tmp) / "sweep.yaml")
        client.log_artifact(run.info.run_id, str(Path(tmp) / "sweep.yaml"))
    return run.info.run_id


def _close_interrupted(client, exp_id: str, parent_id: str) -> int:
    """After Ctrl-C: trials still open become KILLED (tag ``interrupted``); ``--resume`` reopens them."""
    from mlflow.entities import RunTag
    runs = client.search_runs([exp_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}' and "
                              "tags.`fedsweep.status` = 'running'", max_results=50_000)
    for r in runs:
        client.log_batch(r.info.run_id, tags=[RunTag("fedsweep.status", "interrupted")])
        client.set_terminated(r.info.run_id, status=MLFLOW_STATUS["interrupted"])
    return len(runs)


def _outcomes(client, exp_id: str, parent_id: str) -> dict[str, int]:
    runs = client.search_runs([exp_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'",
                              max_results=50_000)
    counts: dict[str, int] = {}
    for r in runs:
        s = r.data.tags.get("fedsweep.status", "running")
        counts[s] = counts.get(s, 0) + 1
    return counts
