"""Uncertainty and verdicts for ``fedsweep report``: 95% intervals of means over seeds, and each method
compared with a reference method, paired by seed, with a verdict its interval agrees with.

The input is, per (setting values, method), the selected config's runs as a frame with a ``seed``
column and one column per metric (:func:`seed_values` makes it from the rows of ``best_configs``;
which runs those are, the tuning runs of the selected config or its confirm runs, is the caller's
choice: the ``runs_column`` it names).

- **Intervals of a mean** (:func:`mean_ci`): the mean over seeds and its t-interval
  (``scipy.stats.ttest_1samp(...).confidence_interval``), cut to what the metric can take (accuracy
  in [0, 1], rounds to target in [1, R]); one seed has none (NaN).
- **One estimand and one test per metric** (:func:`compare`), on the seeds both methods ran:
  accuracy: the mean paired difference, tested by the exact paired sign-flip permutation test of
  its sum (all 2^n sign patterns up to 24 seeds, 20,000 fixed random ones beyond); rounds to target:
  the Hodges–Lehmann estimate (the median of the paired differences' Walsh averages), tested by the
  exact signed-rank test, the same sign-flip test on the differences' signed ranks. A run that never
  reached the target (or diverged, or was stopped early) is censored: it counts as R + 1 rounds (R
  the run length), later than every run that reached, which only its rank uses (the estimate). Its
  true difference is unbounded on one side (the method's censored run could be later still: no upper
  end; the reference's: no lower end), so the intervals and the test of such a comparison hold every
  value the censored runs could take: the lower end from the differences with each censored run of the
  reference as late as can be (a difference below −R), the upper end with each of the method's so
  (above R), the ends cut to ±R, and its p that of the side a call would be on (worst-case, Manski-style
  bounds; without censored runs both are the observed differences). A call, `equivalent` too, then holds
  whatever the censored runs hide; where they decide it, nothing is called.
- **Intervals of a difference** are the tests inverted: every shift δ the same test does not reject
  on the differences minus δ (found by bisection from the estimate outward, starting past 0 where 0
  is not rejected, so an interval holds 0 exactly when the test at its level does not reject). Cut
  to what a difference can be (±1 for accuracy, ±R for rounds). With n seeds the smallest p is
  2 / 2^n: 0.0625 at 5, so 5 seeds never reject at 0.05 and their interval is the whole range.
- **Holm** (:func:`holm`, :func:`holm_levels`) over the comparisons of one report that can be tested
  (two paired seeds or more: one with fewer is ``not tested`` and cannot be called): its step-down
  rejects the j-th smallest p below α / (m − j + 1) while each before it was rejected. The adjusted
  interval (``adj_ci_low``, ``adj_ci_high``) of a called comparison is at the level Holm called it,
  of the others at the level Holm stopped at, α / (m − r) with r called; so it excludes 0 exactly
  when the comparison is called. (Bonferroni's intervals, at α / m, cover simultaneously; these are
  at most as wide.)
- **Verdicts**: ``better`` / ``worse`` where the adjusted interval excludes 0 (its side: the metric's
  direction), ``equivalent`` where it lies strictly inside ±``margin`` (two one-sided tests at half
  its level: conservative), ``inconclusive`` otherwise, ``not tested`` with one paired seed. Rounds
  are seen only every ``resolution`` = ``eval.every`` rounds: where that is above 1, an adjusted
  interval strictly inside ±resolution is never called better or worse.
- **Power** (``power_mde``): the difference these seeds would call with 80% power at α / m (the
  strictest level Holm uses), were the paired differences normal with their observed sd: the exact
  test's own power, simulated (``exact.unit_mde``: a multiple of the sd for each n, level and test);
  infinite where 2 / 2^n ≥ α / m, which no difference can pass; for a metric on a grid (rounds,
  reached) the samples are rounded to it (``exact.grid_mde``). ``mde`` repeats it for inconclusive
  rows.
- **Looks** of a confirm stage that adds seeds until answered: each at its share of α, a comparison
  tested at an earlier look by the exact group-sequential p of :mod:`fedsweep.reports.sequential`.
"""
from __future__ import annotations

import functools
import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from fedsweep.reports.exact import (ALPHA, CONFIDENCE, DRAWS, EXACT_UP_TO, MEAN, RANK, TESTS, TOLERANCE, estimate,
                                   holm, holm_levels, interval, p_value, power_mde, smallest_p, spent)
from fedsweep.reports.sequential import EXACT_UP_TO as SEQUENTIAL_UP_TO
from fedsweep.reports.sequential import holm_sequential, sequential_p
from fedsweep.reports.trials import SCORED, _col, _setting_label

COLUMNS = ["setting", "metric", "method", "reference", "n_seeds", "difference", "ci_low", "ci_high", "p_adjusted",
           "verdict", "mde", "test", "censored_method", "censored_reference", "note",
           "adj_ci_low", "adj_ci_high", "margin", "power_mde", "seeds_used", "stop_reason"]
VERDICTS = ("better", "worse", "equivalent", "inconclusive", "not tested")


class Interval(NamedTuple):
    """A mean over ``n`` seeds and its interval (NaN bounds for one seed)."""
    mean: float
    low: float
    high: float
    n: int


@dataclass(frozen=True)
class Metric:
    """A compared metric: its column in the per-seed frames and which direction is better.

    ``censored``: NaN means the run never got there (rounds to target), not a missing value; such a
    metric is compared by ranks (the Hodges–Lehmann estimate and the signed-rank test), any other by
    its mean. ``horizon``: the rounds a run had (R); a censored run ranks as R + 1. ``resolution``: the
    finest difference the metric can show (``eval.every`` for rounds). ``margin``: differences inside
    ±margin count as none (``equivalent``; 0: never called). ``low``, ``high``: the values a run can
    take. ``grid``: the step its values lie on (rounds seen every ``eval.every``; 0/1), 0 where
    continuous: power is simulated on it."""
    column: str
    higher_is_better: bool
    resolution: float = 0.0
    censored: bool = False
    horizon: float | None = None
    margin: float = 0.0
    low: float = -math.inf
    high: float = math.inf
    grid: float = 0.0

    @property
    def kind(self) -> str:
        return RANK if self.censored else MEAN

    @property
    def span(self) -> float:
        """The largest difference two runs can show (a censored run at R + 1)."""
        high = self.horizon + 1 if self.censored and self.horizon is not None else self.high
        return high - self.low


@contextmanager
def _quiet():
    """scipy warns on constant data (precision loss, 0/0); those cases are handled where they arise."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def mean_ci(values, confidence: float = CONFIDENCE, low: float = -math.inf, high: float = math.inf) -> Interval:
    """The mean of ``values`` (NaN dropped) and its t-interval over them, cut to [``low``, ``high``],
    what the metric can take; NaN bounds for one value."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    if len(x) == 1 or _constant(x):             # one seed: no interval; equal seeds: a point
        bound = math.nan if len(x) == 1 else float(x[0])
        return Interval(float(x[0]), bound, bound, len(x))
    with _quiet():
        lo, hi = stats.ttest_1samp(x, 0.0).confidence_interval(confidence)
    return Interval(float(x.mean()), float(max(lo, low)), float(min(hi, high)), len(x))


def mean_ci_rows(frame: pd.DataFrame, confidence: float = CONFIDENCE, low: float = -math.inf,
                 high: float = math.inf) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(mean, low, high) of each row over its non-NaN columns: :func:`mean_ci` for a whole accuracy
    curve at once (a row a round, a column a seed); NaN bounds where a row has one value."""
    n = frame.notna().sum(axis=1)
    mean = frame.mean(axis=1)
    half = stats.t.ppf(0.5 + confidence / 2, (n - 1).where(n > 1)) * frame.sem(axis=1)
    return mean, (mean - half).clip(lower=low), (mean + half).clip(upper=high)


# -- comparisons ----------------------------------------------------------------------------------

def _paired(method: pd.DataFrame, reference: pd.DataFrame, metric: Metric) -> pd.DataFrame:
    """The two arms' values side by side (columns ``m``, ``r``) on the seeds both have."""
    pairs = pd.merge(method[["seed", metric.column]], reference[["seed", metric.column]], on="seed",
                     suffixes=("_m", "_r")).rename(columns={f"{metric.column}_m": "m", f"{metric.column}_r": "r"})
    return pairs if metric.censored else pairs.dropna(subset=["m", "r"])


def _constant(x: np.ndarray) -> bool:
    """All values equal, up to float rounding (accuracies are multiples of 1/test size, far above it)."""
    return len(x) > 0 and float(np.ptp(x)) < TOLERANCE


def differences(method_values: pd.DataFrame, reference_values: pd.DataFrame, metric: Metric) -> tuple[np.ndarray, int, int]:
    """(paired differences method − reference, censored runs of the method, of the reference); a
    censored run at R + 1 (R: ``metric.horizon``, else one past the latest run seen)."""
    d, cm, cr = differences_by_seed(method_values, reference_values, metric)
    return d.to_numpy(float), cm, cr


def differences_by_seed(method_values: pd.DataFrame, reference_values: pd.DataFrame,
                        metric: Metric) -> tuple[pd.Series, int, int]:
    """:func:`differences` indexed by seed."""
    pairs = _paired(method_values, reference_values, metric)
    m, r = pairs["m"].to_numpy(float), pairs["r"].to_numpy(float)
    seeds = pairs["seed"].to_numpy()
    if not metric.censored:
        return pd.Series(m - r, index=seeds), 0, 0
    late = (metric.horizon if metric.horizon is not None else np.nanmax([*m, *r, 0.0])) + 1
    d = np.where(np.isnan(m), late, m) - np.where(np.isnan(r), late, r)
    return pd.Series(d, index=seeds), int(np.isnan(m).sum()), int(np.isnan(r).sum())


def _tested(d: np.ndarray, kind: str, span: float, seeds: str = "paired seed") -> dict:
    """The estimate of differences ``d``, its 95% interval (cut to ±``span``), the test's p and name;
    with fewer than two differences none of them (``seeds`` names them in the note)."""
    n = len(d)
    if n < 2:
        return {"difference": estimate(d, kind) if n else math.nan, "ci_low": math.nan, "ci_high": math.nan,
                "p": math.nan, "test": "none", "note": f"{n} {seeds}{'s' if n != 1 else ''}: no test"}
    exact = "exact" if n <= EXACT_UP_TO else f"{DRAWS:,} random sign patterns"
    centre = estimate(d, kind)
    low, high = interval(d, kind, ALPHA, span, centre)
    return {"difference": centre, "ci_low": low, "ci_high": high, "p": p_value(d, kind),
            "test": f"{TESTS[kind]} ({exact})", "note": ""}


def extremes(method_values: pd.DataFrame, reference_values: pd.DataFrame, metric: Metric,
             d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lowest, highest) paired differences the censored runs allow: the reference's censored runs as
    late as can be (a difference of −(span + 1), below any observed), then the method's (+(span + 1));
    ``d`` twice without censored runs."""
    if not metric.censored:
        return d, d
    pairs = _paired(method_values, reference_values, metric)
    beyond = metric.span + 1
    return np.where(pairs["r"].isna(), -beyond, d), np.where(pairs["m"].isna(), beyond, d)


def _bounds(row: dict, kind: str, level: float, span: float) -> tuple[float, float]:
    """The interval at ``level`` that holds every difference the censored runs allow: the lower end of
    the lowest differences' interval, the upper end of the highest's (both the observed ones' without)."""
    low = interval(row["d_low"], kind, level, span)[0]
    high = interval(row["d_high"], kind, level, span)[1]
    return low, high


def _worst_p(d_low: np.ndarray, d_high: np.ndarray, kind: str) -> float:
    """p of the side a call would be on, where censored runs leave the differences between ``d_low`` and
    ``d_high``: the lowest ones' where even they lie above 0, the highest ones' where even they lie below,
    else 1; so p < level exactly when :func:`_bounds` at that level leaves out 0."""
    if estimate(d_low, kind) > 0:
        return p_value(d_low, kind)
    if estimate(d_high, kind) < 0:
        return p_value(d_high, kind)
    return 1.0


def compare(method_values: pd.DataFrame, reference_values: pd.DataFrame, metric: Metric) -> dict:
    """One method against the reference on one metric, paired by seed: ``n_seeds, difference,
    ci_low, ci_high, p`` (unadjusted), ``test, censored_method, censored_reference, note`` and the
    paired differences ``d``. The adjusted interval and the verdict need every comparison's p:
    :func:`comparison_table` adds them."""
    d, cm, cr = differences(method_values, reference_values, metric)
    d_low, d_high = extremes(method_values, reference_values, metric, d)
    row = {"n_seeds": len(d), "censored_method": cm, "censored_reference": cr, "d": d, "d_low": d_low,
           "d_high": d_high, **_tested(d, metric.kind, metric.span)}
    if len(d) < 2:
        return row
    notes = []
    if cm or cr:
        notes.append("censored runs: the estimate counts them at R + 1, the interval and p hold every value "
                     "they could take")
        row["ci_low"], row["ci_high"] = _bounds(row, metric.kind, ALPHA, metric.span)
        row["p"] = _worst_p(d_low, d_high, metric.kind)
    if _constant(d):
        notes.append("the same on every seed" if abs(d[0]) < TOLERANCE else f"every paired difference is {d[0]:+.4g}")
    return {**row, "note": "; ".join(notes)}


def verdict(row: dict, level: float, metric: Metric, test=None) -> tuple[str, str, float, float]:
    """(verdict, note, adjusted low, adjusted high) of a compared row tested at ``level`` (by ``test``,
    a shift's p: a sequential look's; default the row's own exact test)."""
    note = row["note"]
    if row["n_seeds"] < 2 or math.isnan(level):
        return "not tested", note, math.nan, math.nan
    d = row["d"]
    censored = bool(row["censored_method"] or row["censored_reference"])
    low, high = _bounds(row, metric.kind, level, metric.span) if censored else \
        interval(d, metric.kind, level, metric.span, row["difference"], test)
    notes = [note] if note else []
    if smallest_p(len(d)) >= level:
        notes.append(f"{len(d)} seeds cannot reach the adjusted level {level:.3g} (their smallest p is "
                     f"{smallest_p(len(d)):.3g})")
    below = metric.resolution > 1 and -metric.resolution < low and high < metric.resolution
    inside = metric.margin > 0 and -metric.margin < low and high < metric.margin
    if (low > 0 or high < 0) and not below:
        called = "better" if (low > 0) == metric.higher_is_better else "worse"
        if inside:
            notes.append(f"inside the margin ±{metric.margin:g}")
    elif inside:
        called = "equivalent"
    else:
        called = "inconclusive"
        if censored and metric.margin > 0:
            seen = interval(d, metric.kind, level, metric.span, row["difference"])
            if -metric.margin < seen[0] and seen[1] < metric.margin:
                notes.append("not equivalent: censored runs leave the difference unbounded")
        if below and (low > 0 or high < 0):
            notes.append(f"below resolution (±{metric.resolution:g}: rounds are seen every {metric.resolution:g})")
    return called, "; ".join(notes), low, high


def _pairs_to_compare(values: dict[tuple[str, str], pd.DataFrame], reference: str | None,
                      metrics: dict[str, Metric]) -> list[dict]:
    """Each (setting, metric, method other than ``reference``) with both arms' per-seed frames."""
    out = []
    for setting in dict.fromkeys(s for s, _ in values):       # in the order of ``best``
        ref = values.get((setting, reference))
        for name, metric in metrics.items():
            for (where, method), frame in values.items():
                if where == setting and method != reference and ref is not None:
                    out.append({"setting": setting, "metric": name, "method": method, "reference": reference,
                                "spec": metric, "frame": frame, "ref": ref})
    return out


def _look_rows(tested: list[dict], alpha: float, family: int, called_before: int) -> list[dict]:
    """The compared rows of one look, with their verdicts: Holm at ``alpha`` over ``family``
    comparisons, ``called_before`` of them called at earlier looks; a row with ``sequential`` (its p
    at Holm's step h and a shift) tested by it (:func:`fedsweep.reports.sequential.holm_sequential`)."""
    testable = [i for i, row in enumerate(tested) if not math.isnan(row["p"])]
    p_at = [functools.lru_cache(maxsize=None)(functools.partial(tested[i]["sequential"], shift=0.0))
            if tested[i].get("sequential") else (lambda h, p=tested[i]["p"]: p) for i in testable]
    found = holm_sequential(p_at, alpha, family, called_before)
    levels, ps = np.full(len(tested), math.nan), np.full(len(tested), math.nan)
    levels[testable], ps[testable] = found
    adjusted = holm(ps, family, called_before) * (ALPHA / alpha)   # < 0.05 exactly where called
    strictest = alpha / max(family - called_before, 1)
    out = []
    for row, level, p, p_adj in zip(tested, levels, ps, adjusted):
        metric, sequential = row["spec"], row.pop("sequential", None)
        h = round(alpha / level) if sequential and not math.isnan(level) else None
        test = functools.partial(sequential, h) if h else None
        called, note, low, high = verdict(row, level, metric, test)
        out.append({**row, "p_adjusted": min(1.0, p_adj) if not math.isnan(p_adj) else math.nan,
                    "verdict": called, "note": note, "adj_ci_low": low, "adj_ci_high": high,
                    "power_mde": power_mde(row["d"], metric.kind, strictest, metric.resolution, metric.grid)})
    return out


def comparison_table(values: dict[tuple[str, str], pd.DataFrame], reference: str | None,
                     metrics: dict[str, Metric], looks: Sequence[int] | None = None,
                     order: Sequence[int] | None = None) -> pd.DataFrame:
    """comparisons.csv: a row per (setting, metric, method other than ``reference``), ``values``
    holding each (setting label, method)'s per-seed frame; Holm over all the rows.

    ``looks`` (with ``order``, the confirm seeds in the order they run): a sequential confirm stage
    looks after the first ``looks[k]`` seeds of ``order``. Each look tests, at its share of α
    (:func:`spent`), the comparisons not yet answered that have seeds of that look, each a comparison
    tested before by its sequential p (the patterns its earlier looks rejected not counted again:
    :mod:`fedsweep.reports.sequential`); Holm runs over every comparison that can be tested (two
    paired seeds), those called at earlier looks taking its first steps. A comparison ``better``,
    ``worse`` or ``equivalent`` stops there (``stop_reason`` ``answered``); one still inconclusive
    at the last look: ``max_seeds reached``; one without the seeds of the next look: ``open`` (the
    driver runs them next, or the sweep was cut short). Without ``looks``: one look on every seed
    (``fixed seeds``)."""
    pairs = _pairs_to_compare(values, reference, metrics)
    # Holm's family: the comparisons that can be tested (a pair without two paired seeds can call nothing)
    family = sum(len(_paired(p["frame"], p["ref"], p["spec"])) >= 2 for p in pairs)
    plan = list(looks) if looks else [None]
    alphas = spent(plan) if looks else [ALPHA]
    final: dict[int, dict] = {}
    pending, called_before = list(range(len(pairs))), 0
    history: dict[int, list[tuple[int, float]]] = {i: [] for i in range(len(pairs))}   # (seeds, α share) per look tested
    for k, (n, alpha) in enumerate(zip(plan, alphas)):
        before = plan[k - 1] if k else 0
        tested, idle = [], []
        for i in pending:
            pair = pairs[i]
            frame, ref = pair["frame"], pair["ref"]
            if n is not None:
                seeds = set(order[:n])
                frame, ref = frame[frame["seed"].isin(seeds)], ref[ref["seed"].isin(seeds)]
                fresh = set(order[before:n])
                if k and not (set(frame["seed"]) & set(ref["seed"]) & fresh):
                    idle.append(i)     # not run on this look's seeds
                    continue
            row = {**{key: pair[key] for key in ("setting", "metric", "method", "reference", "spec")},
                   **compare(frame, ref, pair["spec"]), "index": i}
            if history[i] and not (row["censored_method"] or row["censored_reference"]) and \
                    2 <= row["n_seeds"] <= SEQUENTIAL_UP_TO:
                row["sequential"] = _sequential(frame, ref, pair["spec"], order, history[i])
            tested.append(row)
        for i in idle:
            final[i]["stop_reason"] = "open"
        pending = []
        for row in _look_rows(tested, alpha, family, called_before):
            answered = row["verdict"] in ("better", "worse", "equivalent")
            called_before += row["verdict"] in ("better", "worse")
            last = k == len(plan) - 1
            row["stop_reason"] = ("fixed seeds" if not looks else "answered" if answered
                                  else "max_seeds reached" if last else "open")
            final[row["index"]] = row
            if not math.isnan(row["p"]):
                history[row["index"]].append((row["n_seeds"], alpha))
            if not answered:
                pending.append(row["index"])
    rows = [final[i] for i in range(len(pairs))]
    table = pd.DataFrame(rows, columns=[*COLUMNS, "p", "d"])
    table["mde"] = table["power_mde"].where(table["verdict"] == "inconclusive")
    table["margin"] = [pair["spec"].margin for pair in pairs]
    table["seeds_used"] = table["n_seeds"]
    return table[COLUMNS]


def _sequential(frame: pd.DataFrame, ref: pd.DataFrame, metric: Metric, order: Sequence[int],
                history: list[tuple[int, float]]):
    """A comparison's p at this look as a function of Holm's step h and a shift: equation (1) of
    :mod:`fedsweep.reports.sequential` on its paired differences in the order their seeds ran, its
    earlier looks (``history``: paired seeds, share of α) at their shares / h."""
    by_seed, _, _ = differences_by_seed(frame, ref, metric)
    position = {seed: i for i, seed in enumerate(order)}
    d = by_seed.to_numpy(float)[np.argsort([position[s] for s in by_seed.index], kind="stable")]
    sizes, shares = [n for n, _ in history] + [len(d)], [a for _, a in history]

    def p(h: int, shift: float) -> float:
        return sequential_p(d, metric.kind, sizes, [a / h for a in shares], shift)
    return p


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
                  columns: dict[str, tuple[str, float, float]]) -> pd.DataFrame:
    """``best`` with a column ``<name>_ci`` (an :class:`Interval`) per ``{name: (metric column, low,
    high)}``, over the same per-seed values the comparisons use (rounds to target: over the seeds that
    reached it), cut to [low, high]."""
    out = best.copy()
    keys = [_key(r, best.attrs["settings"]) for _, r in best.iterrows()]
    for name, (column, low, high) in columns.items():
        out[f"{name}_ci"] = [mean_ci(values[k][column], low=low, high=high) for k in keys]
    out.attrs.update(best.attrs)
    return out
