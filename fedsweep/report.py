"""``fedsweep report``: compare methods at their best configs from a sweep's MLflow runs.

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
"""
from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from fedsweep.config import ConfigError
from fedsweep.tracking import check_existing_store

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
            "run_ids": list(s["run_id"]),
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


def _pm(mean, std, digits: int) -> str:
    if not _present(mean):
        return "—"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if _present(std) else "")


def _num(v, digits: int = 1) -> str:
    return f"{v:,.{digits}f}" if _present(v) else "—"


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    esc = [[str(c).replace("|", "\\|") for c in r] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in esc])


def _setting_label(row, settings: Sequence[str]) -> str:
    return ", ".join(f"{k}={_fmt_value(row[k])}" for k in settings)


def _best_table(best: pd.DataFrame) -> str:
    settings = best.attrs["settings"]
    header = [*settings, "method", "config", "seeds", "best acc", "final acc", "rounds to target",
              "reached", "s to target", "models up to target", "s / round", "stability", "diverged"]
    rows = [[*(_fmt_value(r[k]) for k in settings), r["method"], r["config"] or "—", str(r["n"]),
             _pm(r["acc_mean"], r["acc_std"], 4), _pm(r["final_mean"], r["final_std"], 4),
             _pm(r["rtt_mean"], r["rtt_std"], 1), f"{r['reached']}/{r['n']}",
             _num(r["sec_to_target"], 2), _num(r["comm_to_target"], 0), _num(r["sec_per_round"], 3),
             _num(r.get("stability"), 2), str(r["diverged"])] for _, r in best.iterrows()]
    return _markdown(header, rows)


def _rounds_table(best: pd.DataFrame, reference: str | None) -> str:
    """Settings × methods: mean rounds to target and the speed-up over ``reference`` (FedCLG Table I).

    Speed-up = reference's mean rounds / the method's, under the same setting, where both reached the
    target; "[k/n]" says only k of n seeds reached it (their mean is shown)."""
    methods = sorted(best["method"].unique(), key=lambda m: (m != reference, m))
    rows = []
    for label, g in _groups(best):
        ref = g[g["method"] == reference]
        ref_rtt = ref.iloc[0]["rtt_mean"] if reference is not None and not ref.empty and ref.iloc[0]["reached"] else None
        cells = []
        for m in methods:
            hit = g[g["method"] == m]
            if hit.empty:
                cells.append("")
                continue
            r = hit.iloc[0]
            if r["reached"] == 0:
                cells.append(f"not reached (0/{r['n']})")
                continue
            cell = f"{r['rtt_mean']:.1f}" + (f" ({ref_rtt / r['rtt_mean']:.2f}×)" if ref_rtt else "")
            cells.append(cell + (f" [{r['reached']}/{r['n']}]" if r["reached"] < r["n"] else ""))
        rows.append([label or "all", *cells])
    return _markdown(["setting", *methods], rows)


def _all_table(configs: pd.DataFrame) -> str:
    settings = configs.attrs["settings"]
    header = ["method", *settings, "rank", "config", "best acc", "rounds to target", "reached", "seeds",
              "statuses", "config_id"]
    rows = [[r["method"], *(_fmt_value(r[k]) for k in settings), str(r["rank"]), r["config"] or "—",
             _pm(r["acc_mean"], r["acc_std"], 4), _pm(r["rtt_mean"], r["rtt_std"], 1),
             f"{r['reached']}/{r['n']}", str(r["n"]), r["statuses"], f"`{r['config_id']}`"]
            for _, r in configs.iterrows()]
    return _markdown(header, rows)


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------

def _groups(best: pd.DataFrame):
    """(label, rows) per distinct setting combination, in order."""
    settings = best.attrs["settings"]
    if not settings:
        return [("", best)]
    return [(_setting_label(g.iloc[0], settings), g) for _, g in best.groupby(settings, sort=True, dropna=False)]


def _tick_labels(best: pd.DataFrame, groups) -> list[str]:
    """Short x labels for grouped bars: only the setting keys that vary, by their last name, one a line
    (``shard_size=33`` over ``temperature=0.1``), so many groups do not run into each other."""
    settings = [k for k in best.attrs["settings"] if best[k].nunique(dropna=False) > 1]
    if not settings:
        return [label or "all" for label, _ in groups]
    return ["\n".join(f"{k.split('.')[-1]}={_fmt_value(rows.iloc[0][k])}" for k in settings) for _, rows in groups]


def _colors(methods) -> dict:
    from fedsweep.plots import plt
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {m: cycle[i % len(cycle)] for i, m in enumerate(sorted(methods))}


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


def _mean_curve(runs: _Runs, run_ids):
    """(mean, std) over runs of test accuracy by round, or None if no run logged it."""
    curves = {rid: runs.accuracy(rid) for rid in run_ids}
    if not curves or all(c.empty for c in curves.values()):
        return None
    frame = pd.DataFrame(curves).sort_index()
    return frame.mean(axis=1), frame.std(axis=1).fillna(0.0)


def _band(ax, curve, color, label: str, alpha: float) -> None:
    """A mean curve with its ± std band."""
    mean, std = curve
    ax.plot(mean.index, mean.values, color=color, label=label)
    ax.fill_between(mean.index, mean - std, mean + std, color=color, alpha=alpha, lw=0)


def _panel_grid(n: int):
    """A figure of ``n`` accuracy panels, at most three per row, sharing the y axis."""
    from fedsweep.plots import plt
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    return plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.6 * nrows), squeeze=False, sharey=True)


def _save_panels(fig, axes, used: int, path: Path, title: str) -> Path:
    from fedsweep.plots import save_figure
    for ax in axes[:, 0]:
        ax.set_ylabel("test accuracy")
    for ax in list(axes.flat)[used:]:
        ax.set_visible(False)
    return save_figure(fig, path, title)


def accuracy_curves_png(best: pd.DataFrame, runs: _Runs, path: Path, title: str = "") -> Path:
    """Test accuracy vs round of each method's best config: mean over seeds, ± std band; the target
    (``best["target"]``, if any) dashed."""
    groups = _groups(best)
    colors = _colors(best["method"].unique())
    fig, axes = _panel_grid(len(groups))
    for ax, (label, rows) in zip(axes.flat, groups):
        for _, r in rows.iterrows():
            if (curve := _mean_curve(runs, r["run_ids"])) is not None:
                _band(ax, curve, colors[r["method"]], f"{r['method']} (n={r['n']})", 0.2)
        target = rows["target"].iloc[0] if "target" in rows else None
        if target is not None and _present(target):
            ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:.3g}")
        ax.set(xlabel="round", title=label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    return _save_panels(fig, axes, len(groups), path, title)


def settings_curves_png(best: pd.DataFrame, runs: _Runs, path: Path, reference: str | None = None,
                        title: str = "") -> Path:
    """How each method responds to a setting: one panel per method (and value of the other settings),
    one curve per value of the last setting key, its best config there (mean over seeds).

    With ``settings: [server_data.fraction]`` this is the FedCLG paper's Fig. 6 (m_s ablation); with
    ``[data.partition.shard_size, algorithm.temperature]`` the FedSoftMax paper's Fig. 5 (one curve per
    T). A reference method that lacks the last key (one curve for all its values: FedAvg and T) is drawn
    dashed in black in every other method's panel, as the yardstick."""
    from fedsweep.plots import plt

    settings = best.attrs["settings"]
    last, outer = settings[-1], settings[:-1]
    values = sorted(best[last].dropna().unique())
    shades = dict(zip(values, plt.get_cmap("viridis")(np.linspace(0.0, 0.85, len(values)))))
    panels = [(m, key, g) for m in sorted(best["method"].unique())
              for key, g in (best[best["method"] == m].groupby(outer, sort=True, dropna=False) if outer
                             else [((), best[best["method"] == m])])]
    # the reference needs no panel of its own where it has a single curve: it is dashed in the others
    if len(panels) > 1:
        panels = [p for p in panels if p[0] != reference or p[2]["run_ids"].map(tuple).nunique() > 1] or panels
    fig, axes = _panel_grid(len(panels))
    for ax, (method, key, rows) in zip(axes.flat, panels):
        key = key if isinstance(key, tuple) else (key,)
        drawn = set()
        for _, r in rows.sort_values(last).iterrows():
            if tuple(r["run_ids"]) in drawn or (curve := _mean_curve(runs, r["run_ids"])) is None:
                continue
            drawn.add(tuple(r["run_ids"]))
            _band(ax, curve, shades.get(r[last], "grey"), f"{last}={_fmt_value(r[last])}", 0.15)
        if reference is not None and method != reference:
            ref = best[best["method"] == reference]
            for k, v in zip(outer, key):
                ref = ref[ref[k] == v]
            # only a reference that is one run set across the curves (it lacks the key) is a yardstick
            one = not ref.empty and ref["run_ids"].map(tuple).nunique() == 1
            if one and (curve := _mean_curve(runs, ref.iloc[0]["run_ids"])) is not None:
                ax.plot(curve[0].index, curve[0].values, color="black", ls="--", lw=1.2, label=reference)
        target = rows["target"].iloc[0] if "target" in rows and len(rows) else None
        if target is not None and _present(target):
            ax.axhline(target, color="grey", ls=":", lw=1)
        ax.set(xlabel="round", title=", ".join([method, *(f"{k}={_fmt_value(v)}" for k, v in zip(outer, key))]))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    return _save_panels(fig, axes, len(panels), path, title)


def rounds_to_target_png(best: pd.DataFrame, path: Path, max_rounds: float | None = None,
                         target: float | None = None, title: str = "", relative: bool = False) -> Path:
    """Bars per method grouped by setting: mean rounds to target (± std), or best accuracy without a target.

    A method none of whose seeds reached the target gets a hatched bar at ``max_rounds``
    labelled "not reached"; a partial one is labelled "k/n"."""
    from fedsweep.plots import plt, save_figure

    groups = _groups(best)
    max_rounds = max_rounds or float(np.nanmax([*best["rtt_mean"], 1.0]))
    methods = sorted(best["method"].unique())
    colors = _colors(methods)
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(groups) * len(methods) + 1.5), 4.0))
    top, hatched = 0.0, False
    for gi, (_, rows) in enumerate(groups):
        for mi, m in enumerate(methods):
            hit = rows[rows["method"] == m]
            if hit.empty:
                continue
            r = hit.iloc[0]
            x = gi + (mi - (len(methods) - 1) / 2) * width
            if target is None and not relative:
                y, err, note = r["acc_mean"], r["acc_std"], None
            elif r["reached"] == 0:
                y, err, note = max_rounds, None, "not reached"
            else:
                y, err = r["rtt_mean"], r["rtt_std"]
                note = None if r["reached"] == r["n"] else f"{r['reached']}/{r['n']} reached"
            yerr = err if _present(err) else None
            if note == "not reached":
                ax.bar(x, y, width, facecolor="none", edgecolor=colors[m], hatch="//", lw=1.2)
                ax.text(x, y / 2, note, rotation=90, ha="center", va="center", fontsize=8,
                        bbox=dict(facecolor="white", edgecolor="none", pad=1))
                hatched = True
            else:
                ax.bar(x, y, width, color=colors[m], yerr=yerr, capsize=3)
                if note:
                    ax.text(x, y + (yerr or 0), note, ha="center", va="bottom", fontsize=8)
            top = max(top, y + (yerr or 0))
    ax.set_xticks(range(len(groups)), _tick_labels(best, groups), fontsize=8)
    if relative:
        ax.set(ylabel="rounds to the relative target", ylim=(0, top * 1.12 or 1),
               title=title or "rounds to target per method (mean ± std)")
    elif target is None:
        ax.set(ylabel="best test accuracy (mean ± std)", ylim=(0, min(1.05, top * 1.12) or 1),
               title=title or "best test accuracy per method (no target set)")
    else:
        ax.set(ylabel=f"rounds to target accuracy {target:g}", ylim=(0, top * 1.12 or 1),
               title=title or "rounds to target per method (mean ± std)")
    from matplotlib.patches import Patch
    handles = [Patch(color=colors[m], label=m) for m in methods]
    if hatched:
        handles.append(Patch(facecolor="none", edgecolor="grey", hatch="//", label=f"not reached\n(bar at {max_rounds:g})"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def weights_png(logs: list[tuple[str, pd.DataFrame]], path: Path, title: str = "", top: int | None = None) -> Path:
    """Per row (one run): |α_i − p_i| of every client over the rounds (the FedSoftMax paper's Fig. 6)
    and which clients carry the weight, round by round (its Fig. 7: the ``top`` largest α_i of each
    round in yellow, default a fifth of the clients and at most ten; the other sampled clients in blue,
    clients not sampled blank)."""
    from matplotlib.colors import ListedColormap

    from fedsweep.plots import plt, save_figure

    fig, axes = plt.subplots(len(logs), 2, figsize=(10.5, 3.3 * len(logs)), squeeze=False)
    for (label, log), (ax_dev, ax_top) in zip(logs, axes):
        dev = log.pivot_table(index="round", columns="client", values="abs_dev")
        ax_dev.plot(dev.index, dev.values, color="tab:blue", lw=0.6, alpha=0.35)
        ax_dev.plot(dev.index, dev.mean(axis=1), color="black", lw=1.5, label="mean over clients")
        ax_dev.set(xlabel="round", ylabel="|α_i − p_i|", title=label)
        ax_dev.grid(alpha=0.3)
        ax_dev.legend(fontsize=7)
        # the paper marks the top 10 of 50 clients: a fifth, at most ten
        top = top or min(10, max(1, log["client"].nunique() // 5))
        rank = log.assign(_r=log.groupby("round")["alpha"].rank(ascending=False, method="first"))
        mark = rank.assign(_top=(rank["_r"] <= top).astype(float)).pivot_table(index="round", columns="client",
                                                                              values="_top")
        ax_top.imshow(mark.values, aspect="auto", interpolation="nearest", origin="lower",
                      cmap=ListedColormap(["#2c5aa0", "#f5d000"]), vmin=0, vmax=1,
                      extent=(-0.5, mark.shape[1] - 0.5, mark.index.min() - 0.5, mark.index.max() + 0.5))
        ticks = np.linspace(0, mark.shape[1] - 1, min(mark.shape[1], 10)).round().astype(int)
        ax_top.set_xticks(ticks, [str(mark.columns[i]) for i in ticks], fontsize=7)
        ax_top.set(xlabel="client", ylabel="round", title=f"top {top} α_i per round (yellow)")
    return save_figure(fig, path, title)


def weights_figures(best: pd.DataFrame, runs: _Runs, out: Path, max_rows: int = 4) -> list[tuple[str, str]]:
    """``weights_<method>.png`` for each method whose runs kept per-client weights: one row per setting
    (its best config there, first seed; at most ``max_rows``, evenly spread). Returns (method, file name)."""
    made = []
    for method in sorted(best["method"].unique()):
        rows = best[best["method"] == method]
        rows = rows[~rows["run_ids"].map(tuple).duplicated()]
        if rows.empty or not rows.iloc[0]["run_ids"] or runs.client_log(rows.iloc[0]["run_ids"][0]) is None:
            continue
        if len(rows) > max_rows:
            rows = rows.iloc[np.linspace(0, len(rows) - 1, max_rows).round().astype(int)]
        settings = best.attrs["settings"]
        logs = []
        for _, r in rows.iterrows():
            log = runs.client_log(r["run_ids"][0])
            if log is not None and {"alpha", "abs_dev"} <= set(log.columns):
                logs.append((", ".join([method, *(f"{k}={_fmt_value(r[k])}" for k in settings)]), log))
        if logs:
            name = f"weights_{method}.png"
            weights_png(logs, out / name, title=f"{method}: aggregation weights")
            made.append((method, name))
    return made


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------

def write_report(tracking_uri: str | None, experiment: str, sweep: str, out_dir: str | Path,
                 setting_keys: Sequence[str] = DEFAULT_SETTING_KEYS, reference: str | None = None,
                 relative_target: float | None = None) -> Path:
    """Write ``report.md``, ``accuracy_curves.png``, ``rounds_to_target.png``, ``trials.csv``, when a
    setting takes several values ``settings_curves.png``, and for runs with per-client weights
    ``weights_<method>.png`` into ``out_dir``; returns the path of ``report.md``.

    ``reference``: the method speed-ups are relative to. ``relative_target``: count rounds to this
    fraction of the reference's final accuracy (:func:`relative_targets`) instead of the logged target."""
    from mlflow import MlflowClient

    from fedsweep.plots import plt  # noqa: F401  (imported here, with MLflow, before start-up ends)
    from fedsweep.startup import end_startup
    end_startup()   # `fedsweep report`: its imports are done
    trials = load_trials(tracking_uri, experiment, sweep)
    if not trials["status"].isin(SCORED).any():
        counts = ", ".join(f"{k} {v}" for k, v in trials["status"].value_counts().sort_index().items())
        errors = trials.loc[trials["error"] != "", "error"]
        why = f"; the most common error: {errors.value_counts().index[0]}" if len(errors) else ""
        raise ConfigError(f"report: none of the {len(trials)} trials of sweep {sweep!r} has a result to score "
                          f"({counts}){why}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    uri = trials.attrs["tracking_uri"]
    runs = _Runs(MlflowClient(tracking_uri=uri))
    thresholds = None
    if relative_target is not None:
        if reference is None:
            raise ConfigError("report.relative_target needs a reference method (report.reference)")
        settings_in = [k for k in setting_keys if k in trials.attrs["params"]]
        thresholds = relative_targets(trials, runs, settings_in, reference, relative_target)
    configs = config_table(trials, setting_keys)
    best = best_configs(configs)
    settings, tuned, rule = configs.attrs["settings"], configs.attrs["tuned"], configs.attrs["rule"]
    if thresholds is not None:
        keys = trials.attrs["target_keys"]
        best["target"] = [thresholds.get(tuple(r[k] for k in keys), np.nan) for _, r in best.iterrows()]
        target = None
    else:
        target = float(trials["summary/target_accuracy"].dropna().iloc[0]) if rule == "target" else None
        best["target"] = target if target is not None else np.nan
    max_rounds = float(_col(trials, "summary/rounds").max()) if "summary/rounds" in trials else None

    accuracy_curves_png(best, runs, out / "accuracy_curves.png", title=f"{sweep}: best config per method")
    rounds_to_target_png(best, out / "rounds_to_target.png", max_rounds, target if rule == "target" else None,
                         relative=thresholds is not None)
    several = len(_groups(best)) > 1
    if several:
        settings_curves_png(best, runs, out / "settings_curves.png", reference,
                            title=f"{sweep}: each method across {', '.join(settings)}")
    weight_figures = weights_figures(best, runs, out)
    trials.to_csv(out / "trials.csv", index=False)

    counts = ", ".join(f"{k} {v}" for k, v in trials["status"].value_counts().sort_index().items())
    dupes = trials.attrs["runs_read"] - len(trials)
    if rule == "target":
        what = (f"{relative_target:g} × the final accuracy of {reference}'s best config under the same "
                f"{', '.join(trials.attrs['target_keys']) or 'sweep'} (" + ", ".join(
                    f"{'/'.join(map(_fmt_value, k)) or 'all'}: {v:.4f}" for k, v in thresholds.items()) + ")"
                if thresholds is not None else f"{target:g}")
        rule_text = (f"fewest mean rounds to the target accuracy {what} (configs where every seed reached it "
                     "first, then by the fraction of seeds that did; ties broken by best accuracy)")
    else:
        rule_text = "best mean over seeds of the best test accuracy (no target accuracy was set)"
    lines = [
        f"# Sweep report: {sweep}",
        "",
        f"- experiment: `{experiment}`",
        f"- tracking URI: `{uri}`",
        f"- trials: {len(trials)} ({counts})" + (f"; {dupes} superseded duplicate run(s) ignored" if dupes else ""),
        f"- generated: {_dt.datetime.now().strftime('%Y-%m-%d %H:%M')}",
        f"- best config per method: {rule_text}",
        f"- settings (compared, not tuned; best config chosen per setting): "
        f"{', '.join(f'`{k}`' for k in settings) or 'none'}",
        f"- tuned params: {', '.join(f'`{k}`' for k in tuned) or 'none'}",
        "- scored: finished, diverged and stopped trials; a diverged trial counts as accuracy 0 and never "
        "reaching the target; mean ± std over seeds (sample std); rounds/seconds/models to target are means "
        "over the seeds that reached it; stability: mean lag-one autocorrelation of the normalized accuracy "
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
        reference = reference if reference in set(best["method"]) else None
        ref_text = f"; (x×) = speed-up over {reference}, its mean rounds / the method's" if reference else ""
        lines += [
            "## Rounds to target per setting",
            "",
            f"Mean rounds to the target of each method's best config under each setting{ref_text}; "
            "[k/n]: only k of n seeds reached it.",
            "",
            _rounds_table(best, reference),
            "",
        ]
    if several:
        lines += ["![each method across settings](settings_curves.png)", ""]
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
        _all_table(configs),
        "",
    ]
    incomplete = trials[trials["status"] == "incomplete"]
    if len(incomplete):
        lines += ["## Incomplete runs", "", "Trained, but without a summary in MLflow, so not scored: each run, "
                  "with why (its `fedsweep.error` tag).", "",
                  _markdown(["run", "config_id", "seed", "why"],
                            [[str(r["run_name"]), f"`{r['config_id']}`", _fmt_value(r["seed"]), r["error"]]
                             for _, r in incomplete.iterrows()]), ""]
    failed = trials[(trials["error"] != "") & (trials["status"] != "incomplete")]
    if len(failed):
        lines += ["## Failed trials", "", "Each error once (the last line of its traceback; the runs' "
                  "`fedsweep.error` tag), with the trials that ended with it.", "",
                  _markdown(["trials", "error", "configs"],
                            [[str(len(g)), f"`{e}`", ", ".join(sorted(f"`{c}`" for c in g["config_id"].unique()))]
                             for e, g in sorted(failed.groupby("error"), key=lambda x: -len(x[1]))]), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
