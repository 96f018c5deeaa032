"""``fedsweep report``: the report's files from a sweep's MLflow runs (how the numbers are made:
:mod:`fedsweep.reports.trials`)."""
from __future__ import annotations

import datetime as _dt
import math
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from fedsweep.config.schema import ConfigError
from fedsweep.reports.plots import (accuracy_curves_png, client_ecdf_png, rounds_to_target_png, search_draws_png,
                                   search_png, settings_curves_png, weights_figures)
from fedsweep.reports.interactions import interaction_table
from fedsweep.reports.sections import _across_settings, _comparison_lines, _interaction_lines, _splits_text
from fedsweep.reports.stats import Metric, add_intervals, comparison_table, seed_values
from fedsweep.reports.tables import (_all_table, _best_table, _client_table, _comparisons_table,
                                     _markdown, _own_table, _rounds_table, _targeted)
from fedsweep.reports.trials import (DEFAULT_SETTING_KEYS, SCORED, _col, _fmt_value, _groups, _Runs, best_configs,
                                    config_table, files_warning, load_trials, relative_targets, score_column)
from fedsweep.reports.verdicts import forest_png, verdicts_tex
from fedsweep.runs.summary import own_metric


#: Default equivalence margins (``report.margin``): a difference inside ±margin counts as none.
MARGINS = {"accuracy": 0.01, "rounds": 2.0, "metric": 0.0}


def compared_metrics(split: str, rule: str, resolution: float, max_rounds: float | None,
                     margin: dict[str, float] | None = None, metric: str | None = None,
                     mode: str = "max") -> dict[str, Metric]:
    """What comparisons.csv compares: rounds to target when a target is set (censored where a run never
    reached it; counted only every ``resolution`` rounds), and the accuracy the runs are scored by (with a
    validation split, ``split``, each run's test accuracy at its best validation round); each with its
    equivalence margin (``margin``: ``accuracy``, ``rounds``; :data:`MARGINS` for what it leaves out).
    ``metric`` (``report.metric``): that per-client accuracy instead, scored as :func:`score_column` says,
    or an algorithm's own metric, better as ``mode`` says, margin ``metric``."""
    margin = {**MARGINS, **(margin or {})}
    score = score_column(split, metric)
    metrics = {}
    if rule == "target":
        metrics["rounds_to_target"] = Metric("rounds_to_target", higher_is_better=False, resolution=resolution,
                                             censored=True, horizon=max_rounds, margin=margin["rounds"], low=1.0,
                                             high=max_rounds if max_rounds is not None else math.inf,
                                             grid=max(resolution, 1.0))
    if metric and own_metric(metric):
        metrics[score] = Metric(score, higher_is_better=mode == "max", margin=margin["metric"])
    else:
        metrics[score] = Metric(score, higher_is_better=True, margin=margin["accuracy"], low=0.0, high=1.0)
    return metrics


@dataclass(repr=False)
class ReportResult:
    """What a report wrote (``path``: its report.md) and its tables, as ``fedsweep.report`` returns them.

    ``trials``: every trial, one row each (trials.csv: the MLflow params that vary, the summary
    metrics by their MLflow names, status, run id); ``configs``: every config of the tuning stage,
    scored over its seeds and ranked within its method and setting (the report's "All configs");
    ``best``: the rank-1 config of each method per setting, with its means and 95% intervals
    (``*_lo``/``*_hi``) and ``scored_on`` (``tuning``, or ``confirm`` runs); ``comparisons``: each
    method against the reference, paired by seed (comparisons.csv; docs/sweeps.md, "Intervals and
    verdicts"); ``interactions``: with one setting key of several values, whether each method's lead
    changes from its first value to its last (interactions.csv; empty otherwise)."""
    path: Path
    trials: pd.DataFrame = field(default_factory=pd.DataFrame)
    configs: pd.DataFrame = field(default_factory=pd.DataFrame)
    best: pd.DataFrame = field(default_factory=pd.DataFrame)
    comparisons: pd.DataFrame = field(default_factory=pd.DataFrame)
    interactions: pd.DataFrame = field(default_factory=pd.DataFrame)

    def __repr__(self) -> str:
        return (f"ReportResult(path={str(self.path)!r}, trials={len(self.trials)}, configs={len(self.configs)}, "
                f"best={len(self.best)}, comparisons={len(self.comparisons)}, interactions={len(self.interactions)})")


def write_report(tracking_uri: str | None, experiment: str, sweep: str, out_dir: str | Path, **options) -> Path:
    """:func:`make_report`'s files; returns the path of ``report.md``."""
    return make_report(tracking_uri, experiment, sweep, out_dir, **options).path


def sweep_tables(tracking_uri: str | None, experiment: str, sweep: str,
                 setting_keys: Sequence[str] = DEFAULT_SETTING_KEYS, reference: str | None = None,
                 relative_target: float | None = None, resolution: float | None = None,
                 margin: dict[str, float] | None = None, looks: Sequence[int] | None = None,
                 order: Sequence[int] | None = None, metric: str | None = None,
                 mode: str = "max") -> SimpleNamespace:
    """What the report's numbers come from, read from the sweep's MLflow runs: ``trials``, ``configs``,
    ``best`` (with its intervals), the per-seed ``values`` and the ``comparisons`` (with ``looks`` and
    ``order``, a sequential confirm stage's: :func:`fedsweep.reports.stats.comparison_table`), and
    ``runs``, ``reference``, ``resolution``, ``target``, ``thresholds``, ``max_rounds``. The confirm
    stage's driver reads its open comparisons here, by the report's own rules."""
    from mlflow import MlflowClient
    trials = load_trials(tracking_uri, experiment, sweep)
    trials.attrs.update(metric=metric, mode=mode)    # report.metric, report.mode: what configs are selected,
    #                                                  scored and compared by, and which way is better
    if not trials["status"].isin(SCORED).any():
        counts = ", ".join(f"{k} {v}" for k, v in trials["status"].value_counts().sort_index().items())
        errors = trials.loc[trials["error"] != "", "error"]
        why = f"; the most common error: {errors.value_counts().index[0]}" if len(errors) else ""
        raise ConfigError(f"report: none of the {len(trials)} trials of sweep {sweep!r} has a result to score "
                          f"({counts}){why}")
    runs = _Runs(MlflowClient(tracking_uri=trials.attrs["tracking_uri"]))
    thresholds = None
    if relative_target is not None:
        if reference is None:
            raise ConfigError("report.relative_target needs a reference method (report.reference)")
        settings_in = [k for k in setting_keys if k in trials.attrs["params"]]
        thresholds = relative_targets(trials, runs, settings_in, reference, relative_target)
    configs = config_table(trials, setting_keys)
    best = best_configs(configs, trials)
    rule = configs.attrs["rule"]
    if thresholds is not None:
        keys = trials.attrs["target_keys"]
        best["target"] = [thresholds.get(tuple(r[k] for k in keys), np.nan) for _, r in best.iterrows()]
        target = None
    else:
        target = float(trials["summary/target_accuracy"].dropna().iloc[0]) if rule == "target" else None
        best["target"] = target if target is not None else np.nan
    max_rounds = float(_col(trials, "summary/rounds").max()) if "summary/rounds" in trials else None
    reference = reference if reference in set(best["method"]) else None
    resolution = resolution or 1.0
    metrics = compared_metrics(configs.attrs["selected_on"], rule, resolution, max_rounds, margin, metric, mode)
    score = score_column(configs.attrs["selected_on"], metric)   # what runs are scored by: selection did not look at it
    shown = [score, "summary/final_test_accuracy", "rounds_to_target"]     # the tables' means
    # per seed, from the runs of the selected configs that `best` names in run_ids (other runs of the
    # same configs, fresh seeds, would be another column of `best`: seed_values' runs_column)
    values = seed_values(best, trials, list(dict.fromkeys([*(m.column for m in metrics.values()), *shown])))
    top = max_rounds if max_rounds is not None else math.inf
    span = (-math.inf, math.inf) if metric and own_metric(metric) else (0.0, 1.0)
    best = add_intervals(best, values, {"acc": (score, *span), "final": ("summary/final_test_accuracy", 0.0, 1.0),
                                        "rtt": ("rounds_to_target", 1.0, top)})
    comparisons = comparison_table(values, reference, metrics, looks, order)
    interactions = interaction_table(values, reference, metrics) if len(configs.attrs["settings"]) == 1 else None
    reaching = reach_table(values, reference) if rule == "target" else None
    return SimpleNamespace(trials=trials, runs=runs, configs=configs, best=best, values=values,
                           comparisons=comparisons, interactions=interactions, reference=reference, resolution=resolution, target=target,
                           thresholds=thresholds, max_rounds=max_rounds, reaching=reaching)


#: Reaching the target as a metric of its own: 1 if a run reached it, 0 if not (censored, diverged).
REACHED = Metric("reached", higher_is_better=True, low=0.0, high=1.0, grid=1.0)


def reach_table(values: dict, reference: str | None) -> pd.DataFrame:
    """Whether each method reaches the target as often as the reference: per seed 1 if its run reached it,
    else 0, compared paired by seed as accuracy is (the mean paired difference, the exact sign-flip test;
    no margin: never `equivalent`), Holm over these rows, a family of their own, on every paired seed
    (reached.csv). Rounds to target ranks a run that never reached it last; this says how often."""
    reached = {key: frame.assign(reached=frame["rounds_to_target"].notna().astype(float)) for key, frame in values.items()}
    return comparison_table(reached, reference, {"reached": REACHED})


def make_report(tracking_uri: str | None, experiment: str, sweep: str, out_dir: str | Path,
                setting_keys: Sequence[str] = DEFAULT_SETTING_KEYS, reference: str | None = None,
                relative_target: float | None = None, sampled_keys: Sequence[str] = (),
                random_first: int | None = None, resolution: float | None = None, to_parent: bool = True,
                quiet: bool = False, margin: dict[str, float] | None = None, looks: Sequence[int] | None = None,
                order: Sequence[int] | None = None, metric: str | None = None, mode: str = "max") -> ReportResult:
    """Write ``report.md``, ``accuracy_curves.png``, ``rounds_to_target.png``, ``trials.csv``,
    ``comparisons.csv`` (each method against ``reference``: :mod:`fedsweep.reports.stats`), when a
    setting takes several values ``settings_curves.png``, for runs evaluated per client
    ``client_accuracy.png``, and for runs with per-client weights
    ``weights_<method>.png`` into ``out_dir``; returns the path of ``report.md``.

    ``reference``: the method speed-ups and comparisons are relative to. ``resolution``: rounds between
    evaluations (``eval.every``; default 1), below which a difference in rounds to target is not called.
    ``relative_target``: count rounds to this
    fraction of the reference's final accuracy (:func:`relative_targets`) instead of the logged target.
    ``random_first``: an optuna search's random draws per study, before its model acts (``search_draws.png``).
    ``to_parent``: also log the report onto the sweep's MLflow parent run (:mod:`fedsweep.reports.parent`;
    a store that refuses it costs one line on stderr, not the report); ``quiet``: without the line
    saying it was logged there. ``margin``: equivalence margins (``report.margin``); ``looks``, ``order``:
    a sequential confirm stage's looks and seeds (:func:`fedsweep.sweep.confirm.looks`); ``metric``: what
    configs are selected, scored and compared by (``report.metric``), default test accuracy, and ``mode``
    (``report.mode``) whether a larger one is better. Returns the path
    of ``report.md`` and the tables (:class:`ReportResult`)."""
    from mlflow import MlflowClient  # noqa: F401  (MLflow's import counts in the start-up, ended below)

    from fedsweep.runs.plots import plt  # noqa: F401  (imported here, with MLflow, before start-up ends)
    from fedsweep.util.startup import end_startup
    end_startup()   # `fedsweep report`: its imports are done
    t = sweep_tables(tracking_uri, experiment, sweep, setting_keys, reference, relative_target, resolution, margin,
                     looks, order, metric, mode)
    trials, runs, configs, best, comparisons = t.trials, t.runs, t.configs, t.best, t.comparisons
    reference, resolution, target, thresholds, max_rounds = t.reference, t.resolution, t.target, t.thresholds, t.max_rounds
    settings, tuned, rule = configs.attrs["settings"], configs.attrs["tuned"], configs.attrs["rule"]
    uri = trials.attrs["tracking_uri"]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    accuracy_curves_png(best, runs, out / "accuracy_curves.png", title=f"{sweep}: best config per method")
    rounds_to_target_png(best, out / "rounds_to_target.png", max_rounds, target if rule == "target" else None,
                         relative=thresholds is not None)
    several = len(_groups(best)) > 1
    if several:
        settings_curves_png(best, runs, out / "settings_curves.png", reference,
                            title=f"{sweep}: each method across {', '.join(settings)}")
    weight_figures = weights_figures(best, runs, out)
    clients_table = _client_table(best, trials)
    ecdf = client_ecdf_png(best, runs, out / "client_accuracy.png",
                           title=f"{sweep}: each client's test accuracy, best config per method") \
        if clients_table is not None else None
    if sampled_keys:
        search_png(configs, sampled_keys, out / "search.png", title=f"{sweep}: each sampled config")
    draws = random_first is not None and configs["draw"].notna().any()
    if draws:
        search_draws_png(configs, random_first, out / "search_draws.png", title=f"{sweep}: optuna's draws in order")
    trials.to_csv(out / "trials.csv", index=False)
    comparisons.to_csv(out / "comparisons.csv", index=False)
    forest_png(comparisons, reference, out / "comparisons.png", resolution,
               title=f"{sweep}: each method against {reference}, paired by seed")
    verdicts_tex(comparisons, reference, out / "verdicts.tex")
    interactions = t.interactions if t.interactions is not None and len(t.interactions) else None
    if interactions is not None:
        interactions.to_csv(out / "interactions.csv", index=False)
    reaching = t.reaching if t.reaching is not None and len(t.reaching) else None
    if reaching is not None:
        reaching.to_csv(out / "reached.csv", index=False)

    counts = ", ".join(f"{k} {v}" for k, v in trials["status"].value_counts().sort_index().items())
    mixed = files_warning(trials.attrs.get("sweep_files", {}), sweep)
    if mixed:
        print(f"report: warning: {mixed}", file=sys.stderr, flush=True)
    running = _still_running(runs.client, trials)
    if running:
        print(f"report: note: {running}", file=sys.stderr, flush=True)
    dupes = trials.attrs["runs_read"] - len(trials)
    if rule == "target":
        what = (f"{relative_target:g} × the final accuracy of {reference}'s best config under the same "
                f"{', '.join(trials.attrs['target_keys']) or 'sweep'} (" + ", ".join(
                    f"{'/'.join(map(_fmt_value, k)) or 'all'}: {v:.4f}" for k, v in thresholds.items()) + ")"
                if thresholds is not None else f"{target:g}")
        rule_text = (f"fewest mean rounds to the target accuracy {what} (configs where every seed reached it "
                     "first, then by the fraction of seeds that did; ties broken by best accuracy)")
    elif rule == "metric" and own_metric(metric):
        rule_text = (f"{'lowest' if mode == 'min' else 'highest'} mean over seeds of `{metric}` (`report.metric`, "
                     "the algorithm's own, on training data: each run's value at its end; configs with diverged "
                     "runs after the others)")
    elif rule == "metric":
        rule_text = (f"best mean over seeds of `{metric}` (`report.metric`: each run's best, or with a validation "
                     "split its value at the round of its validation twin's best)")
    else:
        rule_text = "best mean over seeds of the best test accuracy (no target accuracy was set)"
    lines = [
        f"# Sweep report: {sweep}",
        "",
        f"- experiment: `{experiment}`",
        f"- tracking URI: `{uri}`",
        f"- trials: {len(trials)} ({counts})" + (f"; {dupes} superseded duplicate run(s) ignored" if dupes else ""),
        *([f"- **note**: {mixed}"] if mixed else []),
        *([f"- **the sweep has not ended**: {running}"] if running else []),
        f"- generated: {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')}",
        f"- best config per method: {rule_text}",
        f"- {_splits_text(configs.attrs['selected_on'], best, trials)}",
        f"- settings (compared, not tuned; best config chosen per setting): "
        f"{', '.join(f'`{k}`' for k in settings) or 'none'}",
        f"- tuned params: {', '.join(f'`{k}`' for k in tuned) or 'none'}",
        "- scored: finished, diverged and stopped trials; a diverged trial counts as accuracy 0 and never "
        "reaching the target; best and final accuracy and rounds to target: mean over seeds [its 95% "
        "t-interval], none for one seed (all configs: mean ± sample std); rounds/seconds/models to target are "
        "means over the seeds that reached it; stability: mean lag-one autocorrelation of the normalized accuracy "
        "changes between evaluations (FedSoftMax Table 4; near 1 smooth, below 0 zig-zag).",
        "",
        "## Best config per method",
        "",
        _best_table(best),
        "",
        "![test accuracy vs round](accuracy_curves.png)",
        "",
        "![rounds to target](rounds_to_target.png)",
        "",
    ]
    if rule == "target":
        ref_text = f"; (x×) = speed-up over {reference}, its mean rounds / the method's" if reference else ""
        lines += [
            "## Rounds to target per setting",
            "",
            f"Mean rounds to the target [95% CI] of each method's best config under each setting{ref_text}; "
            "k/n reached: only k of n seeds reached it (the mean and CI are theirs). These means are each "
            "method's over its own seeds, unpaired; after each, the verdict of its comparison paired by seed "
            "(`comparisons.png`, and below), which is what to read: a paired difference can be inconclusive "
            "where two means and their intervals look apart, and called where they overlap.",
            "",
            _rounds_table(best, reference, comparisons),
            "",
        ]
    if clients_table is not None:
        lines += ["## Per-client accuracy", "",
                  "Each client scored on its own test data at the last evaluation (`eval.clients`; docs/run.md, "
                  "Per-client evaluation): the global model, it fine-tuned on the client's data, and the method's "
                  "personal models where it has them (with `eval.unseen_clients`, the global model and it "
                  "fine-tuned on the clients held out of training, apart); per model the mean over clients / the mean of the worst 10% "
                  "/ the lowest client, averaged over the best config's runs (a run the scheduler stopped at its own "
                  "last evaluation, an earlier round than finished runs'). Descriptive: these are final values, "
                  "not the numbers the configs were selected or compared by.", "", clients_table, ""]
        if ecdf is not None:
            lines += ["![each client's test accuracy](client_accuracy.png)", ""]
    own_table = _own_table(best, trials)
    if own_table is not None:
        lines += ["## The methods' own metrics", "",
                  "What each algorithm's `round_metrics` logs (declared in its `metrics`), as of the last round that "
                  "logged it, mean ± std over the best config's runs (trials.csv: `summary/final_<metric>`, `/` "
                  "written `_`). Measured on training data; descriptive unless `report.metric` names one.", "",
                  own_table, ""]
    lines += _comparison_lines(comparisons, reference, resolution)
    if interactions is not None:
        lines += _interaction_lines(interactions, settings[0])
    if reaching is not None:
        lines += ["## Reaching the target", "",
                  f"How often each method reaches the target against {reference}: per seed 1 if its run reached it, "
                  "else 0 (it ran out of rounds, diverged or was stopped), the mean paired difference (the share of "
                  "seeds) and the exact sign-flip test, Holm over these rows (a family of their own, on every paired "
                  "seed). `better`: it reaches the target more often; no margin, so never `equivalent`. "
                  "`reached.csv` holds every column.", "", _comparisons_table(reaching), ""]
    lines += _across_settings(t.values, configs, reference, several, out, sweep)
    if several:
        lines += ["![each method across settings](settings_curves.png)", ""]
    if sampled_keys:
        lines += ["## Sampled configs", "", "Each sampled config's mean best test accuracy over its seeds against "
                  "the keys `search:` draws, one panel a key (the best config per method is in the tables above).",
                  "", "![each sampled config](search.png)", ""]
    if sampled_keys and draws:
        lines += [f"Each study's configs in the order optuna drew them (the first {random_first} at random, then "
                  "TPE's), with the best so far: whether the model found better configs than its random draws.",
                  "", "![optuna's draws in order](search_draws.png)", ""]
    if weight_figures:
        lines += ["## Aggregation weights", "",
                  "For each method that records per-client weights (loss-aware aggregation), its best config "
                  "under each setting, first seed: |α_i − p_i| per client over the rounds (the FedSoftMax paper's "
                  "Fig. 6) and, per client and round, whether α_i is among the round's largest (a fifth of the clients, "
                  "at most ten; its Fig. 7).", ""]
        lines += [f"![aggregation weights of {m}]({name})" for m, name in weight_figures] + [""]
    lines += [
        "## All configs",
        "",
        _all_table(configs, targeted=_targeted(best)),
        "",
    ]
    incomplete = trials[trials["status"] == "incomplete"]
    if len(incomplete):
        lines += ["## Incomplete runs", "", "Trained, but without a summary in MLflow, so not scored: each run, "
                  "with why (its `fedsweep.error` tag).", "",
                  _markdown(["run", "config_id", "seed", "why"],
                            [[str(r["run_name"]), f"`{r['config_id']}`", _fmt_value(r["seed"]), r["error"]]
                             for _, r in incomplete.iterrows()]), ""]
    failed = trials[trials["status"] == "failed"]   # a run resumed since keeps no error (an older fedsweep's may)
    if len(failed):
        lines += ["## Failed trials", "", "Each error once (the last line of its traceback; the runs' "
                  "`fedsweep.error` tag), with the trials that ended with it.", "",
                  _markdown(["trials", "error", "configs"],
                            [[str(len(g)), f"`{e}`", ", ".join(sorted(f"`{c}`" for c in g["config_id"].unique()))]
                             for e, g in sorted(failed.groupby("error"), key=lambda x: -len(x[1]))]), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    if to_parent and not running:   # an open sweep's run gets its own report when it ends
        _log_to_parent(runs.client, trials, out, best, lines, quiet, comparisons, configs)
    return ReportResult(path, trials, configs, best, comparisons,
                        interactions if interactions is not None else pd.DataFrame())


def _still_running(client, trials: pd.DataFrame) -> str | None:
    """What a report made before its sweep ended reads (its MLflow run still open: the sweep runs, or its
    driver was killed), in one line; None for a sweep that has ended."""
    from fedsweep.reports.parent import parent_run_id
    run_id = parent_run_id(trials)
    if run_id is None:
        return None
    run = client.get_run(run_id)
    if run.info.status != "RUNNING":
        return None
    ended = int(trials["status"].isin(SCORED).sum())
    planned = run.data.tags.get("sweep.trials", "?")
    return (f"its MLflow run {run_id} is still open (the sweep runs, or its driver was killed: `fedsweep tune "
            f"--resume` continues it); {ended} of its {planned} trials have a result, and this report reads only "
            "those. It is not logged onto the open run: the sweep logs its own report when it ends")


def _log_to_parent(client, trials: pd.DataFrame, out: Path, best: pd.DataFrame, lines: list[str],
                   quiet: bool = False, comparisons: pd.DataFrame | None = None,
                   configs: pd.DataFrame | None = None) -> None:
    import sys

    from mlflow.exceptions import MlflowException

    from fedsweep.reports.parent import log_to_parent, note_text, parent_run_id
    from fedsweep.reports.verdicts import verdict_table
    run_id = parent_run_id(trials)
    if run_id is None:
        return
    try:
        reference = comparisons["reference"].iloc[0] if comparisons is not None and len(comparisons) else None
        log_to_parent(client, run_id, out, best, note_text(lines, verdict_table(comparisons, reference)), comparisons,
                      trials)
        if configs is not None:
            config_views(client, run_id, trials, configs, best, comparisons)
        if not quiet:
            print(f"logged onto the sweep's MLflow parent run {run_id}: the report as its description and "
                  f"artifacts (report/), each method's selected result and verdict as its metrics and tags, and "
                  f"a run per config for the sweep's views (`fedsweep ui`)")
    except (MlflowException, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        print(f"report: written to {out}, but not onto the sweep's MLflow parent run {run_id} ({first})", file=sys.stderr)


def config_views(client, parent_id: str, trials: pd.DataFrame, configs: pd.DataFrame, best: pd.DataFrame,
                 comparisons: pd.DataFrame | None) -> None:
    """A run per config under the parent (:mod:`fedsweep.reports.config_runs`) and the sweep's views on
    them (:mod:`fedsweep.reports.view`), with the report's settings and tuned keys as columns."""
    from fedsweep.reports.config_runs import config_rows, write_config_runs
    from fedsweep.reports.view import write_views
    experiment_id = client.get_run(parent_id).info.experiment_id
    sweep = trials.attrs["sweep"]
    write_config_runs(client, experiment_id, parent_id, sweep, config_rows(trials, configs, best, comparisons))
    attrs = configs.attrs
    write_views(client, experiment_id, sweep, attrs["settings"], attrs["tuned"], attrs["rule"] == "target",
                attrs.get("mode") == "min", comparisons is not None and len(comparisons) > 0)
