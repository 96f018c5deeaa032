"""The sweep's trials read back from MLflow, and each method's best config per setting.

Reads the child runs written by ``fedsweep tune`` (docs/sweeps.md, "MLflow layout") and writes
``report.md``, ``accuracy_curves.png`` (test accuracy vs round, the FedLGA paper's Fig. 3 shape),
``rounds_to_target.png`` (its Fig. 6/7 shape), ``trials.csv`` (one row per trial) and, when a
setting takes several values, ``settings_curves.png`` (one panel per method, one curve per setting
value: the FedCLG paper's Fig. 6 m_s ablation shape). ``report.md`` also holds rounds to target per
method and setting with the speed-up over a reference method (the FedCLG paper's Table I shape).

How the numbers are made:

- **Trials.** Every run tagged ``fedsweep.role=trial`` and ``fedsweep.sweep=<sweep>``, from every
  parent run (a sweep may be resumed or rerun). If a ``(config_id, seed)`` appears more than once,
  the latest finished/diverged run is kept (else the latest run).
- **Scored trials** are those ``finished``, ``diverged`` or ``stopped`` (by the scheduler) with a
  summary; ``running``/``failed`` ones are listed but not scored (each failed run's error once, in
  "Failed trials"), and so are ``incomplete`` ones, which trained but whose summary never reached
  MLflow (a run of an older fedsweep that ended without its summary counts as one): each is named,
  with the reason, in "Incomplete runs". A sweep with nothing scored is an error. A diverged trial
  counts as accuracy 0 and as never reaching the target.
- **Settings vs tuned params.** Params that vary across trials (``seed``, ``algorithm.name`` and
  ``mlflow.*`` aside) are either *settings* -- the keys in ``setting_keys``, default
  ``heterogeneity.rho`` -- under which methods are compared, or *tuned* hyperparameters. The best
  config is chosen per (setting values, method).
- **Selection rule.** With a target accuracy (``summary/target_accuracy`` logged): fewest mean
  rounds to target; configs where every seed reached it rank first, then by the fraction of seeds
  that did, then by mean rounds (over the seeds that reached), ties broken by best accuracy.
  Without a target: best mean over seeds of the best test accuracy.
- **Spread.** ``mean ± std`` uses the sample std (ddof=1) over seeds; it is omitted for one seed.
  The report's 95% intervals and its verdicts against a reference method: :mod:`fedsweep.reports.stats`.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from fedsweep.config.schema import ConfigError
from fedsweep.runs.summary import own_metric
from fedsweep.runs.tracking import check_existing_store

DEFAULT_SETTING_KEYS = ("heterogeneity.rho",)
SCORED = ("finished", "diverged", "stopped")
_DONE = ("finished", "diverged")
_SUMMARY_EXTRA = ("best/test_accuracy", "rounds_to_target", "best/val_accuracy", "val_rounds_to_target")
_NOT_PARAMS = ("seed", "algorithm.name")


# ---------------------------------------------------------------------------------------------
# Reading MLflow
# ---------------------------------------------------------------------------------------------


def _number(value: str):
    """A logged param (always a string) back to int/float where it reads as one."""
    for cast in (int, float):
        try:
            return cast(value)
        except (TypeError, ValueError):
            pass
    return value


def load_trials(tracking_uri: str | None, experiment: str, sweep: str, parent_run_id: str | None = None) -> pd.DataFrame:
    """One row per trial of ``sweep`` in ``experiment``, duplicates of a (config_id, seed) dropped;
    with ``parent_run_id``, only that parent run's (one run of the sweep: ``fedsweep.tune``'s table).

    Columns: ``run_id, run_name, parent_run_id, method, config_id, seed, status, error`` (a failed or
    incomplete run's ``fedsweep.error``, else empty), ``start_time, end_time``, the
    params that vary across trials (dotted keys, numbers parsed) and the summary metrics
    (``best/test_accuracy``, ``rounds_to_target``, ``summary/*``). ``df.attrs`` holds
    ``params`` (the varying param names), ``tracking_uri``, ``experiment``, ``sweep``, ``runs_read``.
    Raises ConfigError if the experiment is missing or holds no trials of that sweep.
    """
    from mlflow import MlflowClient

    uri = check_existing_store(tracking_uri)   # MLflow would create a missing store
    from fedsweep.runs.orphans import end_orphaned_runs
    end_orphaned_runs(uri)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None or exp.lifecycle_stage != "active":
        raise ConfigError(f"report: no MLflow experiment {experiment!r} in store {uri}; run `fedsweep tune "
                          f"<sweep.yaml>` first (or set the sweep file's mlflow.experiment and mlflow.tracking_uri "
                          f"to those it ran with)")
    flt = f"tags.`fedsweep.role` = 'trial' AND tags.`fedsweep.sweep` = '{sweep}'" + \
        (f" AND tags.`mlflow.parentRunId` = '{parent_run_id}'" if parent_run_id else "")
    runs, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], filter_string=flt, max_results=1000, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            break
    if not runs:
        raise ConfigError(f"report: experiment {experiment!r} in store {uri} holds no trial runs of sweep "
                          f"{sweep!r}; run `fedsweep tune <sweep.yaml>` first")

    rows, param_keys = [], set()
    for r in runs:
        tags, params, metrics = r.data.tags, r.data.params, r.data.metrics
        keep = {k: _number(v) for k, v in params.items() if k not in _NOT_PARAMS and not k.startswith("mlflow.")}
        param_keys |= keep.keys()
        status, error = tags.get("fedsweep.status", "finished"), tags.get("fedsweep.error", "")
        if status in SCORED and "summary/rounds" not in metrics:
            status, error = "incomplete", error or "no summary was logged"
        rows.append({
            "run_id": r.info.run_id, "run_name": r.info.run_name, "parent_run_id": tags.get("mlflow.parentRunId"),
            "method": tags.get("fedsweep.method") or params.get("algorithm.name"),
            "config_id": tags.get("fedsweep.config_id"), "seed": _number(params.get("seed")),
            "draw": _number(tags.get("fedsweep.draw")),   # a config's place in its optuna study
            "stage": tags.get("fedsweep.stage", "tune"),  # `confirm`: a selected config rerun on a fresh seed
            "config_label": tags.get("fedsweep.config"),  # the run name less its seed
            "status": status, "error": error,
            "start_time": r.info.start_time, "end_time": r.info.end_time or 0,
            **keep,
            **{k: v for k, v in metrics.items() if k.startswith("summary/") or k in _SUMMARY_EXTRA},
        })
    df = pd.DataFrame(rows)
    df["_done"] = df["status"].isin(_DONE)
    df = (df.sort_values(["_done", "end_time", "start_time"])
            .drop_duplicates(["config_id", "seed"], keep="last")
            .drop(columns="_done").sort_values(["method", "config_id", "seed"]).reset_index(drop=True))
    varying = sorted(k for k in param_keys if df[k].dropna().astype(str).nunique() > 1)
    df = df.drop(columns=sorted(param_keys - set(varying)))
    for k in varying:   # numbers beside words (algorithm.damping: 0, 1, step): all words, so they sort
        if len({isinstance(v, str) for v in df[k].dropna()}) > 1:
            df[k] = df[k].map(lambda v: v if isinstance(v, str) or pd.isna(v) else _fmt_value(v))
    df.attrs.update(params=varying, tracking_uri=uri, experiment=experiment, sweep=sweep, runs_read=len(runs),
                    sweep_files=sweep_files(client, exp.experiment_id, sweep))
    return df


def sweep_files(client, experiment_id: str, sweep: str) -> dict[str, int]:
    """{sweep file: its sweep runs} of the sweep (parent) runs named ``sweep`` in the experiment (untagged:
    not counted): two files of one ``name:`` write one sweep."""
    flt = f"tags.`fedsweep.role` = 'sweep' AND tags.`fedsweep.sweep` = '{sweep}'"
    files: dict[str, int] = {}
    for run in client.search_runs([experiment_id], filter_string=flt, max_results=1000):
        if "fedsweep.sweep_file" in run.data.tags:
            files[run.data.tags["fedsweep.sweep_file"]] = files.get(run.data.tags["fedsweep.sweep_file"], 0) + 1
    return files


def files_warning(files: dict[str, int], sweep: str) -> str | None:
    """One line where runs of sweep ``sweep`` come from more than one sweep file, else None."""
    if len(files) < 2:
        return None
    shown = "; ".join(f"{f} ({n} run{'s' if n > 1 else ''} of it)" for f, n in sorted(files.items()))
    return (f"runs of sweep {sweep!r} were started from {len(files)} sweep files: {shown}. They are read as one sweep "
            "(a later run of a config replacing an earlier one); give each file a `name:` of its own to keep them apart")


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------

def selection_rule(trials: pd.DataFrame) -> str:
    """``"metric"`` with ``report.metric`` (``trials.attrs["metric"]``), else ``"target"`` if a target
    accuracy was logged for any trial, else ``"accuracy"``."""
    if trials.attrs.get("metric"):
        return "metric"
    col = "summary/target_accuracy"
    return "target" if col in trials and trials[col].notna().any() else "accuracy"


def selected_on(trials: pd.DataFrame) -> str:
    """``"validation"`` where every scored tuning trial has a validation split (its runs log
    ``best/val_accuracy``), else ``"test"``: selection then reads the split it also scores on."""
    tuning = trials[(trials["stage"] == "tune") & trials["status"].isin(SCORED) & (trials["status"] != "diverged")]
    return "validation" if len(tuning) and _col(tuning, "best/val_accuracy").notna().all() else "test"


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    return df[name] if name in df else pd.Series(np.nan, index=df.index)


# What a run is selected by and what it is scored by, per split that selects. Scoring is always on
# test; with a validation split a run's accuracy is its test accuracy at its best validation round
# (its model as validation would early-stop it), never the best test accuracy over rounds.
SELECTION_COLUMNS = {"validation": ("best/val_accuracy", "val_rounds_to_target"),
                     "test": ("best/test_accuracy", "rounds_to_target")}
SCORE_COLUMNS = {"validation": ("summary/test_accuracy_at_best_val", "rounds_to_target"),
                 "test": ("best/test_accuracy", "rounds_to_target")}


def score_column(split: str, metric: str | None = None) -> str:
    """The column a run is scored by: test accuracy (:data:`SCORE_COLUMNS`), or ``report.metric``'s
    (a per-client accuracy: its best, or at the round of its validation twin's best; an algorithm's own
    metric: its value at the run's end, on training data; runs/summary.py)."""
    if not metric:
        return SCORE_COLUMNS[split][0]
    flat = metric.replace("/", "_")
    if own_metric(metric):
        return f"summary/final_{flat}"
    return f"summary/{flat}_at_best_val" if split == "validation" else f"summary/best_{flat}"


def selection_column(split: str, metric: str | None = None) -> str:
    """The column selection ranks a run by: :data:`SELECTION_COLUMNS`' accuracy, or ``report.metric``'s
    best on the split that selects (its validation twin's where there is one); an algorithm's own metric's
    value at the run's end (measured on training data, it is both what selects and what scores)."""
    if not metric:
        return SELECTION_COLUMNS[split][0]
    if own_metric(metric):
        return score_column(split, metric)
    kind, _, name = metric.partition("/")
    return f"summary/best_{kind}_val_{name}" if split == "validation" else f"summary/best_{kind}_{name}"


def _scores(g: pd.DataFrame, split: str, metric: str | None = None) -> dict:
    """A config's numbers over the scored runs ``g`` (one a seed): the reported ones (on test) and
    the ``sel_*`` ones selection ranks by (on ``split``). A diverged run scores accuracy 0 and never
    reaches the target; it has no value of an algorithm's own metric (NaN: its config ranks after those with
    fewer diverged runs, and comparisons pair the seeds where both ran to the end)."""
    ok = g["status"] != "diverged"
    (acc_col, rtt_col), (sel_acc_col, sel_rtt_col) = SCORE_COLUMNS[split], SELECTION_COLUMNS[split]
    acc_col, sel_acc_col = score_column(split, metric), selection_column(split, metric)
    worst = math.nan if metric and own_metric(metric) else 0.0
    acc = _col(g, acc_col).where(ok).fillna(worst)
    final = _col(g, "summary/final_test_accuracy").where(ok).fillna(0.0)
    rtt = _col(g, rtt_col).where(ok)
    sel_acc, sel_rtt = _col(g, sel_acc_col).where(ok).fillna(worst), _col(g, sel_rtt_col).where(ok)
    return {
        "n": len(g),
        "acc_mean": acc.mean(), "acc_std": acc.std(),
        "final_mean": final.mean(), "final_std": final.std(),
        "rtt_mean": rtt.mean(), "rtt_std": rtt.std(), "reached": int(rtt.notna().sum()),
        "sec_to_target": _col(g, "summary/seconds_to_target").where(rtt.notna()).mean(),
        "comm_to_target": _col(g, "summary/comm_up_to_target").where(rtt.notna()).mean(),
        "sec_per_round": _col(g, "summary/seconds_per_round").mean(),
        "stability": _col(g, "summary/stability").where(ok).mean(),
        "sel_acc_mean": sel_acc.mean(), "sel_rtt_mean": sel_rtt.mean(), "sel_reached": int(sel_rtt.notna().sum()),
        "run_ids": list(g["run_id"]),
    }


def config_table(trials: pd.DataFrame, setting_keys: Sequence[str] = DEFAULT_SETTING_KEYS) -> pd.DataFrame:
    """One row per config_id of the tuning stage, scored over its seeds and ranked within its
    (settings, method).

    Columns: ``method``, the settings, ``config`` (its tuned params as ``k=v, ...``), ``n`` (scored
    seeds), ``acc_mean/acc_std`` (what runs are scored by: ``report.metric`` where ``trials.attrs`` names
    one (:func:`score_column`), else the accuracy: best test accuracy, or with a
    validation split the test accuracy at the best validation round), ``final_mean/final_std``,
    ``rtt_mean/rtt_std`` (rounds to target on test over the seeds that reached it), ``reached``,
    ``sec_to_target``, ``comm_to_target``, ``sec_per_round``, ``stability``, ``sel_acc_mean``,
    ``sel_rtt_mean``, ``sel_reached`` (the same on the split that selects: :func:`selected_on`),
    ``diverged``, ``statuses``, ``run_ids`` (scored runs), ``rank`` (1 = best config of its method under
    its settings, by the ``sel_*`` numbers alone). ``attrs``: ``settings``, ``tuned``, ``rule``,
    ``selected_on``. Confirm-stage runs are not read here (:func:`best_configs` scores with them).
    """
    params = trials.attrs.get("params", [])
    settings = [k for k in setting_keys if k in params]
    tuned = [k for k in params if k not in settings]
    split, metric = selected_on(trials), trials.attrs.get("metric")
    t = trials[trials["stage"] == "tune"]
    scored = t["status"].isin(SCORED)
    # a method's config shows the keys it is tuned over: those that vary among its own trials
    # (FedAvg's unused server_data.lr, constant for it, is left out)
    own = {m: [k for k in tuned if g[k].dropna().astype(str).nunique() > 1] for m, g in t.groupby("method")}
    rows = []
    for cid, g in t.groupby("config_id", sort=False):
        first = g.iloc[0]
        rows.append({
            "config_id": cid, "method": first["method"],
            **{k: first[k] for k in settings},
            "config": ", ".join(f"{k}={_fmt_value(first[k])}" for k in own[first["method"]] if _present(first[k])),
            **_scores(g[scored.loc[g.index]], split, metric),
            "diverged": int((g["status"] == "diverged").sum()),
            "statuses": ", ".join(f"{k} {v}" for k, v in g["status"].value_counts().sort_index().items()),
            "draw": first.get("draw"),
            **{f"param:{k}": first[k] for k in tuned},     # for the plots against sampled keys
        })
    table = pd.DataFrame(rows)
    if selection_rule(trials) == "target":
        table["_frac"] = table["sel_reached"] / table["n"].clip(lower=1)
        keys, asc = ["_frac", "sel_rtt_mean", "sel_acc_mean", "config_id"], [False, True, False, True]
    elif metric and own_metric(metric):   # diverged runs have none: fewest first, then by report.mode
        keys, asc = ["diverged", "sel_acc_mean", "config_id"], [True, trials.attrs.get("mode") == "min", True]
    else:
        keys, asc = ["sel_acc_mean", "config_id"], [False, True]
    table = table.sort_values(keys, ascending=asc, na_position="last")
    table["rank"] = table.groupby([*settings, "method"], sort=False, dropna=False).cumcount() + 1
    table = table.sort_values(["method", *settings, "rank"], kind="stable")
    table.attrs.update(settings=settings, tuned=tuned, rule=selection_rule(trials), selected_on=split, metric=metric,
                       mode=trials.attrs.get("mode", "max"))
    return table.drop(columns=[c for c in table if c.startswith("_")]).reset_index(drop=True)


def selected_configs(tracking_uri: str | None, experiment: str, sweep: str,
                     setting_keys: Sequence[str] = DEFAULT_SETTING_KEYS, reference: str | None = None,
                     relative_target: float | None = None, metric: str | None = None,
                     mode: str = "max") -> pd.DataFrame:
    """The rank-1 config of each (settings, method) among the sweep's tuning trials, by the rule the
    report's best-config table uses (a confirm stage reruns exactly these): one row each, with its
    ``config_id`` and ``run_ids``. Raises ConfigError where a method has nothing scored to select."""
    from mlflow import MlflowClient
    trials = load_trials(tracking_uri, experiment, sweep)
    trials.attrs.update(metric=metric, mode=mode)
    if relative_target is not None:
        settings_in = [k for k in setting_keys if k in trials.attrs["params"]]
        relative_targets(trials, _Runs(MlflowClient(tracking_uri=trials.attrs["tracking_uri"])), settings_in,
                         reference, relative_target)
    configs = config_table(trials, setting_keys)
    unscored = sorted(set(trials["method"]) - set(configs.loc[configs["n"] > 0, "method"]))
    if unscored:
        raise ConfigError(f"confirm: {', '.join(unscored)} has no scored tuning trial to select a config from "
                          "(every one failed or is incomplete)")
    return configs[(configs["rank"] == 1) & (configs["n"] > 0)].reset_index(drop=True)


def best_configs(configs: pd.DataFrame, trials: pd.DataFrame | None = None) -> pd.DataFrame:
    """The rank-1 config of each (settings, method), ordered by settings then method.

    A method that lacks a setting key (FedAvg has no ``algorithm.temperature``) is compared under
    every value of that key: its row is repeated for each value the other methods take. With
    ``trials`` holding confirm-stage runs of a selected config (``fedsweep tune`` with ``confirm:``),
    its reported numbers are those runs' (``scored_on`` = ``confirm``), never the tuning seeds' it was
    selected on; else ``scored_on`` = ``tuning``."""
    settings = configs.attrs.get("settings", [])
    best = configs[configs["rank"] == 1].copy()
    best["scored_on"] = "tuning"
    if trials is not None:
        confirm = trials[(trials["stage"] == "confirm") & trials["status"].isin(SCORED)]
        split = configs.attrs.get("selected_on", "test")
        for i, row in best.iterrows():
            runs = confirm[confirm["config_id"] == row["config_id"]]
            if len(runs):
                for key, value in _scores(runs, split, configs.attrs.get("metric")).items():
                    best.at[i, key] = value
                best.at[i, "scored_on"] = "confirm"
    for key in settings:
        values = best[key].dropna().unique()
        missing = best[key].isna()
        if missing.any() and len(values):
            copies = [best[missing].assign(**{key: v}) for v in values]
            best = pd.concat([best[~missing], *copies])
    best = best.sort_values([*settings, "method"]).reset_index(drop=True)
    best.attrs.update(configs.attrs)
    return best


def relative_targets(trials: pd.DataFrame, runs: _Runs, settings: Sequence[str], reference: str,
                     fraction: float) -> dict[tuple, float]:
    """Set each trial's rounds to target against ``fraction`` × the reference's final accuracy.

    The FedSoftMax paper's R90 (Table 3) read as rounds to 90% of FedAvg's final accuracy: for each
    value of the settings the reference has (it may lack some, e.g. a temperature), the reference's
    config is the one with the highest mean final accuracy on the split that selects (:func:`selected_on`),
    and the threshold is ``fraction`` × its mean final test accuracy; each trial's rounds to target is
    the first evaluation at or above it, from its test accuracy history. With a validation split the
    same is done on validation (``val_rounds_to_target``, against that config's final validation
    accuracy), which selection reads. Rewrites ``rounds_to_target`` (and ``val_rounds_to_target``)
    and ``summary/target_accuracy`` in place (seconds and communication to target are dropped: they
    were counted to the absolute target). Returns {values of the reference's settings: threshold}."""
    ref = trials[(trials["method"] == reference) & trials["status"].isin(SCORED) & (trials["stage"] == "tune")]
    if ref.empty:
        raise ConfigError(f"report.relative_target: the reference method {reference!r} has no finished trials")
    keys = [k for k in settings if ref[k].notna().all()]
    splits = {"test": ("summary/final_test_accuracy", "test/accuracy", "rounds_to_target")}
    if selected_on(trials) == "validation":
        splits["validation"] = ("summary/final_val_accuracy", "val/accuracy", "val_rounds_to_target")
    ok = ref["status"] != "diverged"
    finals = ref.assign(**{split: _col(ref, col).where(ok).fillna(0.0) for split, (col, _, _) in splits.items()})
    per_config = finals.groupby([*keys, "config_id"], dropna=False)[list(splits)].mean()
    chooser = "validation" if "validation" in splits else "test"
    chosen = per_config.loc[per_config.groupby(level=keys)[chooser].idxmax()] if keys else \
        per_config.loc[[per_config[chooser].idxmax()]]
    thresholds = {split: {(tuple(i[:-1]) if keys else ()): fraction * v for i, v in chosen[split].items()}
                  for split in splits}
    for split, (_, history_key, column) in splits.items():
        values = []
        for _, r in trials.iterrows():
            thr = thresholds[split].get(tuple(r[k] for k in keys))
            hit = next((step for step, acc in runs.accuracy(r["run_id"], history_key).items()
                        if thr is not None and acc >= thr - 1e-12), None)
            values.append(float(hit) if hit is not None and r["status"] != "diverged" else np.nan)
        trials[column] = values
    trials["summary/target_accuracy"] = [thresholds["test"].get(tuple(r[k] for k in keys), np.nan)
                                         for _, r in trials.iterrows()]
    trials.drop(columns=[c for c in ("summary/seconds_to_target", "summary/comm_up_to_target") if c in trials],
                inplace=True)
    trials.attrs["target_keys"] = keys
    return thresholds["test"]


# ---------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------


def _present(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _fmt_value(v) -> str:
    return f"{v:g}" if isinstance(v, (float, np.floating)) else str(v)


def _setting_label(row, settings: Sequence[str]) -> str:
    return ", ".join(f"{k}={_fmt_value(row[k])}" for k in settings)


def _groups(best: pd.DataFrame):
    """(label, rows) per distinct setting combination, in order."""
    settings = best.attrs["settings"]
    if not settings:
        return [("", best)]
    return [(_setting_label(g.iloc[0], settings), g) for _, g in best.groupby(settings, sort=True, dropna=False)]


class _Runs:
    """The sweep's runs in MLflow for one report: each accuracy history and CSV artifact (``clients.csv``,
    ``client_eval.csv``) is read once, however many tables and figures use it."""

    def __init__(self, client):
        self.client, self._accuracy, self._logs = client, {}, {}

    def accuracy(self, run_id: str, key: str = "test/accuracy") -> pd.Series:
        """Test accuracy (or the history of metric ``key``) by round."""
        if (run_id, key) not in self._accuracy:
            history = self.client.get_metric_history(run_id, key)
            self._accuracy[run_id, key] = pd.Series({m.step: m.value for m in history}, dtype=float).sort_index()
        return self._accuracy[run_id, key]

    def client_log(self, run_id: str) -> pd.DataFrame | None:
        """The run's ``clients.csv`` artifact (per round and sampled client), or None if it has none."""
        return self.table(run_id, "clients.csv")

    def client_eval(self, run_id: str) -> pd.DataFrame | None:
        """The run's ``client_eval.csv`` artifact (per evaluated client, ``eval.clients``), or None."""
        return self.table(run_id, "client_eval.csv")

    def table(self, run_id: str, name: str) -> pd.DataFrame | None:
        """The run's CSV artifact ``name``, read once; None if the run has none."""
        if (run_id, name) not in self._logs:
            self._logs[run_id, name] = self._read_table(run_id, name)
        return self._logs[run_id, name]

    def _read_table(self, run_id: str, name: str) -> pd.DataFrame | None:
        import os
        import tempfile
        if not any(f.path == name for f in self.client.list_artifacts(run_id)):
            return None     # e.g. an algorithm without per-client records
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        with tempfile.TemporaryDirectory() as tmp:
            return pd.read_csv(self.client.download_artifacts(run_id, name, tmp))
