"""Inside a Ray worker: one Tune trial of a sweep, a "unit" (one federated run, or a pack of them).

It runs the same Lightning path as ``fedsweep run`` (:func:`fedsweep.run.train`, or
:func:`fedsweep.pack.train_packed` for a pack), reports at evaluations (at least where ASHA decides,
so it can stop it), and keeps its Lightning checkpoint at a stable path,
``<sweep>/trial_checkpoints/<trial id>.ckpt`` (replaced atomically), so a retried or resumed trial
continues from there. Each report carries,
per sweep trial of the unit, the metric rows since the last report; only the driver writes MLflow
(:mod:`fedsweep.tune_callbacks`).
"""
from __future__ import annotations

import math
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fedsweep.config import ConfigError, RunConfig



def trial_checkpoint(ckpt_dir: str | Path, trial_id: str) -> Path:
    return Path(ckpt_dir) / f"{trial_id}.ckpt"


def trial_artifacts(ckpt_dir: str | Path, trial_id: str, index: int) -> Path:
    """Where a finished trial's worker leaves its MLflow artifacts for the driver to log: rendering
    them (mostly curves.png, ~20 ms a run) is done in parallel here rather than one after another in
    the driver. The folder appears whole or not at all (:func:`_write_whole`)."""
    return Path(ckpt_dir).parent / "trial_artifacts" / trial_id / str(index)


def _write_whole(write, target: Path) -> None:
    """``write(folder)`` into a staging folder beside ``target``, then renamed to it: the driver, which
    logs ``target`` once it finds its summary.json, never sees a folder half written (it once logged
    summary.json before curves.png existed)."""
    staging = target.with_name(target.name + ".drawing")
    shutil.rmtree(staging, ignore_errors=True)
    write(staging)
    shutil.rmtree(target, ignore_errors=True)   # an earlier attempt's, if one was drawn
    staging.rename(target)


def _phase_marks():
    """When ``FEDSWEEP_TIMELINE`` names a folder (``benchmarks/sweep.py`` sets it), a trial appends
    the time each of its phases ends (``start``, ``trained``, ``reported``: the final report, with
    the artifacts drawn beside it; ``artifacts``: the drawing left when the report returned; with a
    scheduler ``artifacts`` comes before ``reported``, and a trial stopped there has no ``reported``), and
    each ``checkpoint`` it wrote (in training, and before its final report), to
    ``<folder>/<worker pid>.txt``: where a worker's time goes, trial after trial. Otherwise nothing."""
    folder = os.environ.get("FEDSWEEP_TIMELINE")
    if not folder:
        return lambda phase: None
    path = Path(folder) / f"{os.getpid()}.txt"

    def mark(phase: str):
        with path.open("a") as f:
            f.write(f"{time.time():.4f} {phase}\n")
    return mark


def _members(module) -> list:
    """The federated runs a trial trains: one module, or a pack's members."""
    return list(module.members) if hasattr(module, "members") else [module]


class Rungs:
    """The rounds at which ASHA decides on a trial (its rungs), and those it has recorded the trial at,
    as far as the trial's own reports tell. ASHA acts on a report only when its round has reached a
    rung the trial is not recorded at: it records the trial's metric at the highest such rung and
    stops the trial if that is below the rung's cutoff (ray.tune's ``_Bracket.on_result``); at any
    other report it lets the trial go on. So a trial that reports at every evaluation where
    :meth:`due` holds, and at any others it likes, gets the same decisions as one that reports at
    every evaluation. After a retry the trial forgets what was recorded before and reports a few
    times more than it must (what it thinks recorded always is)."""

    def __init__(self, rounds):
        self.rounds, self.recorded = sorted(rounds), set()

    def _unrecorded(self, round_: int) -> list:
        return [m for m in self.rounds if m <= round_ and m not in self.recorded]

    def due(self, round_: int) -> bool:
        return bool(self._unrecorded(round_))

    def reported(self, round_: int) -> None:
        if unrecorded := self._unrecorded(round_):
            self.recorded.add(max(unrecorded))


def _tune_reporter(checkpoint_every: int, ckpt_path: Path, trials: list[int], min_interval: float = 0.0,
                   failed: dict[int, str] | None = None, scheduled: bool = False, rungs: list | None = None):
    """The Lightning callback that reports a unit (one trial, or a pack of them) to Tune. Each report
    holds, per trial index, the metric rows since the last report (``members``). Reports come at
    evaluations, at most one per ``min_interval`` seconds: each report costs a round trip to the
    driver, and nothing is gained by sending rows one evaluation at a time. With a scheduler
    (``scheduled``) a trial also reports where the scheduler decides: at the first evaluation at or
    past each of ASHA's ``rungs`` (:class:`Rungs`), or at every evaluation if they are not known. A
    sweeps/fedlga.yaml trial under ASHA (grace period 10, η = 3: rungs at rounds 10, 30 and 90)
    reported 19 times before its final report, each a round trip to the driver; now 3.

    A checkpoint goes with a report, once ``checkpoint_every`` evaluations have passed since the last
    one, so without a scheduler no more often than reports: a checkpoint only saves a retried or
    resumed trial the rounds since it, and a sweeps/fedlga.yaml trial (0.35 s, evaluating every
    5 rounds, ``checkpoint_every: 4``) wrote 4 of them before its final one, 2.9 ms each. With a
    scheduler every report carries one: the scheduler may stop the trial at any report, and the
    driver makes a stopped run's artifacts and summary from its checkpoint, which must hold every
    round reported (with ``checkpoint_every: 4`` a trial stopped at its third evaluation had none,
    and its run no artifacts or summary).
    ``failed``: members of a pack left out before training (index -> error), in every report."""
    failed_parts = {str(i): {"rows": [], "status": "failed", "error": e} for i, e in (failed or {}).items()}
    mark = _phase_marks()
    import lightning as L

    class TuneReporter(L.Callback):
        def __init__(self):
            # History rows already reported, per member. A resumed trial starts at 0 and re-sends what
            # its checkpoint restored: the checkpoint may be newer than the last report the driver
            # logged, and the driver drops rounds it already has.
            self.sent = [0] * len(trials)
            self.evals = self.saved = 0   # evaluations seen; and at the last checkpoint
            self.last = time.monotonic()
            self.rungs = Rungs(rungs) if scheduled and rungs is not None else None

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            # The last round is reported once, after fit, with the summary: a scheduler may stop the
            # trial at any report, and the one it sees at the end must already say "done".
            if module.rounds_done == module.cfg.rounds:
                return
            if any(m.history and m.rounds_done == module.rounds_done and "test/accuracy" in m.history[-1]
                   and not m.diverged for m in _members(module)):
                self.evals += 1
                decides = scheduled and (self.rungs is None or self.rungs.due(module.rounds_done))
                if decides or time.monotonic() - self.last >= min_interval:
                    self.report(trainer, module,
                                checkpoint=scheduled or self.evals - self.saved >= checkpoint_every)

        def save(self, trainer):
            ckpt_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = ckpt_path.with_suffix(".tmp")
            trainer.save_checkpoint(tmp)
            tmp.replace(ckpt_path)
            mark("checkpoint")

        def report(self, trainer, module, checkpoint: bool, final: list[dict] | None = None):
            from ray import tune
            parts, latest = {}, []
            for i, (index, m) in enumerate(zip(trials, _members(module))):
                parts[str(index)] = {"rows": m.history[self.sent[i]:], "engine": m.engine_name,
                                     **(final[i] if final else {})}
                self.sent[i] = len(m.history)
                evals = [h for h in m.history if "test/accuracy" in h]
                latest.append((evals[-1] if evals else None, max((h["test/accuracy"] for h in evals), default=0.0)))
            # What a scheduler and the progress line read: the trial's (a pack's best member's) numbers.
            last, best = max(latest, key=lambda e: e[1])
            metrics = {"round": module.rounds_done, "members": parts,
                       "test/accuracy": last["test/accuracy"] if last else 0.0,
                       "test/loss": last["test/loss"] if last else math.inf,
                       "best/test_accuracy": best}
            if final:
                metrics["fedsweep_done"] = True
            metrics["members"].update(failed_parts)
            if checkpoint:   # before the report: the driver reads it when the trial completes
                self.save(trainer)
                self.saved = self.evals
            self.last = time.monotonic()
            if self.rungs is not None:
                self.rungs.reported(module.rounds_done)
            tune.report(metrics)

        def report_failed_only(self):
            """Every member of the pack was left out: the unit ends here."""
            from ray import tune
            tune.report({"round": 0, "members": failed_parts, "fedsweep_done": True, "test/accuracy": 0.0,
                         "test/loss": math.inf, "best/test_accuracy": 0.0})

    return TuneReporter()


def _loadable_members(trials: list[int], cfgs: list[RunConfig]):
    """A pack's members whose data can be made, with that data, and (index -> error) for those whose
    cannot: a config error only the data shows (more clients than samples, a partition it cannot
    make) fails that member alone, as a diverged member stops alone."""
    from fedsweep.allocator import keep_freed_memory
    from fedsweep.data import load_federated
    keep_freed_memory()   # as train_packed would before loading them
    kept, failed = [], {}
    for index, cfg in zip(trials, cfgs):
        try:
            kept.append((index, cfg, load_federated(cfg.data, cfg.seed, server=cfg.server_data)))
        except ConfigError as e:
            failed[index] = str(e)
    return [k[0] for k in kept], [k[1] for k in kept], [k[2] for k in kept], failed


def final_part(summary: dict, rounds: int) -> dict:
    """What a member's last report adds to its rows: its status and summary numbers."""
    return {"status": summary["status"], "best/test_accuracy": summary["best_test_accuracy"] or 0.0,
            "round": rounds,
            **{f"summary/{k}": v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}}


def _report_while_drawing(report, draw) -> None:
    """``report()`` while ``draw()`` runs in a thread; returns once both have, raising what either
    raised (the report's error first; the drawing is waited for either way)."""
    with ThreadPoolExecutor(1) as pool:
        drawing = pool.submit(draw)
        report()
        drawing.result()


def run_unit(config: dict, payloads: list[dict], units: list[list[int]]) -> None:
    """The Ray Tune function trainable: a unit of the sweep (``units[config["trial"]]``: one federated
    run, or a pack of them trained together), resumed from its checkpoint if any."""
    mark = _phase_marks()
    mark("start")
    from fedsweep.startup import startup_imports
    with startup_imports():   # a worker's first trial: its imports without the collector's passes
        import lightning  # noqa: F401
        from ray import tune

        from fedsweep.run import summarize, train, write_artifacts
    trials = units[config["trial"]]
    cfgs = [RunConfig(**payloads[i]["run"]) for i in trials]
    trial_id = tune.get_context().get_trial_id()
    ckpt = trial_checkpoint(config["ckpt_dir"], trial_id)
    resume = ckpt if ckpt.is_file() else None
    scheduled = config.get("scheduler", config.get("report_every_s", 0.0) == 0.0)   # it may stop a trial at any report
    if len(cfgs) == 1:
        reporter = _tune_reporter(config["checkpoint_every"], ckpt, trials, config.get("report_every_s", 0.0),
                                  scheduled=scheduled, rungs=config.get("rungs"))
        module = train(cfgs[0], progress=False, resume=resume, callbacks=[reporter])
    else:
        from fedsweep.pack import train_packed
        trials, cfgs, data, failed = _loadable_members(trials, cfgs)
        reporter = _tune_reporter(config["checkpoint_every"], ckpt, trials, config.get("report_every_s", 0.0),
                                  failed)
        if not trials:
            reporter.report_failed_only()
            return
        module = train_packed(cfgs, resume=resume, callbacks=[reporter], data=data, ids=trials)
    mark("trained")
    members = list(zip(trials, cfgs, _members(module)))
    summaries = [summarize(cfg, m.history, m.diverged) for _, cfg, m in members]

    def artifacts():
        for (index, cfg, m), summary in zip(members, summaries):
            _write_whole(lambda folder: write_artifacts(cfg, m, summary, folder, log_model=False),
                         trial_artifacts(config["ckpt_dir"], trial_id, index))

    def report():
        reporter.report(module.trainer, module, checkpoint=True,
                        final=[final_part(s, len(m.history)) for (_, _, m), s in zip(members, summaries)])
        mark("reported")

    if scheduled:
        # A scheduler may stop the trial at its final report (ASHA does at max_t: every trial that
        # runs all its rounds), and Tune then closes its run at once, before this function returns:
        # the artifacts must be there before the report.
        artifacts()
        mark("artifacts")
        report()
    else:
        # Otherwise the artifacts (mostly curves.png, ~20 ms a run) are drawn while the final report
        # waits for the driver to write the rows; the driver reads them once this function returns.
        _report_while_drawing(report, artifacts)
        mark("artifacts")
