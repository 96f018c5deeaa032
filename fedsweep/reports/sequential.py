"""The group-sequential boundary of a confirm stage that adds seeds until answered: the exact
sign-flip test at each look, conditioned on the looks before, so that seeds shared between looks are
accounted for instead of bounded.

A comparison is tested at looks k = 1, 2, … on the first n_1 < n_2 < … of its paired seeds (in the
order they ran), look k at level a_k (its share of α, :func:`fedsweep.reports.exact.spent`). Under the
null hypothesis (the differences symmetric about the tested shift) the signs of the n_k differences are
uniform over their 2^(n_k) patterns given their sizes |d_i|, and the statistic of every earlier look is
a function of the same signs: S_j = Σ_{i ≤ n_j} ε_i w_{j,i} (w: the differences, or their signed ranks
among the first n_j). So the chance of each look's rejection region, given that no earlier look
rejected, is counted exactly on the patterns:

    p*_k = P_ε( no look j < k rejects  and  |S_k| ≥ |s_k| )                    (1)

and look k rejects where p*_k ≤ a_k. The first rejection, at whichever look, has chance at most Σ a_k
= α (each look's region has chance ≤ a_k given the sizes), with no union bound between the looks: a
pattern extreme at an earlier look was already rejected there and is not counted again, so p*_k ≤ p_k
(the look's own p), equal at the first look (Jennison & Turnbull, *Group Sequential Methods with
Applications to Clinical Trials*, 2000, §7 on error spending; computed here for the permutation test
rather than by the normal approximation). A shift δ that an earlier look rejected stays rejected: its
p*_k is 0, so each look's interval lies inside the earlier ones.

Holm across comparisons (:func:`holm_sequential`): a comparison tested at Holm's level α'/h has its
earlier looks' boundaries at a_j / h too (a higher level, once some comparison is called, moves every
look's boundary out: the rejection regions grow with the level, so Holm's shortcut of the closed test
holds; Maurer & Bretz, Statistics in Biopharmaceutical Research 5 (2013) 311–320).

Up to EXACT_UP_TO seeds the 2^n patterns are enumerated (65,536 at 16); beyond, and for comparisons
whose censored runs make the differences an interval, the look's own p (the union bound, valid and
conservative).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import numpy as np
from scipy import stats

from fedsweep.reports.exact import MEAN, TOLERANCE, p_value

EXACT_UP_TO = 16


@functools.lru_cache(maxsize=4)
def _patterns(n: int) -> np.ndarray:
    """Every sign pattern of n pairs (2^n × n, float64 for exact sums), the first all +1 (the observed)."""
    bits = (np.arange(2 ** n)[:, None] >> np.arange(n)) & 1
    return 1.0 - 2.0 * bits


def _weights(d: np.ndarray, kind: str) -> np.ndarray:
    """What the test sign-flips, one weight per difference in place: the differences, or their signed
    ranks with zeros weighted 0 (their signs change nothing)."""
    if kind == MEAN:
        return d
    nonzero = np.abs(d) > TOLERANCE * max(1.0, float(np.abs(d).max(initial=0.0)))
    w = np.zeros(len(d))
    w[nonzero] = np.sign(d[nonzero]) * stats.rankdata(np.abs(d[nonzero]))
    return w


def sequential_p(d: np.ndarray, kind: str, sizes: Sequence[int], levels: Sequence[float],
                 shift: float = 0.0) -> float:
    """p*_k of equation (1): ``d`` the paired differences in the order their seeds ran, ``sizes`` the
    seeds n_1 < … < n_k = len(d) at each look this comparison was tested, ``levels`` the levels
    a_1 … a_{k−1} its earlier looks rejected at; 0 where an earlier look rejects ``shift``. With one look,
    or more than EXACT_UP_TO seeds: the look's own p."""
    d = np.asarray(d, dtype=float) - shift
    n = len(d)
    if len(sizes) <= 1 or n > EXACT_UP_TO:
        return p_value(d, kind)
    signs, total = _patterns(n), 2.0 ** n
    alive = np.ones(len(signs), dtype=bool)     # patterns no earlier look rejected
    for j, size in enumerate(sizes):
        w = _weights(d[:size], kind)
        s = np.abs(signs[:, :size] @ w)
        tolerance = TOLERANCE * max(1.0, float(np.abs(w).sum()))
        if j == len(sizes) - 1:
            return float(np.count_nonzero(alive & (s >= s[0] - tolerance))) / total
        kept = np.sort(s[alive])
        at_least = len(kept) - np.searchsorted(kept, s - tolerance, side="left")   # alive with |S_j| ≥ this one's
        alive &= ~(at_least / total <= levels[j])
        if not alive[0]:
            return 0.0
    raise ValueError("sizes must end at len(d)")


def holm_sequential(p_at: Sequence[Callable[[float], float]], share: float, family: int,
                    called_before: int) -> tuple[list[float], list[float]]:
    """Holm's step-down at one look whose share of α is ``share``, over ``family`` comparisons of which
    ``called_before`` were called at earlier looks: ``p_at[i](h)`` is comparison i's p at Holm's h-th
    step (its boundaries at the earlier looks' shares / h: a sequential p changes with the level).
    Each step calls the smallest p below share / h, h = family − called so far; returns (level, p) per
    comparison: a called one's level share / h at its step, the others' share / h after the last call
    (NaN where none is left to test)."""
    h = family - called_before
    levels, ps = [math.nan] * len(p_at), [math.nan] * len(p_at)
    left = [i for i in range(len(p_at))]
    while left and h > 0:
        at = {i: p_at[i](h) for i in left}
        best = min(left, key=lambda i: (at[i], i))
        if not at[best] < share / h:
            for i in left:
                levels[i], ps[i] = share / h, at[i]
            return levels, ps
        levels[best], ps[best] = share / h, at[best]
        left.remove(best)
        h -= 1
    for i in left:
        ps[i] = p_at[i](max(h, 1))
    return levels, ps
