"""The exact paired tests of ``fedsweep report`` and their intervals (:mod:`fedsweep.reports.stats`
reads them): the sign-flip permutation test of a sum of paired differences (on the differences:
their mean; on their signed ranks: the signed-rank test, with the Hodges–Lehmann estimate), each
interval the shifts its test does not reject, Holm's step-down and its levels, and the α of each
look of a sequential confirm stage."""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import numpy as np
from scipy import stats

CONFIDENCE, ALPHA, POWER = 0.95, 0.05, 0.8
TOLERANCE = 1e-9
EXACT_UP_TO = 24      # seeds: every sign pattern (16.8 million at 24, met in the middle); beyond, DRAWS fixed random ones
MIDDLE = 12           # seeds up to which each pattern's sum is taken directly
DRAWS = 20_000
MEAN, RANK = "mean", "rank"
TESTS = {MEAN: "sign-flip", RANK: "signed-rank"}


def holm(pvalues: Sequence[float], family: int | None = None, called_before: int = 0) -> np.ndarray:
    """Holm's step-down adjustment; NaN p-values (no test) stay NaN and do not count in the family.
    ``family``: the comparisons Holm runs over (default: the p-values given), ``called_before`` of
    which were called at an earlier look and take its first steps."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(len(p), math.nan)
    tested = np.flatnonzero(~np.isnan(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    m = (len(order) if family is None else family) - called_before
    out[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(len(order))) * p[order]))
    return out


def holm_levels(pvalues: Sequence[float], alpha: float = ALPHA, family: int | None = None,
                called_before: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(level, called) per p: Holm's step-down calls the j-th smallest p (1-based) while it is below
    α / (m − j + 1) and every smaller one was called; a called p's level is that α / (m − j + 1), an
    uncalled one's α / (m − r), r the number called. NaN p: NaN level, not called. ``family``,
    ``called_before``: as for :func:`holm` (m = family − called_before)."""
    p = np.asarray(pvalues, dtype=float)
    level, called = np.full(len(p), math.nan), np.zeros(len(p), dtype=bool)
    tested = np.flatnonzero(~np.isnan(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    m, r = (len(order) if family is None else family) - called_before, 0
    for j, i in enumerate(order):
        if p[i] >= alpha / (m - j):
            break
        level[i], called[i], r = alpha / (m - j), True, r + 1
    level[order[r:]] = alpha / (m - r) if m > r else math.nan
    return level, called


def spent(looks: Sequence[int]) -> list[float]:
    """α of each look of a sequential confirm stage: spent in proportion to its seeds, α · (n_k −
    n_{k−1}) / n_K (the Kim–DeMets power family with ρ = 1, close to Pocock's boundary: a clear
    difference can stop at the first look). The looks' levels add up to α; each look's test counts only
    the sign patterns no earlier look rejected (:mod:`fedsweep.reports.sequential`), so the chance of a
    false call over every look stays below α with the shared seeds accounted for."""
    return [ALPHA * (n - before) / looks[-1] for before, n in zip([0, *looks[:-1]], looks)]


# -- the sign-flip tests and their intervals ----------------------------------------------------

@functools.lru_cache(maxsize=None)
def _signs(n: int) -> np.ndarray:
    """Sign patterns for n pairs, the first all +1: every one of the 2^n up to MIDDLE pairs, else DRAWS
    drawn once from a fixed seed (the same for every shift, so an interval is one test's)."""
    if n <= MIDDLE:
        bits = (np.arange(2 ** n)[:, None] >> np.arange(n)) & 1
        return 1.0 - 2.0 * bits
    return _drawn_signs(n)


@functools.lru_cache(maxsize=None)
def _drawn_signs(n: int) -> np.ndarray:
    """DRAWS sign patterns for n pairs drawn once from a fixed seed, the first all +1."""
    signs = np.random.default_rng(0).choice([-1.0, 1.0], size=(DRAWS, n))
    signs[0] = 1.0
    return signs


def smallest_p(n: int) -> float:
    """The smallest two-sided p of a sign-flip test on n pairs (every pair on one side)."""
    return 2.0 / 2 ** n if n <= EXACT_UP_TO else 1.0 / DRAWS


def _flip_p(x: np.ndarray) -> float:
    """Two-sided p of the sum of ``x`` among its sign flips: the share of patterns whose |sum| is at
    least the observed one (the observed pattern counts itself). Up to MIDDLE pairs every pattern's sum
    is taken; up to EXACT_UP_TO they are met in the middle: the 2^k sums of the first k = n // 2 pairs
    against the sorted 2^(n−k) of the others, counting for each how many of those bring |a + b| to the
    observed sum (4,096 × 4,096 at 24 pairs, not 16.8 million patterns); beyond, DRAWS random patterns."""
    n = len(x)
    if n == 0:
        return 1.0
    observed = abs(float(x.sum())) - TOLERANCE * max(1.0, float(np.abs(x).sum()))
    if n <= MIDDLE or n > EXACT_UP_TO:
        return float(np.mean(np.abs(_signs(n) @ x) >= observed))
    if observed <= 0:
        return 1.0
    k = n // 2
    a, b = _signs(k) @ x[:k], np.sort(_signs(n - k) @ x[k:])
    at_least = len(b) - np.searchsorted(b, observed - a, side="left")   # a + b ≥ observed
    at_most = np.searchsorted(b, -observed - a, side="right")            # a + b ≤ −observed
    return float((at_least + at_most).sum()) / 2.0 ** n


def _statistic(d: np.ndarray, kind: str) -> np.ndarray:
    """What is sign-flipped: the differences themselves (mean), or their signed ranks, zeros dropped."""
    if kind == MEAN:
        return d
    d = d[np.abs(d) > TOLERANCE * max(1.0, float(np.abs(d).max(initial=0.0)))]
    return np.sign(d) * stats.rankdata(np.abs(d))


def p_value(d: np.ndarray, kind: str, shift: float = 0.0) -> float:
    """p of the hypothesis that the paired differences ``d`` are centred on ``shift``."""
    return _flip_p(_statistic(np.asarray(d, dtype=float) - shift, kind))


def estimate(d: np.ndarray, kind: str) -> float:
    """The mean, or the Hodges–Lehmann estimate: the median of the Walsh averages (d_i + d_j) / 2, i ≤ j."""
    if kind == MEAN:
        return float(np.mean(d))
    i, j = np.triu_indices(len(d))
    return float(np.median((d[i] + d[j]) / 2))


def interval(d: np.ndarray, kind: str, level: float, bound: float = math.inf,
             centre: float | None = None, test: Callable[[float], float] | None = None) -> tuple[float, float]:
    """The shifts the test does not reject at ``level`` (p ≥ level), cut to ±``bound``: each end found
    by bisection between an accepted shift and a rejected one, the accepted one being 0 where 0 is
    accepted and lies on that side, so that the interval holds 0 exactly when the test accepts it. The
    signed-rank test's accepted shifts need not be one piece (zeros dropped, ties): beyond each end its
    Walsh averages, where its statistic changes, are tried too, and the end moved out to the farthest
    accepted one (the interval is then the hull of the accepted set, short of a rejected 0). ``test``:
    the p of a shift (default: :func:`p_value` of ``d``; a sequential look's, :mod:`.sequential`)."""
    d = np.asarray(d, dtype=float)
    test = test or functools.partial(p_value, d, kind)
    centre = estimate(d, kind) if centre is None else centre
    if smallest_p(len(d)) >= level:     # no shift is rejected: every one the bound allows
        return -bound, bound
    zero_ok = test(0.0) >= level
    scale = max(float(np.ptp(d)), abs(centre), TOLERANCE)

    def end(sign: float) -> float:
        accepted = 0.0 if zero_ok and sign * (0.0 - centre) > 0 else centre
        step = scale
        rejected = accepted + sign * step
        while test(rejected) >= level:
            if abs(rejected) >= bound:
                return sign * bound
            accepted, step = rejected, 2 * step
            rejected = accepted + sign * step
        for _ in range(100):
            if abs(rejected - accepted) <= 1e-9 * scale:
                break
            mid = (accepted + rejected) / 2
            if test(mid) >= level:
                accepted = mid
            else:
                rejected = mid
        if kind == RANK:
            accepted = _outermost(d, level, accepted, sign, bound, zero_ok, scale, test)
        accepted = _snap(float(np.clip(accepted, -bound, bound)), scale)
        return 0.0 if zero_ok and abs(accepted) < 10 * TOLERANCE else accepted   # a tie with 0, as the test sees it

    return end(-1.0), end(1.0)


def _outermost(d: np.ndarray, level: float, found: float, sign: float, bound: float, zero_ok: bool,
               scale: float, test: Callable[[float], float]) -> float:
    """The farthest accepted shift of the signed-rank test beyond ``found`` on side ``sign``: its statistic
    is constant between consecutive Walsh averages, so each gap's midpoint and each average are tried
    (a few: an end sits near an extreme quantile of them); a rejected 0 is not crossed."""
    i, j = np.triu_indices(len(d))
    walsh = np.unique((d[i] + d[j]) / 2)
    out = walsh[sign * (walsh - found) > 1e-9 * scale]
    out = out[np.argsort(sign * out)]                          # nearest first
    if not zero_ok and sign * (0.0 - found) > 0:
        out = out[sign * out < 0]                              # short of a rejected 0
    farthest, previous = found, found
    for w in out:
        if abs(w) > bound and abs(previous) >= bound:
            break
        if test((previous + w) / 2) >= level or test(w) >= level:
            farthest = w
        previous = w
    return farthest


def _snap(x: float, scale: float) -> float:
    """``x`` rounded to 1e-7 of ``scale`` (a bisection ends within 1e-9 of it: 0.99999997 reads 1), on
    the same side of 0 as before (an end beside 0 says whether the interval holds it)."""
    q = 10.0 ** math.floor(math.log10(scale * 1e-7))
    snapped = round(x / q) * q
    return snapped if (snapped > 0) == (x > 0) and (snapped < 0) == (x < 0) else x


def power_mde(d: np.ndarray, kind: str, level: float, resolution: float = 0.0, grid: float = 0.0) -> float:
    """The difference n paired seeds with differences like ``d`` call with 80% power at ``level``
    (two-sided): ``unit_mde(n, level, kind)`` standard deviations of ``d`` (``grid_mde`` where the
    metric's values lie on a ``grid``: rounds seen every ``eval.every``, a reached-or-not 0/1), at least
    ``resolution``; infinite where the sign-flip test cannot reach ``level`` at all."""
    n = len(d)
    if n < 2:
        return math.nan
    if smallest_p(n) >= level:
        return math.inf
    sd, level = float(np.std(d, ddof=1)), float(f"{level:.6g}")
    unit = grid_mde(n, level, kind, float(f"{grid / sd:.2g}")) if grid > 0 and sd > 0 else unit_mde(n, level, kind)
    return float(max(unit * sd, resolution))


POWER_DRAWS = 1_000   # normal samples a power is simulated on: its standard error about 0.013 at 0.8


@functools.lru_cache(maxsize=None)
def unit_mde(n: int, level: float, kind: str) -> float:
    """The shift, in standard deviations of the differences, at which this module's own test of n
    normal paired differences rejects at ``level`` with 80% power (POWER): simulated on POWER_DRAWS
    normal samples drawn once from a fixed seed (common to every shift, so power rises with it),
    bisected to 2% from the paired t-test's value, (t_{1−level/2, n−1} + t_{0.8, n−1}) / √n (× √(π/3)
    for the signed-rank test). The t formula alone is optimistic for these exact tests at small n and
    strict levels, where the sign patterns are few: at n = 12 and level 0.05/16 it has power 0.70."""
    if smallest_p(n) >= level:
        return math.inf
    z = np.random.default_rng(n).standard_normal((POWER_DRAWS, n))
    guess = (stats.t.ppf(1 - level / 2, n - 1) + stats.t.ppf(POWER, n - 1)) / math.sqrt(n)
    guess *= math.sqrt(math.pi / 3) if kind == RANK else 1.0

    def power(shift: float) -> float:
        return float(np.mean(_flip_ps(z + shift, kind) < level))

    low, high = guess, guess
    while power(low) >= POWER and low > 1e-3:
        low /= 1.5
    while power(high) < POWER:
        high *= 1.5
    while high - low > 0.02 * high:
        mid = (low + high) / 2
        low, high = (mid, high) if power(mid) < POWER else (low, mid)
    return high


GRID_DRAWS = 400   # samples a power on a grid is simulated on (each tested by p_value): its s.e. about 0.02


@functools.lru_cache(maxsize=None)
def grid_mde(n: int, level: float, kind: str, step: float) -> float:
    """:func:`unit_mde` for differences that lie on a grid ``step`` standard deviations apart (rounds to
    a target seen every ``eval.every`` rounds): the normal samples, shifted, are rounded to the grid and
    tested as real ones are (:func:`p_value`: the signed-rank test drops the zeros, ties share ranks).
    On a coarse grid many differences are 0 or tied, fewer sign patterns remain, and the continuous
    value is optimistic (measured in docs/sweeps.md, Power)."""
    z = np.random.default_rng(n).standard_normal((GRID_DRAWS, n))

    def power(shift: float) -> float:
        x = np.round((z + shift) / step) * step
        ps = _flip_ps(x, kind) if kind == MEAN else np.array([p_value(row, kind) for row in x])
        return float(np.mean(ps < level))

    low = high = unit_mde(n, level, kind)
    if not math.isfinite(high):
        return high
    while power(low) >= POWER and low > 1e-3:
        low /= 1.5
    while power(high) < POWER:
        high *= 1.5
        if high > 1e3:
            return math.inf
    while high - low > 0.03 * high:
        mid = (low + high) / 2
        low, high = (mid, high) if power(mid) < POWER else (low, mid)
    return high


def _flip_ps(x: np.ndarray, kind: str) -> np.ndarray:
    """:func:`p_value` of each row of ``x`` (n normal differences: no zeros, no ties), in chunks; over
    DRAWS random sign patterns where there are more (a p near 0.003 then within about 0.0004)."""
    n = x.shape[1]
    stat = x if kind == MEAN else np.sign(x) * stats.rankdata(np.abs(x), axis=1)
    signs = (_signs(n) if 2 ** n <= DRAWS else _drawn_signs(n)).astype(np.float32)   # float32: twice as fast,
    out, stat = np.empty(len(x)), stat.astype(np.float32)          # its rounding far inside the 1e-5 below
    step = max(1, 2 ** 22 // len(signs))
    for i in range(0, len(x), step):
        block = stat[i:i + step]
        observed = np.abs(block.sum(axis=1)) - 1e-5 * np.maximum(1.0, np.abs(block).sum(axis=1))
        out[i:i + step] = np.mean(np.abs(signs @ block.T) >= observed, axis=0)
    return out
