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
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fedsweep.config import ConfigError, RunConfig
from fedsweep.sweep import SweepConfig, Trial, check_report, expand, load_sweep, trial_table

STATE_FILE = "fedsweep_sweep.json"


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


def run_trial(config: dict) -> None:
    """The Ray Tune function trainable: one federated run, resumed from Tune's checkpoint if any."""
    from ray import tune

    from fedsweep.run import summarize, train
    cfg = RunConfig(**config["trial"]["run"])
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

def make_mlflow_callback(uri: str, experiment_id: str, parent_id: str, sweep_name: str, ckpt_dir: str):
    """The driver-side MLflow writer (built lazily so importing fedsweep does not import Ray)."""
    from ray import tune

    class MlflowTrials(tune.Callback):
        def __init__(self):
            self.uri, self.experiment_id, self.parent_id, self.sweep = uri, experiment_id, parent_id, sweep_name
            self.ckpt_dir = ckpt_dir
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
                elif status == "failed":       # `--resume` retries errored trials: reopen the run
                    self.client.set_tag(run_id, "fedsweep.status", "running")
                    self.client.update_run(run_id, status="RUNNING")
                history = self.client.get_metric_history(run_id, "train/loss")
                self.logged[trial.trial_id] = max((m.step for m in history), default=0)
            else:
                info = trial.config["trial"]
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
            last = trial.last_result or {}
            status = last.get("status", "stopped") if last.get("fedsweep_done") else "stopped"
            self._finish(trial, status, "FINISHED")

        def on_trial_error(self, iteration, trials, trial, **info):
            self._finish(trial, "failed", "FAILED")

        def _finish(self, trial, status: str, mlflow_status: str):
            from mlflow.entities import Metric, RunTag

            from fedsweep.run import summarize, write_artifacts
            run_id = self._run_for(trial)
            if trial.trial_id in self.closed:
                return
            self.closed.add(trial.trial_id)
            cfg = RunConfig(**trial.config["trial"]["run"])
            history, client_log = _records_from_checkpoint(trial_checkpoint(self.ckpt_dir, trial.trial_id))
            now = int(time.time() * 1000)
            if history:
                summary = summarize(cfg, history, diverged=status == "diverged")
                summary["status"] = status
                metrics = [Metric(f"summary/{k}", float(v), now, 0) for k, v in summary.items()
                           if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))]
                if summary["best_test_accuracy"] is not None:
                    metrics.append(Metric("best/test_accuracy", float(summary["best_test_accuracy"]), now, 0))
                if summary["rounds_to_target"] is not None:
                    metrics.append(Metric("rounds_to_target", float(summary["rounds_to_target"]), now, 0))
                self.client.log_batch(run_id, metrics=metrics)
                with tempfile.TemporaryDirectory() as tmp:
                    write_artifacts(cfg.model_copy(update={"mlflow": cfg.mlflow.model_copy(update={"log_model": False})}),
                                    _HistoryOnly(history, client_log), summary, Path(tmp))
                    self.client.log_artifacts(run_id, tmp)
            self.client.log_batch(run_id, tags=[RunTag("fedsweep.status", status)])
            self.client.set_terminated(run_id, status=mlflow_status)

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


def make_progress_callback(total: int, stream=None):
    """A live view of the sweep: one line per finished trial and a status line every 10 s."""
    from ray import tune

    class Progress(tune.Callback):
        def __init__(self):
            self.total, self.best, self.state, self.last_print = total, None, {}, 0.0

        def _line(self) -> str:
            counts: dict[str, int] = {}
            for s in self.state.values():
                counts[s] = counts.get(s, 0) + 1
            parts = [f"{v} {k}" for k, v in sorted(counts.items())]
            best = f" | best {self.best[0]:.4f} ({self.best[1]})" if self.best else ""
            return f"[sweep] {sum(counts.values())}/{self.total} started: {', '.join(parts)}{best}"

        def _print(self, text):
            print(text, file=stream or sys.stderr, flush=True)

        def on_trial_start(self, iteration, trials, trial, **info):
            self.state[trial.trial_id] = "running"

        def on_trial_result(self, iteration, trials, trial, result, **info):
            acc = result.get("best/test_accuracy")
            if acc is not None and (self.best is None or acc > self.best[0]):
                self.best = (acc, trial.config["trial"]["label"])
            if time.time() - self.last_print > 10:
                self.last_print = time.time()
                self._print(self._line())

        def on_trial_complete(self, iteration, trials, trial, **info):
            last = trial.last_result or {}
            status = last.get("status", "stopped") if last.get("fedsweep_done") else "stopped"
            self.state[trial.trial_id] = status
            acc = last.get("best/test_accuracy", float("nan"))
            self._print(f"[{status}] {trial.config['trial']['label']}: best acc {acc:.4f} "
                        f"after {last.get('round', 0)} rounds")

        def on_trial_error(self, iteration, trials, trial, **info):
            self.state[trial.trial_id] = "failed"
            self._print(f"[failed] {trial.config['trial']['label']} (see {trial.local_path})")

        def on_experiment_end(self, trials, **info):
            self._print(self._line())

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


def _init_ray(address: str | None, num_cpus: int | None = None):
    import logging

    import ray
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # Small trials checkpoint often; Ray warns about snapshot frequency on every one of them.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    for name in ("ray", "ray.tune", "ray.train"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "1")
    if address:
        os.environ.setdefault("RAY_AUTH_MODE", "token")
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        except Exception as e:  # noqa: BLE001 - shown to the user in one line
            raise ConfigError(f"--address {address}: cannot connect to the Ray cluster ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''})") from None
    else:
        ray.init(address="local", include_dashboard=False, log_to_driver=False, num_cpus=num_cpus,
                 logging_level=logging.ERROR)


def _check_reachable(address: str, timeout: float = 3.0) -> None:
    """Fail in seconds, in one line, where Ray itself would retry a dead address for minutes."""
    import socket
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address}: expected HOST:PORT, e.g. 127.0.0.1:6379")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise ConfigError(f"--address {address}: no Ray head answers there ({e.strerror or e}); start one "
                          f"with `ray start --head --port {port}`") from None


def tune_sweep(path: str | Path, *, resume: bool = False, restart: bool = False, address: str | None = None,
               dry_run: bool = False, storage: str | Path | None = None, out=None) -> dict:
    """Run (or resume) a sweep; returns counts of trial outcomes and the MLflow parent run id."""
    out = out or sys.stdout
    sweep = load_sweep(path)
    trials = expand(sweep, source=str(path))
    check_report(sweep, trials, source=str(path))   # a typo here would only surface after the sweep
    if dry_run:
        print(f"{sweep.name}: {len(trials)} trials", file=out)
        print(trial_table(trials), file=out)
        return {"trials": len(trials)}

    if address:
        _check_reachable(address)   # before anything is created
    from fedsweep.run import quiet_logs
    from fedsweep.tracking import get_or_create_experiment, resolve_tracking_uri
    quiet_logs()
    root = storage_dir(sweep, storage)
    exp_dir = root / sweep.name
    state_path = exp_dir / STATE_FILE
    if resume and not state_path.is_file():
        raise ConfigError(f"--resume: no sweep {sweep.name!r} to resume under {root}")
    if not resume and exp_dir.exists():
        state = json.loads(state_path.read_text()) if state_path.is_file() else {}
        if state.get("finished") or restart:
            shutil.rmtree(exp_dir)
        else:
            raise ConfigError(f"sweep {sweep.name!r} has an unfinished run in {exp_dir}; continue it with "
                              f"--resume, or start over with --restart")

    from mlflow import MlflowClient
    uri = resolve_tracking_uri(sweep.mlflow.tracking_uri or sweep.base.get("mlflow", {}).get("tracking_uri"))
    client = MlflowClient(tracking_uri=uri)
    experiment = sweep.mlflow.experiment or sweep.name
    exp_id = get_or_create_experiment(client, experiment, uri)

    import ray
    from ray import tune
    _init_ray(address)
    try:
        if resume:
            state = json.loads(state_path.read_text())
            parent_id = state["parent_run_id"]
            client.set_terminated(parent_id, status="RUNNING")
            tuner = tune.Tuner.restore(str(exp_dir), trainable=_trainable(sweep), resume_errored=True)
        else:
            parent_id = _create_parent(client, exp_id, sweep, trials, Path(path))
            exp_dir.mkdir(parents=True, exist_ok=True)
            state_path.write_text(json.dumps({"parent_run_id": parent_id, "tracking_uri": uri,
                                              "experiment": experiment, "finished": False}))
            tuner = _new_tuner(sweep, trials, root, uri, exp_id, parent_id)
        print(f"{sweep.name}: {len(trials)} trials; MLflow experiment {experiment!r} at {uri}", file=sys.stderr)
        results = tuner.fit()
        counts = _outcomes(client, exp_id, parent_id)
        finished = results.num_terminated >= len(trials) and not results.num_errors
        unfinished = len(trials) - results.num_terminated - results.num_errors
        state = json.loads(state_path.read_text())
        state["finished"] = unfinished <= 0
        state_path.write_text(json.dumps(state))
        client.set_terminated(parent_id, status="FINISHED" if unfinished <= 0 else "KILLED")
        return {"trials": len(trials), "parent_run_id": parent_id, "tracking_uri": uri, "experiment": experiment,
                "unfinished": max(unfinished, 0), "complete": finished, **counts}
    finally:
        ray.shutdown()


def _trainable(sweep: SweepConfig):
    from ray import tune
    return tune.with_resources(run_trial, {"cpu": sweep.resources.cpu, "gpu": sweep.resources.gpu})


def _new_tuner(sweep, trials, root, uri, exp_id, parent_id):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    scheduler = None
    if sweep.scheduler is not None:
        s = sweep.scheduler
        scheduler = ASHAScheduler(time_attr="round", metric=s.metric, mode=s.mode, grace_period=s.grace_period,
                                  reduction_factor=s.reduction_factor,
                                  max_t=max(t.config.rounds for t in trials))
    ckpt_dir = str(root / sweep.name / "trial_checkpoints")
    param_space = {"trial": tune.grid_search([_trial_payload(t, sweep) for t in trials]),
                   "checkpoint_every": sweep.checkpoint_every, "ckpt_dir": ckpt_dir}
    return tune.Tuner(
        _trainable(sweep), param_space=param_space,
        tune_config=tune.TuneConfig(scheduler=scheduler, reuse_actors=True,
                                    max_concurrent_trials=sweep.max_concurrent),
        run_config=tune.RunConfig(
            name=sweep.name, storage_path=str(root), verbose=0,
            failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
            callbacks=[make_mlflow_callback(uri, exp_id, parent_id, sweep.name, ckpt_dir),
                       make_progress_callback(len(trials))]))


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


def _outcomes(client, exp_id: str, parent_id: str) -> dict[str, int]:
    runs = client.search_runs([exp_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'",
                              max_results=50_000)
    counts: dict[str, int] = {}
    for r in runs:
        s = r.data.tags.get("fedsweep.status", "running")
        counts[s] = counts.get(s, 0) + 1
    return counts
