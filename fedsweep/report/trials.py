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
  The report's 95% intervals and its verdicts against a reference method: :mod:`fedsweep.report.stats`.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from fedsweep.config.schema import ConfigError
from fedsweep.runs.tracking import check_existing_store

DEFAULT_SETTING_KEYS = ("heterogeneity.rho",)
SCORED = ("finished", "diverged", "stopped")
_DONE = ("finished", "diverged")
_SUMMARY_EXTRA = ("best/test_accuracy", "rounds_to_target")
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


def load_trials(tracking_uri: str | None, experiment: str, sweep: str) -> pd.DataFrame:
    """One row per trial of ``sweep`` in ``experiment``, duplicates of a (config_id, seed) dropped.

    Columns: ``run_id, run_name, parent_run_id, method, config_id, seed, status, error`` (a failed or
    incomplete run's ``fedsweep.error``, else empty), ``start_time, end_time``, the
    params that vary across trials (dotted keys, numbers parsed) and the summary metrics
    (``best/test_accuracy``, ``rounds_to_target``, ``summary/*``). ``df.attrs`` holds
    ``params`` (the varying param names), ``tracking_uri``, ``experiment``, ``sweep``, ``runs_read``.
    Raises ConfigError if the experiment is missing or holds no trials of that sweep.
    """
    from mlflow import MlflowClient

    uri = check_existing_store(tracking_uri)   # MLflow would create a missing store
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None or exp.lifecycle_stage != "active":
        raise ConfigError(f"report: no MLflow experiment {experiment!r} in store {uri}; run `fedsweep tune "
                          f"<sweep.yaml>` first (or set the sweep file's mlflow.experiment and mlflow.tracking_uri "
                          f"to those it ran with)")
    flt = f"tags.`fedsweep.role` = 'trial' AND tags.`fedsweep.sweep` = '{sweep}'"
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
    df.attrs.update(params=varying, tracking_uri=uri, experiment=experiment, sweep=sweep, runs_read=len(runs))
    return df


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------

def selection_rule(trials: pd.DataFrame) -> str:
    """``"target"`` if a target accuracy was logged for any trial, else ``"accuracy"``."""
    col = "summary/target_accuracy"
    return "target" if col in trials and trials[col].notna().any() else "accuracy"


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    return df[name] if name in df else pd.Series(np.nan, index=df.index)


def config_table(trials: pd.DataFrame, setting_keys: Sequence[str] = DEFAULT_SETTING_KEYS) -> pd.DataFrame:
    """One row per config_id, scored over its seeds and ranked within its (settings, method).

    Columns: ``method``, the settings, ``config`` (its tuned params as ``k=v, ...``), ``n`` (scored
    seeds), ``acc_mean/acc_std`` (best accuracy), ``final_mean/final_std``, ``rtt_mean/rtt_std``
    (rounds to target over the seeds that reached it), ``reached``, ``sec_to_target``,
    ``comm_to_target``, ``sec_per_round``, ``stability``, ``diverged``, ``statuses``, ``run_ids`` (scored runs),
    ``rank`` (1 = best config of its method under its settings).
    """
    params = trials.attrs.get("params", [])
    settings = [k for k in setting_keys if k in params]
    tuned = [k for k in params if k not in settings]
    t = trials.copy()
    scored = t["status"].isin(SCORED)
    ok = t["status"] != "diverged"
    t["_acc"] = _col(t, "best/test_accuracy").where(ok).fillna(0.0)
    t["_final"] = _col(t, "summary/final_test_accuracy").where(ok).fillna(0.0)
    t["_rtt"] = _col(t, "rounds_to_target").where(ok)
    t["_sec"] = _col(t, "summary/seconds_to_target").where(t["_rtt"].notna())
    t["_comm"] = _col(t, "summary/comm_up_to_target").where(t["_rtt"].notna())
    t["_spr"] = _col(t, "summary/seconds_per_round")
    t["_stab"] = _col(t, "summary/stability").where(ok)

    # a method's config shows the keys it is tuned over: those that vary among its own trials
    # (FedAvg's unused server_data.lr, constant for it, is left out)
    own = {m: [k for k in tuned if g[k].dropna().astype(str).nunique() > 1] for m, g in t.groupby("method")}
    rows = []
    for cid, g in t.groupby("config_id", sort=False):
        s = g[scored.loc[g.index]]
        first = g.iloc[0]
        rows.append({
            "config_id": cid, "method": first["method"],
            **{k: first[k] for k in settings},
            "config": ", ".join(f"{k}={_fmt_value(first[k])}" for k in own[first["method"]] if _present(first[k])),
            "n": len(s),
            "acc_mean": s["_acc"].mean(), "acc_std": s["_acc"].std(),
            "final_mean": s["_final"].mean(), "final_std": s["_final"].std(),
            "rtt_mean": s["_rtt"].mean(), "rtt_std": s["_rtt"].std(), "reached": int(s["_rtt"].notna().sum()),
            "sec_to_target": s["_sec"].mean(), "comm_to_target": s["_comm"].mean(),
            "sec_per_round": s["_spr"].mean(),
            "stability": s["_stab"].mean(),
            "diverged": int((g["status"] == "diverged").sum()),
            "statuses": ", ".join(f"{k} {v}" for k, v in g["status"].value_counts().sort_index().items()),
            "run_ids": list(s["run_id"]), "draw": first.get("draw"),
            **{f"param:{k}": first[k] for k in tuned},     # for the plots against sampled keys
        })
    table = pd.DataFrame(rows)
    if selection_rule(trials) == "target":
        table["_frac"] = table["reached"] / table["n"].clip(lower=1)
        keys, asc = ["_frac", "rtt_mean", "acc_mean", "config_id"], [False, True, False, True]
    else:
        keys, asc = ["acc_mean", "config_id"], [False, True]
    table = table.sort_values(keys, ascending=asc, na_position="last")
    table["rank"] = table.groupby([*settings, "method"], sort=False, dropna=False).cumcount() + 1
    table = table.sort_values(["method", *settings, "rank"], kind="stable")
    table.attrs.update(settings=settings, tuned=tuned, rule=selection_rule(trials))
    return table.drop(columns=[c for c in table if c.startswith("_")]).reset_index(drop=True)


def best_configs(configs: pd.DataFrame) -> pd.DataFrame:
    """The rank-1 config of each (settings, method), ordered by settings then method.

    A method that lacks a setting key (FedAvg has no ``algorithm.temperature``) is compared under
    every value of that key: its row is repeated for each value the other methods take."""
    settings = configs.attrs.get("settings", [])
    best = configs[configs["rank"] == 1]
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
    value of the settings the reference has (it may lack some, e.g. a temperature), the threshold is
    ``fraction`` × the mean final accuracy of the reference's config with the highest such mean; each
    trial's rounds to target is the first evaluation at or above its threshold, from its accuracy
    history. Rewrites ``rounds_to_target`` and ``summary/target_accuracy`` in place (seconds and
    communication to target are dropped: they were counted to the absolute target). Returns
    {values of the reference's settings: threshold}."""
    ref = trials[(trials["method"] == reference) & trials["status"].isin(SCORED)]
    if ref.empty:
        raise ConfigError(f"report.relative_target: the reference method {reference!r} has no finished trials")
    keys = [k for k in settings if ref[k].notna().all()]
    final = _col(ref, "summary/final_test_accuracy").where(ref["status"] != "diverged").fillna(0.0)
    per_config = ref.assign(_final=final).groupby([*keys, "config_id"], dropna=False)["_final"].mean()
    if keys:
        best = per_config.groupby(level=keys).max()
        thresholds = {(g if isinstance(g, tuple) else (g,)): fraction * v for g, v in best.items()}
    else:
        thresholds = {(): fraction * per_config.max()}

    rtt, target = [], []
    for _, r in trials.iterrows():
        group = tuple(r[k] for k in keys)
        thr = thresholds.get(group)
        hit = next((step for step, acc in runs.accuracy(r["run_id"]).items() if thr is not None and acc >= thr - 1e-12),
                   None)
        rtt.append(float(hit) if hit is not None and r["status"] != "diverged" else np.nan)
        target.append(thr if thr is not None else np.nan)
    trials["rounds_to_target"] = rtt
    trials["summary/target_accuracy"] = target
    trials.drop(columns=[c for c in ("summary/seconds_to_target", "summary/comm_up_to_target") if c in trials],
                inplace=True)
    trials.attrs["target_keys"] = keys
    return thresholds


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
    """The sweep's runs in MLflow for one report: each accuracy history and ``clients.csv`` is read
    once, however many tables and figures use it."""

    def __init__(self, client):
        self.client, self._accuracy, self._logs = client, {}, {}

    def accuracy(self, run_id: str) -> pd.Series:
        """Test accuracy by round."""
        if run_id not in self._accuracy:
            history = self.client.get_metric_history(run_id, "test/accuracy")
            self._accuracy[run_id] = pd.Series({m.step: m.value for m in history}, dtype=float).sort_index()
        return self._accuracy[run_id]

    def client_log(self, run_id: str) -> pd.DataFrame | None:
        """The run's ``clients.csv`` artifact (per round and sampled client), or None if it has none."""
        if run_id not in self._logs:
            self._logs[run_id] = self._read_client_log(run_id)
        return self._logs[run_id]

    def _read_client_log(self, run_id: str) -> pd.DataFrame | None:
        import os
        import tempfile
        if not any(f.path == "clients.csv" for f in self.client.list_artifacts(run_id)):
            return None     # an algorithm without per-client records
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        with tempfile.TemporaryDirectory() as tmp:
            return pd.read_csv(self.client.download_artifacts(run_id, "clients.csv", tmp))
