"""Uncertainty and verdicts for ``fedsweep report``: 95% intervals of means over seeds, and each method
compared with a reference method, paired by seed.

The input is, per (setting values, method), the selected config's runs as a frame with a ``seed``
column and one column per metric (:func:`seed_values` makes it from the rows of ``best_configs``;
which runs those are, the tuning runs of the selected config or fresh runs of it, is the caller's
choice: the ``runs_column`` it names).

- **Intervals** (:func:`mean_ci`): the mean and its t-interval over seeds
  (``scipy.stats.ttest_1samp(...).confidence_interval``); one seed has none (NaN).
- **Comparisons** (:func:`compare`): only the seeds both methods ran are paired. A metric without
  censoring (accuracy; rounds to target where every paired run reached it) gets the mean paired
  difference, its 95% CI and p from ``scipy.stats.ttest_rel``, and, where no difference is found,
  ``mde``: the smallest difference these seeds could have detected (two-sided α = 0.05, power 0.8:
  (t_{1−α/2,n−1} + t_{0.8,n−1}) · sd_diff / √n). Where every paired difference is the same (rounds
  come in steps) the t-test has no variance to use, and p is the signed-rank test's; arms equal on
  every seed are ``identical`` (p = 1).
- **Censoring.** A run that never reached the target (or diverged, or was stopped early) has no
  rounds to target: it is censored, never averaged. When any paired run is censored, rounds are
  compared with the Wilcoxon signed-rank test, a censored run counting as R + 1 rounds (R the run
  length: later than every run that reached), which only its rank and sign use; the difference is
  that of the medians with a paired percentile bootstrap CI, and a median that falls on a censored
  run makes it a bound.
- **Holm** (:func:`holm`) adjusts the p-values over every comparison of one report; the verdict is
  ``better`` / ``worse`` at an adjusted p < 0.05 in the metric's direction, else ``no difference``
  (``not tested`` with one paired seed). A difference whose CI lies within ±``resolution`` (rounds
  are counted only every ``eval.every`` rounds) is never called: ``no difference``, ``below resolution``.
"""
from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from fedsweep.reports.trials import SCORED, _col, _setting_label

CONFIDENCE, ALPHA, POWER = 0.95, 0.05, 0.8
TOLERANCE = 1e-9
COLUMNS = ["setting", "metric", "method", "reference", "n_seeds", "difference", "ci_low", "ci_high", "p_adjusted",
           "verdict", "mde", "test", "censored_method", "censored_reference", "note"]
PAIRED_T, RANK_TEST, IDENTICAL = "paired t", "Wilcoxon signed-rank", "identical"


class Interval(NamedTuple):
    """A mean over ``n`` seeds and its interval (NaN bounds for one seed)."""
    mean: float
    low: float
    high: float
    n: int


@dataclass(frozen=True)
class Metric:
    """A compared metric: its column in the per-seed frames and which direction is better.

    ``censored``: NaN means the run never got there (rounds to target), not a missing value.
    ``horizon``: the rounds a run had (R); a censored run ranks as R + 1. ``resolution``: the finest
    difference the metric can show (``eval.every`` for rounds)."""
    column: str
    higher_is_better: bool
    resolution: float = 0.0
    censored: bool = False
    horizon: float | None = None


@contextmanager
def _quiet():
    """scipy warns on constant data (precision loss, 0/0); those cases are handled where they arise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def mean_ci(values, confidence: float = CONFIDENCE) -> Interval:
    """The mean of ``values`` (NaN dropped) and its t-interval over them; NaN bounds for one value."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    if len(x) == 1 or _constant(x):             # one seed: no interval; equal seeds: a point
        bound = math.nan if len(x) == 1 else float(x[0])
        return Interval(float(x[0]), bound, bound, len(x))
    with _quiet():
        low, high = stats.ttest_1samp(x, 0.0).confidence_interval(confidence)
    return Interval(float(x.mean()), float(low), float(high), len(x))


def mean_ci_rows(frame: pd.DataFrame, confidence: float = CONFIDENCE) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(mean, low, high) of each row over its non-NaN columns: :func:`mean_ci` for a whole accuracy
    curve at once (a row a round, a column a seed); NaN bounds where a row has one value."""
    n = frame.notna().sum(axis=1)
    mean = frame.mean(axis=1)
    half = stats.t.ppf(0.5 + confidence / 2, (n - 1).where(n > 1)) * frame.sem(axis=1)
    return mean, mean - half, mean + half


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjustment; NaN p-values (no test) stay NaN and do not count in the family."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(len(p), math.nan)
    tested = np.flatnonzero(~np.isnan(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    m = len(order)
    out[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    return out


def _paired(method: pd.DataFrame, reference: pd.DataFrame, metric: Metric) -> pd.DataFrame:
    """The two arms' values side by side (columns ``m``, ``r``) on the seeds both have."""
    pairs = pd.merge(method[["seed", metric.column]], reference[["seed", metric.column]], on="seed",
                     suffixes=("_m", "_r")).rename(columns={f"{metric.column}_m": "m", f"{metric.column}_r": "r"})
    return pairs if metric.censored else pairs.dropna(subset=["m", "r"])


def _no_test(n: int) -> dict:
    return {"n_seeds": n, "ci_low": math.nan, "ci_high": math.nan, "p": math.nan, "mde": math.nan,
            "test": "none", "note": f"{n} paired seed{'s' if n != 1 else ''}: no test"}


def _constant(x: np.ndarray) -> bool:
    """All values equal, up to float rounding (accuracies are multiples of 1/test size, far above it)."""
    return len(x) > 0 and float(np.ptp(x)) < TOLERANCE


def _too_few_for_ranks(d: np.ndarray) -> str:
    """Why a rank test could not find a difference: its smallest two-sided p, every pair on one side,
    is 2 / 2^n, not below 0.05 for n ≤ 5 unequal pairs."""
    unequal = int(np.count_nonzero(np.abs(d) >= TOLERANCE))
    smallest = 2.0 / 2 ** unequal
    pairs = f"{unequal} unequal pair{'s' if unequal != 1 else ''}"
    return f"with {pairs} the rank test's smallest p is {smallest:.3g}" if smallest >= ALPHA else ""


def _equal_differences(m: np.ndarray, r: np.ndarray) -> dict:
    """Every paired difference the same (identical arms; rounds, counted in steps of ``eval.every``):
    the t-test has no variance to work with (0/0, or t = ±∞ and p = 0 from two seeds), so p is the
    signed-rank test's, which needs none: 2 / 2^n for n pairs on one side. Arms equal on every seed
    need no test: p = 1 (counted in Holm's family, which only makes it stricter)."""
    d = float(np.mean(m - r))
    if abs(d) < TOLERANCE:
        return {"n_seeds": len(m), "difference": 0.0, "ci_low": 0.0, "ci_high": 0.0, "p": 1.0, "mde": math.nan,
                "test": IDENTICAL, "note": "the same on every seed"}
    with _quiet():
        p = float(stats.wilcoxon(m, r).pvalue)
    notes = [f"every paired difference is {d:+.4g}", _too_few_for_ranks(m - r)]
    return {"n_seeds": len(m), "difference": d, "ci_low": d, "ci_high": d, "p": p, "mde": math.nan,
            "test": RANK_TEST, "note": "; ".join(x for x in notes if x)}


def _t_test(m: np.ndarray, r: np.ndarray) -> dict:
    """Mean paired difference, its CI and p (``ttest_rel``), and the mde of these seeds."""
    n, d = len(m), m - r
    if n < 2:
        return {**_no_test(n), "difference": float(d.mean()) if n else math.nan}
    if _constant(d):
        return _equal_differences(m, r)
    with _quiet():
        result = stats.ttest_rel(m, r)
        low, high = result.confidence_interval(CONFIDENCE)
    mde = (stats.t.ppf(1 - ALPHA / 2, n - 1) + stats.t.ppf(POWER, n - 1)) * d.std(ddof=1) / math.sqrt(n)
    return {"n_seeds": n, "difference": float(d.mean()), "ci_low": float(low), "ci_high": float(high),
            "p": float(result.pvalue), "mde": float(mde), "test": PAIRED_T, "note": ""}


def _median_difference(m, r, axis=-1):
    return np.median(m, axis=axis) - np.median(r, axis=axis)


def _rank_test(m: np.ndarray, r: np.ndarray, horizon: float | None) -> dict:
    """Rounds with censored runs (NaN): the Wilcoxon signed-rank test on the paired rounds, a censored
    run at R + 1 (later than every run that reached); the difference of the medians, paired bootstrap CI."""
    n = len(m)
    late = (horizon if horizon is not None else np.nanmax([*m, *r, 0.0])) + 1
    mm, rr = np.where(np.isnan(m), late, m), np.where(np.isnan(r), late, r)
    difference = float(_median_difference(mm, rr))
    if n < 2:
        return {**_no_test(n), "difference": difference}
    notes = []
    if 2 * np.isnan(m).sum() >= n or 2 * np.isnan(r).sum() >= n:
        notes.append("a median is censored: the difference is a bound")
    if not (mm - rr).any():           # every pair equal: both censored, or the same round
        return {"n_seeds": n, "difference": 0.0, "ci_low": 0.0, "ci_high": 0.0, "p": 1.0, "mde": math.nan,
                "test": IDENTICAL, "note": "; ".join([*notes, "the same on every seed"])}
    with _quiet():
        p = float(stats.wilcoxon(mm, rr).pvalue)
        low, high = stats.bootstrap((mm, rr), _median_difference, paired=True, vectorized=True, method="percentile",
                                    confidence_level=CONFIDENCE, rng=np.random.default_rng(0)).confidence_interval
    notes.append(_too_few_for_ranks(mm - rr))
    return {"n_seeds": n, "difference": difference, "ci_low": float(low), "ci_high": float(high), "p": p,
            "mde": math.nan, "test": RANK_TEST, "note": "; ".join(x for x in notes if x)}


def compare(method_values: pd.DataFrame, reference_values: pd.DataFrame, metric: Metric) -> dict:
    """One method against the reference on one metric, paired by seed: ``n_seeds, difference,
    ci_low, ci_high, p`` (unadjusted), ``mde, test, censored_method, censored_reference, note``.
    The verdict needs every comparison's p: :func:`comparison_table` adds it."""
    pairs = _paired(method_values, reference_values, metric)
    m, r = pairs["m"].to_numpy(float), pairs["r"].to_numpy(float)
    censored = metric.censored and bool(np.isnan(m).any() or np.isnan(r).any())
    row = _rank_test(m, r, metric.horizon) if censored else _t_test(m, r)
    count = (lambda x: int(np.isnan(x).sum())) if metric.censored else (lambda x: 0)
    return {**row, "censored_method": count(m), "censored_reference": count(r)}


def verdict(row: dict, p_adjusted: float, metric: Metric) -> tuple[str, str]:
    """(verdict, note) of a compared row at its Holm-adjusted p."""
    note = row["note"]
    if math.isnan(p_adjusted):
        return "not tested", note
    if metric.resolution > 0 and -metric.resolution <= row["ci_low"] and row["ci_high"] <= metric.resolution:
        return "no difference", "; ".join(x for x in (note, f"below resolution (±{metric.resolution:g})") if x)
    if p_adjusted >= ALPHA or row["difference"] == 0:
        return "no difference", note
    return ("better" if (row["difference"] > 0) == metric.higher_is_better else "worse"), note


def comparison_table(values: dict[tuple[str, str], pd.DataFrame], reference: str | None,
                     metrics: dict[str, Metric]) -> pd.DataFrame:
    """comparisons.csv: a row per (setting, metric, method other than ``reference``), ``values``
    holding each (setting label, method)'s per-seed frame; p adjusted by Holm over all the rows."""
    rows, specs = [], []
    for setting in dict.fromkeys(s for s, _ in values):       # in the order of ``best``
        ref = values.get((setting, reference))
        for name, metric in metrics.items():
            for (where, method), frame in values.items():
                if where == setting and method != reference and ref is not None:
                    rows.append({"setting": setting, "metric": name, "method": method, "reference": reference,
                                 **compare(frame, ref, metric)})
                    specs.append(metric)
    table = pd.DataFrame(rows, columns=[*COLUMNS, "p"])
    table["p_adjusted"] = holm(table["p"])
    called = [verdict(row, p, metric) for row, p, metric in zip(rows, table["p_adjusted"], specs)]
    table["verdict"], table["note"] = [v for v, _ in called], [n for _, n in called]
    table["mde"] = table["mde"].where(table["verdict"] == "no difference")
    return table[COLUMNS]


def _key(row, settings: Sequence[str]) -> tuple[str, str]:
    """(setting label, method) of a row of ``best``: how per-seed frames and comparisons are keyed."""
    return _setting_label(row, settings) or "all", row["method"]


def seed_values(best: pd.DataFrame, trials: pd.DataFrame, columns: Sequence[str],
                runs_column: str = "run_ids") -> dict[tuple[str, str], pd.DataFrame]:
    """{(setting label, method): its selected config's per-seed frame (``seed`` and ``columns``)},
    from the runs each row of ``best`` names in ``runs_column``.

    Scored as ``config_table`` scores: a diverged run counts as accuracy 0 and never reaching the
    target (``rounds_to_target`` NaN: censored)."""
    t = trials.set_index("run_id")
    ok = t["status"] != "diverged"
    scored = pd.DataFrame({"seed": t["seed"]}, index=t.index)
    for c in columns:
        scored[c] = _col(t, c).where(ok) if c == "rounds_to_target" else _col(t, c).where(ok).fillna(0.0)
    scored = scored[t["status"].isin(SCORED)]
    return {_key(r, best.attrs["settings"]): scored.loc[[i for i in r[runs_column] if i in scored.index]]
            .reset_index(drop=True) for _, r in best.iterrows()}


def add_intervals(best: pd.DataFrame, values: dict[tuple[str, str], pd.DataFrame],
                  columns: dict[str, str]) -> pd.DataFrame:
    """``best`` with a column ``<name>_ci`` (an :class:`Interval`) per ``{name: metric column}``, over the
    same per-seed values the comparisons use (rounds to target: over the seeds that reached it)."""
    out = best.copy()
    keys = [_key(r, best.attrs["settings"]) for _, r in best.iterrows()]
    for name, column in columns.items():
        out[f"{name}_ci"] = [mean_ci(values[k][column]) for k in keys]
    out.attrs.update(best.attrs)
    return out
