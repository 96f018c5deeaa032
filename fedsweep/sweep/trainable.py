"""Inside a Ray worker: one Tune trial of a sweep, a "unit" (one federated run, or a pack of them).

It runs the same Lightning path as ``fedsweep run`` (:func:`fedsweep.runs.run.train`, or
:func:`fedsweep.sweep.pack.train_packed` for a pack), reports at evaluations (at least where ASHA decides,
so it can stop it), and keeps its Lightning checkpoint at a stable path of the sweep's storage
(:mod:`fedsweep.sweep.storage`), ``<sweep>/trial_checkpoints/<trial id>.ckpt`` (replaced whole), so a
retried or resumed trial continues from there on whatever node it lands. Each report carries, per
sweep trial of the unit, the metric rows since the last report; the final one also carries each
run's summary and artifacts (the files, ~90 KB a run): nothing a run's MLflow entry needs is read
from this node's disk. Only the driver writes MLflow (:mod:`fedsweep.sweep.callbacks`).
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

from fedsweep.config.schema import ConfigError, RunConfig


def trial_checkpoint(trial_id: str) -> str:
    """Where a trial keeps its checkpoint, relative to its sweep's folder of the storage."""
    return f"trial_checkpoints/{trial_id}.ckpt"


def check_reach(store, sweep_id: str | None) -> None:
    """This node reads the sweep's state file where the driver wrote it: otherwise its checkpoints
    would be written where no other node (and no retry elsewhere) finds them. The driver checks
    every node before the sweep starts (:func:`fedsweep.sweep.storage.check_nodes_reach`); this catches a
    node that joined since. A ConfigError naming the node fails the trial (and is its error line)."""
    import json

    from fedsweep.sweep.storage import STATE_FILE
    text = store.read_text(STATE_FILE)
    if text is not None and (sweep_id is None or json.loads(text).get("sweep_id") == sweep_id):
        return
    from ray.util import get_node_ip_address
    if not store.exists():
        raise ConfigError(f"the sweep's storage {store.where()} is not there on node {get_node_ip_address()}: deleted "
                          "while the sweep ran, or not mounted on that node (every node that runs trials must reach it)")
    raise ConfigError(f"node {get_node_ip_address()} cannot read the sweep's storage {store.where()} (no "
                      f"{STATE_FILE} of this sweep there), so its checkpoints would be lost with it: mount that "
                      "folder at the same path on every node, or give --storage a URI every node reaches")


def _node() -> str:
    from ray.util import get_node_ip_address
    return get_node_ip_address()


def artifact_files(cfg: RunConfig, module, summary: dict) -> dict[str, bytes]:
    """A run's MLflow artifacts (:func:`fedsweep.runs.run.write_artifacts`: config.yaml, metrics.csv,
    summary.json, curves.png, clients.csv) as name -> bytes, for its final report: the driver may
    run on another machine, and this node's disk is not one it reads."""
    import tempfile

    from fedsweep.runs.artifacts import artifact_dict, write_artifacts
    with tempfile.TemporaryDirectory(prefix="fedsweep-") as tmp:
        write_artifacts(cfg, module, summary, Path(tmp), log_model=False)
        return artifact_dict(Path(tmp))


def _phase_marks():
    """When ``FEDSWEEP_TIMELINE`` names a folder (``benchmarks/sweep.py`` sets it), a trial appends
    the time each of its phases ends (``start``, ``trained``, ``artifacts``: drawn, ``reported``: the
    final report, which carries them; a trial a scheduler stops there has no ``reported``), and
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


def headline(members: list, split: str) -> dict:
    """What a report says of a unit on one split (``test``, or ``val`` for members with a validation
    split): ``<split>/accuracy`` and ``<split>/loss`` of the last evaluation and ``best/<split>_accuracy``
    of the member whose best is highest (a pack's best member), and the first evaluated round at
    ``eval.target_accuracy`` of any member (``rounds_to_target``, ``val_rounds_to_target``), else rounds + 1;
    and that member's algorithm's own metrics as of the latest round that logged them (``qffl/mean_Fq``)."""
    from fedsweep.runs.run import first_at_target
    from fedsweep.runs.summary import latest_own
    acc = f"{split}/accuracy"
    latest, hits = [], []
    for m in members:
        evals = [h for h in m.history if acc in h]
        latest.append((evals[-1] if evals else None, max((h[acc] for h in evals), default=0.0), m))
        hit = first_at_target(evals, m.cfg.eval.target_accuracy, acc)   # not reached (yet): rounds + 1
        hits.append(hit["round"] if hit else m.cfg.rounds + 1)
    last, best, member = max(latest, key=lambda e: e[1])
    to_target = "rounds_to_target" if split == "test" else "val_rounds_to_target"
    return {acc: last[acc] if last else 0.0, f"{split}/loss": last[f"{split}/loss"] if last else math.inf,
            f"best/{split}_accuracy": best, to_target: min(hits), **client_metrics(last or {}, split),
            **latest_own(member.history)}


def client_metrics(row: dict, split: str) -> dict:
    """The per-client metrics (``eval.clients``) of an evaluated row on ``split``: ``<model>/accuracy_*``
    on test, ``<model>/val_accuracy_*`` on validation."""
    from fedsweep.runs.summary import CLIENT_KINDS
    on_val = split == "val"
    return {k: v for k, v in row.items()
            if k.partition("/")[0] in CLIENT_KINDS and k.partition("/")[2].startswith("val_") == on_val}


def has_validation(cfg: RunConfig) -> bool:
    """Whether a run evaluates a validation split, so its reports carry the val metrics."""
    return cfg.data.validation_fraction > 0


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


def _tune_reporter(checkpoint_every: int, save_checkpoint, trials: list[int], min_interval: float = 0.0,
                   failed: dict[int, str] | None = None, scheduled: bool = False, rungs: list | None = None):
    """The Lightning callback that reports a unit (one trial, or a pack of them) to Tune. Each report
    holds, per trial index, the metric rows since the last report (``members``). Reports come at
    evaluations, at most one per ``min_interval`` seconds: each report costs a round trip to the
    driver, and nothing is gained by sending rows one evaluation at a time. With a scheduler
    (``scheduled``) a trial also reports where the scheduler decides: at the first evaluation at or
    past each of ASHA's ``rungs`` (:class:`Rungs`), or at every evaluation if they are not known. A
    sweeps/fedlga.yaml trial under ASHA (grace period 10, η = 3: rungs at rounds 10, 30 and 90)
    reports 3 times before its final report, where reporting at every evaluation would make 19
    round trips to the driver.

    A checkpoint goes with a report, once ``checkpoint_every`` evaluations have passed since the last
    one, so without a scheduler no more often than reports: a checkpoint only saves a retried or
    resumed trial the rounds since it, and a sweeps/fedlga.yaml trial (0.35 s, evaluating every
    5 rounds, ``checkpoint_every: 4``) wrote 4 of them before its final one, 2.9 ms each. With a
    scheduler every report carries one: the scheduler may stop the trial at any report, and the
    driver makes a stopped run's artifacts and summary from its checkpoint, which must hold every
    round reported (with ``checkpoint_every: 4`` a trial stopped at its third evaluation would have
    none, and its run no artifacts or summary).
    ``save_checkpoint(trainer)`` writes the trial's checkpoint and returns why it could not, if it
    could not (the next report says it, as ``storage_error``). ``failed``: members of a pack left
    out before training (index -> error), in every report."""
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
            self.resumed = None   # the round a checkpoint restored, until a report has said it
            self.storage_error = None   # why a checkpoint could not be written, until a report has said it

        def on_train_start(self, trainer, module):
            if module.rounds_done:   # restored by fit from the trial's checkpoint
                self.resumed = module.rounds_done

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
            self.storage_error = save_checkpoint(trainer) or self.storage_error
            mark("checkpoint")

        def report(self, trainer, module, checkpoint: bool, final: list[dict] | None = None):
            from ray import tune
            parts, members = {}, _members(module)
            for i, (index, m) in enumerate(zip(trials, members)):
                parts[str(index)] = {"rows": m.history[self.sent[i]:], "engine": m.engine_name,
                                     **({"engine_why": m.engine_why} if getattr(m, "engine_why", "") else {}),
                                     **(final[i] if final else {})}
                self.sent[i] = len(m.history)
            # What a scheduler, a searcher and the progress line read: the trial's (a pack's best member's) numbers.
            metrics = {"round": module.rounds_done, "members": parts, **headline(members, "test")}
            if any(has_validation(m.cfg) for m in members):
                metrics.update(headline([m for m in members if has_validation(m.cfg)], "val"))
            if final:
                metrics["fedsweep_done"] = True
            if self.resumed is not None:
                metrics["resumed_from"], self.resumed = self.resumed, None
            metrics["members"].update(failed_parts)
            if checkpoint:   # before the report: the driver reads it when the trial completes
                self.save(trainer)
                self.saved = self.evals
            if self.storage_error:
                metrics["storage_error"], self.storage_error = self.storage_error, None
            self.last = time.monotonic()
            if self.rungs is not None:
                self.rungs.reported(module.rounds_done)
            tune.report(metrics)

        def report_user_error(self, e: Exception, frame) -> None:
            """The unit's code of the user's (a plugin's hook, model or dataset: ``frame``) raised ``e``:
            every member ends ``failed`` here, with the line and the traceback, and is not retried (a
            retry from its checkpoint would raise it again the same way)."""
            import traceback

            from ray import tune
            line = (f"your code raised {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]} (in "
                    f"{frame.name}, {frame.filename}:{frame.lineno}); not retried: it would fail the same way again")
            tb = "".join(traceback.format_exception(e))[-100_000:]
            parts = {str(i): {"rows": [], "status": "failed", "error": line, "traceback": tb} for i in trials}
            tune.report({"round": 0, "members": {**parts, **failed_parts}, "fedsweep_done": True,
                         "test/accuracy": 0.0, "test/loss": math.inf, "best/test_accuracy": 0.0,
                         "rounds_to_target": math.inf})

        def report_failed_only(self):
            """Every member of the pack was left out: the unit ends here."""
            from ray import tune
            tune.report({"round": 0, "members": failed_parts, "fedsweep_done": True, "test/accuracy": 0.0,
                         "test/loss": math.inf, "best/test_accuracy": 0.0, "rounds_to_target": math.inf})

    return TuneReporter()


def _loadable_members(trials: list[int], cfgs: list[RunConfig]):
    """A pack's members whose data can be made, with that data, and (index -> error) for those whose
    cannot: a config error only the data shows (more clients than samples, a partition it cannot
    make) fails that member alone, as a diverged member stops alone."""
    from fedsweep.util.allocator import keep_freed_memory
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
            **({"best/val_accuracy": summary["best_val_accuracy"]} if summary.get("best_val_accuracy") is not None
               else {}),
            "round": rounds,
            **{f"summary/{k}": v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}}


def run_unit(config: dict, payloads: list[dict], units: list[list[int]], store,
             sweep_id: str | None = None) -> None:
    """The Ray Tune function trainable: a unit of the sweep (``units[config["trial"]]``: one federated
    run, or a pack of them trained together), resumed from its checkpoint in ``store`` (the sweep's
    folder of the storage, :class:`fedsweep.sweep.storage.Storage`) if there is one."""
    mark = _phase_marks()
    mark("start")
    from fedsweep.util.startup import startup_imports
    with startup_imports():   # a worker's first trial: its imports without the collector's passes
        import lightning  # noqa: F401
        from ray import tune

        from fedsweep.runs.run import summarize, train
    check_reach(store, sweep_id)
    trials = units[config["trial"]]
    from fedsweep.sweep.spec import drawn_payload   # `searcher: optuna`: the values drawn for this trial
    cfgs = [RunConfig(**drawn_payload(payloads[i], config.get("sampled"))["run"]) for i in trials]
    recorded = next((payloads[i]["plugins"] for i in trials if payloads[i].get("plugins")), None)
    if recorded:   # the plugins this node imported are the driver's (a file edited since, or another copy: no)
        from fedsweep.config.plugins import check_unchanged
        check_unchanged(recorded, f"plugins (on node {_node()})")
    ckpt = trial_checkpoint(tune.get_context().get_trial_id())

    def save_checkpoint(trainer) -> str | None:
        """Write the trial's checkpoint; why it could not be (a full or vanished storage), or None.
        The trial trains on either way: its results reach the driver with its reports, and only a
        retry or a resume, which would start from its last checkpoint, loses by it."""
        try:
            with store.writing(ckpt) as path:
                trainer.save_checkpoint(path)
        except OSError as e:
            return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:300]
        return None

    scheduled = config.get("scheduler", config.get("report_every_s", 0.0) == 0.0)   # it may stop a trial at any report
    from fedsweep.util.errors import user_frame
    packed = len(cfgs) > 1
    with store.reading(ckpt) as resume:
        if not packed:
            reporter = _tune_reporter(config["checkpoint_every"], save_checkpoint, trials,
                                      config.get("report_every_s", 0.0), scheduled=scheduled, rungs=config.get("rungs"))
        else:
            from fedsweep.sweep.pack import train_packed
            trials, cfgs, data, failed = _loadable_members(trials, cfgs)
            reporter = _tune_reporter(config["checkpoint_every"], save_checkpoint, trials,
                                      config.get("report_every_s", 0.0), failed)
            if not trials:
                reporter.report_failed_only()
                return
        try:
            if not packed:
                module = train(cfgs[0], progress=False, resume=resume, callbacks=[reporter])
            else:
                module = train_packed(cfgs, resume=resume, callbacks=[reporter], data=data, ids=trials)
        except Exception as e:   # noqa: BLE001 - the user's code raised: the trial fails once, not again
            frame = user_frame(e)
            if frame is None:
                raise                 # fedsweep's, Ray's, the machine's: Ray retries it (max_failures)
            reporter.report_user_error(e, frame)
            return
    mark("trained")
    final = []
    for cfg, m in zip(cfgs, _members(module)):
        summary = summarize(cfg, m.history, m.diverged)
        final.append({**final_part(summary, len(m.history)), "artifacts": artifact_files(cfg, m, summary)})
    mark("artifacts")
    # A scheduler may stop the trial at this report (ASHA does at max_t: every trial that runs all
    # its rounds), and Tune then closes its runs at once: what they need is in it.
    reporter.report(module.trainer, module, checkpoint=True, final=final)
    mark("reported")
