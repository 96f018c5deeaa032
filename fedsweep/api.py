"""The Python API: ``fedsweep.run``, ``fedsweep.tune`` and ``fedsweep.report`` (docs/api.md).

What the commands ``fedsweep run``, ``tune`` and ``report`` do, called from Python (a notebook, a
script) and answered with Python objects: a run's summary, metric history and model; a sweep's
trials as a DataFrame; a report's tables. The same code runs underneath, so a run or a sweep made
here is the one the command would make, in the same MLflow store. What differs:

- nothing is printed unless ``progress=True``: no header, progress lines, summary table or MLflow
  lines (what fails, such as an MLflow store that stops answering, is still said on stderr);
- a user error raises :class:`~fedsweep.ConfigError` with the command's one line, where the command
  exits 2; a sweep that did not end whole raises :class:`SweepError`, where the command exits 1 or 5;
- a config or a sweep may be a dict, its ``plugins:`` paths relative to the working folder (a file's
  are relative to the file, as for the commands).
"""
from __future__ import annotations

import io
import os
import sys
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedsweep.config.schema import (ConfigError, RunConfig, build_config, copy_tree, read_run_config, set_dotted,
                                    validate_raw)

if TYPE_CHECKING:   # imported where they are used: `fedsweep.run` costs no pandas, scipy or torch import by itself
    import pandas as pd
    from torch import nn

    from fedsweep.reports.write import ReportResult

__all__ = ["RunResult", "SweepError", "report", "run", "tune"]

#: The summary numbers ``tune``'s table always has (NaN where a trial has none); the others only
#: where some trial has them (the validation ones need a validation split).
CORE_METRICS = ("best_test_accuracy", "final_test_accuracy", "rounds_to_target")
FIRST_METRICS = (*CORE_METRICS, "best_val_accuracy", "test_accuracy_at_best_val", "val_rounds_to_target")
#: MLflow's names of summary numbers that ``summary/<key>`` holds too (docs/design.md §4.4).
MLFLOW_TWINS = ("best/test_accuracy", "rounds_to_target", "best/val_accuracy", "val_rounds_to_target")
STATUSES = ("finished", "diverged", "stopped", "failed", "incomplete", "interrupted", "running")   # fedsweep.status


@dataclass(repr=False)
class RunResult:
    """One run, as :func:`run` returns it.

    ``summary``: the numbers ``fedsweep run`` prints and logs (``status``, ``best_test_accuracy``,
    ``final_test_accuracy``, ``rounds_to_target``, ``rounds``, ``seconds_per_round``, the validation
    ones, ...; ``mlflow_run_id`` once MLflow has the run). ``history``: one row per evaluated round,
    indexed by round, one column per metric (``test/accuracy``, ``test/loss``, ``train/loss``, ...);
    ``rounds``: the same for every round (metrics measured only at evaluations are NaN between them).
    ``config``: the resolved config (every default filled in). ``model``: the final model as an
    ``nn.Module`` on the CPU, in eval mode. ``run_id``, ``tracking_uri``: the MLflow run and its store
    (None without MLflow, or when the store did not take the run: ``summary['mlflow_unlogged']`` then
    names the folder its records are kept in). ``status``: ``finished``, ``diverged`` or
    ``interrupted`` (Ctrl-C)."""
    summary: dict
    history: pd.DataFrame
    rounds: pd.DataFrame
    config: RunConfig
    model: nn.Module
    run_id: str | None = None
    tracking_uri: str | None = None

    @property
    def status(self) -> str:
        return self.summary["status"]

    def __repr__(self) -> str:
        best = self.summary.get("best_test_accuracy")
        return (f"RunResult(status={self.status!r}, best_test_accuracy={best if best is None else round(best, 4)}, "
                f"rounds={self.summary.get('rounds')}, run_id={self.run_id!r})")


class SweepError(RuntimeError):
    """A sweep that did not end whole: interrupted (Ctrl-C), stopped by a fault, or whose last MLflow
    records the store did not take (``fedsweep tune`` exits 1 or 5 there). The message says what
    happened and what continues it. ``outcome``: the driver's counts (``unfinished``, ``stopped_by``,
    ``recover``, ...); ``trials``: the sweep's table as far as MLflow holds it, None where the store
    could not be read."""

    def __init__(self, message: str, outcome: dict, trials: pd.DataFrame | None = None):
        super().__init__(message)
        self.outcome, self.trials = outcome, trials


# ---------------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------------

def run(config: str | os.PathLike | dict, overrides: list[str] | dict[str, Any] | None = None, mlflow: bool = True, *,
        progress: bool = False, checkpoint_dir: str | os.PathLike | None = None,
        resume: str | os.PathLike | None = None, checkpoint_every: int = 0,
        output_json: str | os.PathLike | None = None) -> RunResult:
    """Train one config, as ``fedsweep run`` does, and return its :class:`RunResult`.

    ``config``: a run config file, a sweep file (its ``base``, as ``fedsweep run`` runs it; its
    ``plugins:`` relative to the file), or a dict of config keys (``plugins:`` relative to the
    working folder; ``{}`` runs every default). ``overrides``: ``["local.lr=0.1", ...]`` as ``--set``
    takes them (values read as YAML), or a dict of dotted keys to values (``{"local.lr": 0.1}``, taken
    as they are); a mapping merges into its section either way. ``mlflow``: False logs nothing
    (``--no-mlflow``); True logs where the config's ``mlflow`` section says. ``progress``: print what
    ``fedsweep run`` prints (the header, a line per evaluation, the summary table, the MLflow lines);
    by default nothing. ``checkpoint_dir``, ``checkpoint_every``, ``resume``, ``output_json``: as
    ``--checkpoint-dir``, ``--checkpoint-every``, ``--resume`` and ``--output-json`` (docs/run.md).

    A component registered in the caller's own namespace (a notebook cell) works here: the run
    trains in this process. Raises :class:`~fedsweep.ConfigError` (one line naming the key) for what
    ``fedsweep run`` refuses before training; a diverged or interrupted run returns, its ``status``
    saying so."""
    from fedsweep.util.mplconfig import use_writable_config_dir
    use_writable_config_dir()   # before Lightning imports matplotlib
    cfg, note = _run_config(config, overrides)
    if note and progress:
        print(f"fedsweep: note: {note}", file=sys.stderr)
    if not mlflow:
        cfg.mlflow.enabled = False
    from fedsweep.runs.run import run_with_module
    summary, module = run_with_module(cfg, output_json=output_json, progress=progress, ckpt_dir=checkpoint_dir,
                                      ckpt_every=checkpoint_every, resume=resume,
                                      out=None if progress else io.StringIO())
    return _run_result(cfg, summary, module)


def plain(value: Any) -> Any:
    """A dict given from Python with its numpy numbers as Python's (``list(np.logspace(-3, -1, 3))``
    in a grid), so that a trial's keys, names and the ``sweep.yaml`` its parent run keeps are those
    the same sweep file would give; a path is returned as it is."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return value.item()
    return value


def _run_config(config, overrides) -> tuple[RunConfig, str]:
    """The config validated with its overrides, and ``fedsweep run``'s note for a sweep file ('' if none)."""
    if isinstance(config, dict):
        raw, note = copy_tree(config), ""
    elif isinstance(config, (str, os.PathLike)):
        raw, note = read_run_config(config, "running")
    else:
        raise ConfigError(f"config: expected a path of a run config (or sweep file) or a dict of config keys, "
                          f"got {type(config).__name__}")
    if overrides is None or isinstance(overrides, (list, tuple)):
        if not all(isinstance(o, str) for o in overrides or []):
            raise ConfigError("overrides: a list of 'key=value' strings (as --set takes them), or a dict of dotted "
                              "keys to values")
        return build_config(raw, list(overrides or [])), note
    if not isinstance(overrides, dict):
        raise ConfigError(f"overrides: expected a list of 'key=value' strings or a dict of dotted keys to values, "
                          f"got {type(overrides).__name__}")
    for key, value in overrides.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"overrides: {key!r} is not a dotted config key (such as 'local.lr')")
        set_dotted(raw, key, value)
    return validate_raw(raw), note


def _run_result(cfg: RunConfig, summary: dict, module) -> RunResult:
    import copy

    import pandas as pd
    rounds = pd.DataFrame(module.history)
    rounds = rounds.set_index("round") if len(rounds) else rounds
    evaluated = rounds["test/accuracy"].notna() if "test/accuracy" in rounds else pd.Series(False, index=rounds.index)
    fmodel = module.fmodel
    from fedsweep.engine.dropout import unseeded
    model = unseeded(copy.deepcopy(fmodel.module).cpu())   # its dropout layers as the user wrote them
    fmodel.load_into(module.w.detach().cpu(), model)
    for name, buffer in model.named_buffers():   # BatchNorm's statistics: the model's state, not in w
        if name in fmodel.buffers:
            buffer.copy_(fmodel.buffers[name].detach().cpu())
    return RunResult(summary=summary, history=rounds[evaluated], rounds=rounds, config=cfg, model=model.eval(),
                     run_id=summary.get("mlflow_run_id"), tracking_uri=summary.get("mlflow_tracking_uri"))


# ---------------------------------------------------------------------------------------------
# tune
# ---------------------------------------------------------------------------------------------

def tune(sweep: str | os.PathLike | dict, *, resume: bool = False, restart: bool = False, address: str | None = None,
         storage: str | os.PathLike | None = None, dry_run: bool = False, report: bool = True,
         progress: bool = False) -> pd.DataFrame:
    """Run a sweep on Ray Tune, as ``fedsweep tune`` does, and return its trials: one row each.

    ``sweep``: a sweep file (docs/sweeps.md), or its content as a dict, which needs a ``name`` (it
    names the sweep's folder, lock and MLflow experiment; ``plugins:`` paths relative to the working
    folder; the parent run keeps the dict as ``sweep.yaml``). ``resume``, ``restart``, ``address``,
    ``storage``: as ``--resume``, ``--restart``, ``--address`` and ``--storage``. ``dry_run``: check
    every trial's config and return the planned tuning trials (status ``planned``; a ``confirm:``
    stage's trials are chosen once the tuning trials end, so they are not among them), running
    nothing. ``report``: once every trial has ended, write the report as ``fedsweep tune`` does
    (``./reports/<name>/`` and the parent run; ``FEDSWEEP_NO_REPORT=1`` skips it, as for the command);
    a report that cannot be made is a warning. ``progress``: print the sweep's terminal view (a line
    per trial, a status line every 10 s); by default nothing.

    The table, read from the sweep's MLflow runs once it has ended (this run of the sweep only):
    ``method``, the config keys the sweep varies (dotted, as columns), ``seed``, ``stage`` (``tune``
    or ``confirm``), ``status`` (finished, diverged, stopped, failed, incomplete), the summary numbers
    by the names of ``RunResult.summary`` (``best_test_accuracy``, ``final_test_accuracy``,
    ``rounds_to_target``, the validation ones where the trials have a validation split, ``rounds``,
    ``seconds_per_round``, ...), ``error`` (a failed trial's), ``run_name``, ``config_id`` and
    ``run_id``; ``df.attrs`` has the ``sweep``, ``experiment``, ``tracking_uri``, ``parent_run_id`` and
    the driver's ``outcome``. Failed or incomplete trials (``fedsweep tune`` exits 4) are rows with
    that status, and a warning. Raises :class:`~fedsweep.ConfigError` for what the command refuses
    before anything runs (exit 2; a component defined in ``__main__``, such as a notebook cell, is one:
    Ray's workers cannot import it), and :class:`SweepError` for a sweep interrupted or stopped by a
    fault (exit 1) or whose last records the MLflow store did not take (exit 5)."""
    from fedsweep.util.mplconfig import use_writable_config_dir
    use_writable_config_dir()
    sweep = plain(sweep)
    if dry_run:
        return _planned_trials(sweep)
    from fedsweep.sweep.tune import tune_sweep
    outcome = tune_sweep(sweep, resume=resume, restart=restart, address=address, storage=storage, progress=progress)
    stopped = outcome["unfinished"] or outcome.get("stopped_by")
    lost = outcome.get("unlogged") or outcome.get("unlogged_lost")
    try:
        table = _trial_table(outcome)
    except Exception:  # noqa: BLE001 - a sweep stopped before its first run, the store that failed: said below
        if not (stopped or lost):
            raise
        table = None
    if stopped or lost:
        raise SweepError(_ending_text(outcome, sweep), outcome, table)
    if outcome.get("failed") or outcome.get("incomplete"):
        bad = table[table["status"].isin(("failed", "incomplete"))]
        first = next((e for e in bad["error"] if e), "")
        warnings.warn(f"sweep {outcome['sweep']!r}: {len(bad)} of {len(table)} trials failed or are incomplete "
                      f"(their status and error columns){f': {first}' if first else ''}", stacklevel=2)
    if report and os.environ.get("FEDSWEEP_NO_REPORT", "") in ("", "0"):
        try:
            sweep_report(sweep)
        except Exception as e:  # noqa: BLE001 - the sweep ended as its table says; the report is fedsweep.report again
            warnings.warn(f"the report was not made ({type(e).__name__}: {str(e)[:200]}); make it with "
                          f"fedsweep.report", stacklevel=2)
    return table


def _trial_table(outcome: dict) -> pd.DataFrame:
    """The trials of this run of the sweep (its parent run), as :func:`tune` returns them."""
    from fedsweep.reports.trials import load_trials
    from fedsweep.runs.summary import SUMMARY_KEYS
    trials = load_trials(outcome["tracking_uri"], outcome["experiment"], outcome["sweep"],
                         parent_run_id=outcome["parent_run_id"])
    params = trials.attrs["params"]
    trials = trials.drop(columns=[c for c in MLFLOW_TWINS if c in trials])
    trials = trials.rename(columns={c: c.removeprefix("summary/") for c in trials if c.startswith("summary/")})
    for key in CORE_METRICS:
        if key not in trials:
            trials[key] = float("nan")
    named = {"method", *params, "seed", "stage", "status", "error", "run_name", "config_id", "run_id", "draw",
             "parent_run_id", "start_time", "end_time"}
    present = [c for c in trials if c not in named and (c in CORE_METRICS or trials[c].notna().any())]
    first = [*FIRST_METRICS, *SUMMARY_KEYS]
    metrics = [c for c in dict.fromkeys(first) if c in present] + sorted(c for c in present if c not in first)
    draw = ["draw"] if trials["draw"].notna().any() else []
    trials["stage_order"] = (trials["stage"] != "tune").astype(int)
    trials = trials.sort_values(["stage_order", "method", *params, "seed"], kind="stable")
    columns = ["method", *params, "seed", "stage", "status", *metrics, *draw, "error", "run_name", "config_id",
               "run_id"]
    table = trials[columns].reset_index(drop=True)
    table.attrs = {"sweep": outcome["sweep"], "experiment": outcome["experiment"],
                   "tracking_uri": outcome["tracking_uri"], "parent_run_id": outcome["parent_run_id"],
                   "outcome": outcome}
    return table


def _planned_trials(sweep) -> pd.DataFrame:
    """``tune(dry_run=True)``: the tuning trials as ``fedsweep tune --dry-run`` checks them, run by none."""
    import pandas as pd

    from fedsweep.config.schema import flatten
    from fedsweep.sweep.checks import check_importable, check_report, select_on_validation
    from fedsweep.sweep.spec import expand, load_sweep, sweep_source, varying_keys
    spec, source = load_sweep(sweep), sweep_source(sweep)
    trials = expand(spec, source=source)
    check_report(spec, trials, source=source)
    select_on_validation(spec, trials, source=source)
    check_importable(trials, source=source)
    keys = [k for k in varying_keys(trials) if k != "seed"]
    rows = []
    for t in trials:
        values = {k: None if k in t.sampled else t.overrides.get(k) for k in keys}   # optuna's: drawn later
        rows.append({"method": t.method, **flatten(values), "seed": t.seed, "stage": "tune", "status": "planned",
                     "config_id": None if t.sampled else t.config_id})
    table = pd.DataFrame(rows)
    table.attrs = {"sweep": spec.name}
    return table


def _ending_text(outcome: dict, sweep) -> str:
    """What stopped the sweep and what continues it, for :class:`SweepError` (``fedsweep tune``'s last
    lines, with the Python call that recovers instead of the command)."""
    again = f"fedsweep.tune({'sweep' if isinstance(sweep, dict) else repr(str(sweep))}, "
    counts = ", ".join(f"{outcome[k]} {k}" for k in STATUSES if outcome.get(k))
    name = outcome.get("sweep", "")
    if outcome["unfinished"]:
        parts = [f"sweep {name!r} interrupted: {counts or 'no trials started'}; {outcome['unfinished']} of "
                 f"{outcome['trials']} unfinished"]
    else:
        parts = [f"sweep {name!r} ended: {counts or 'no trials'}"]
    if outcome.get("stopped_by"):
        parts.append(f"stopped by {outcome['stopped_by']}")
    if outcome.get("unlogged"):
        parts.append(f"the MLflow store did not take its last records ({outcome['mlflow_cause']}); they are kept in "
                     f"{outcome['unlogged']}: once the store works, {again}resume=True) writes them")
    elif outcome.get("unlogged_lost"):
        parts.append(f"the MLflow store did not take its last records: {outcome['unlogged_lost']}")
    if outcome.get("recover") == "--resume" and (outcome["unfinished"] or outcome.get("stopped_by")):
        parts.append(f"continue it with {again}resume=True)")
    elif outcome.get("recover") == "--restart":
        parts.append(f"resume cannot continue it ({outcome['resume_problem']}): start it over with {again}restart=True)")
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------

def report(sweep: str | os.PathLike | dict, out: str | os.PathLike | None = None) -> ReportResult:
    """Write a sweep's report, as ``fedsweep report`` does, and return its tables (:class:`ReportResult`).

    ``sweep``: the sweep file that was run, or its dict (the one given to :func:`tune`): its name,
    MLflow store and experiment, ``report:`` settings and reference method say what to read and how
    to compare. ``out``: the report's folder (default ``./reports/<name>``). Reads every trial run of
    the sweep in its MLflow store (all its runs: a later run of a config replaces an earlier one),
    writes report.md, trials.csv, comparisons.csv and the plots there, and logs the report onto the
    sweep's MLflow parent run. Prints nothing (a parent run that refuses the report is said on
    stderr). Raises :class:`~fedsweep.ConfigError` in one line for a sweep with nothing to report, a
    store that cannot be read, or an ``out`` that cannot be written."""
    from fedsweep.util.mplconfig import use_writable_config_dir
    use_writable_config_dir()
    return sweep_report(sweep, out)


def sweep_report(sweep: str | os.PathLike | dict, out_dir: str | os.PathLike | None = None, *, option: str = "out",
                 quiet: bool = True) -> ReportResult:
    """What ``fedsweep report`` and :func:`report` share: the sweep and the output folder checked
    before MLflow is read, then the report (:func:`fedsweep.reports.write.make_report`). ``option``:
    how messages name the output folder (``--out`` for the command)."""
    from mlflow.exceptions import MlflowException

    from fedsweep.reports.write import make_report
    from fedsweep.sweep.checks import check_report, reference_method
    from fedsweep.sweep.confirm import looks, seed_order
    from fedsweep.sweep.search import sampled_keys
    from fedsweep.sweep.spec import expand, load_sweep, sweep_source
    from fedsweep.config.registry import as_recorded
    sweep = plain(sweep)
    with as_recorded():   # the sweep's plugins are not imported: the runs hold what they were
        spec, source = load_sweep(sweep), sweep_source(sweep)
        trials = expand(spec, source=source)
        check_report(spec, trials, source=source)
    folder = str(out_dir) if out_dir else os.path.join("reports", spec.name)
    key = option if out_dir else f"{option} (default)"
    _check_out(folder, key, option)
    uri = spec.mlflow.tracking_uri or spec.base.get("mlflow", {}).get("tracking_uri")   # None: as MLflow
    try:
        return make_report(uri, spec.mlflow.experiment or spec.name, spec.name, folder,
                           setting_keys=spec.report.settings,
                           reference=reference_method(spec, (t.method for t in trials)),
                           relative_target=spec.report.relative_target, sampled_keys=sampled_keys(spec),
                           resolution=max(t.config.eval.every for t in trials),   # rounds are seen this often
                           margin=spec.report.margin.model_dump(), metric=spec.report.metric, mode=spec.report.mode,
                           looks=looks(spec), order=seed_order(spec) if spec.confirm is not None else None,
                           random_first=spec.search.startup() if spec.search and spec.search.searcher == "optuna"
                           else None, quiet=quiet)
    except OSError as e:
        raise _report_write_error(e, folder, key, option) or e
    except MlflowException as e:   # a store locked by a writer past sqlite's 20 s wait, a server gone
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ConfigError(f"the sweep's MLflow store: {first}; nothing was written: try again once it answers") from None


def _check_out(folder: str, key: str, option: str) -> None:
    """A report's folder can be written (a file there, or a read-only folder, would fail after MLflow
    was read and the first plots drawn)."""
    from fedsweep.runs.paths import check_writable_dir
    try:
        check_writable_dir(folder, key)
    except ConfigError as e:
        raise ConfigError(f"{e}; give {option} a folder that can be written") from None


def _report_write_error(e: OSError, folder: str, key: str, option: str) -> ConfigError | None:
    """The one line for a report that could not be written to the end: its disk filled up, or its
    folder changed since :func:`_check_out`. None for an error that is not about ``folder``."""
    import errno
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return ConfigError(f"{key} {folder}: its disk is full ({e.strerror}), so the report there is incomplete; "
                           f"free space there, or give {option} a folder on another disk")
    if e.filename and os.path.abspath(e.filename).startswith(os.path.abspath(folder) + os.sep):
        return ConfigError(f"{key} {folder}: cannot write {e.filename} ({e.strerror}), so the report there is "
                           f"incomplete; give {option} a folder that can be written")
    return None
