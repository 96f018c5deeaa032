"""The group-sequential boundary of a confirm stage (fedsweep.reports.sequential): each look's p
counted exactly on the sign patterns no earlier look rejected, its error at most the looks' shares
added, never less power than the union bound, and what comparisons.csv calls."""
import itertools
import math

import numpy as np
import pandas as pd
import pytest

from fedsweep.reports.exact import ALPHA, MEAN, RANK, p_value, spent
from fedsweep.reports.sequential import holm_sequential, sequential_p
from fedsweep.reports.stats import Metric, comparison_table


def _by_definition(d, kind, sizes, levels):
    """Equation (1) counted pattern by pattern with plain Python: a pattern is rejected at look j when
    the share of the patterns still alive whose |S_j| is at least its own is at most levels[j]."""
    n = len(d)
    pats = list(itertools.product([1, -1], repeat=n))

    def stat(pat, size):
        x = np.array(pat[:size]) * d[:size]
        return abs(float(p_value.__globals__["_statistic"](x, kind).sum()))

    alive = set(range(len(pats)))
    for j, size in enumerate(sizes[:-1]):
        s = {i: stat(pats[i], size) for i in alive}
        rejected = {i for i in alive if sum(s[k] >= s[i] - 1e-9 for k in alive) / len(pats) <= levels[j]}
        alive -= rejected
    observed = 0   # the all +1 pattern: the data as seen
    if observed not in alive:
        return 0.0
    s_k = {i: stat(pats[i], sizes[-1]) for i in alive}
    return sum(s_k[i] >= s_k[observed] - 1e-9 for i in alive) / len(pats)


@pytest.mark.parametrize("kind", [MEAN, RANK])
def test_the_sequential_p_is_equation_one_counted_pattern_by_pattern(kind):
    rng = np.random.default_rng(3)
    for _ in range(6):
        d = np.round(rng.normal(0.8, 1.0, 9), 1)
        for sizes in ([4, 9], [3, 6, 9]):
            levels = [ALPHA * 3 / 9] * (len(sizes) - 1)
            assert sequential_p(d, kind, sizes, levels) == pytest.approx(_by_definition(d, kind, sizes, levels))
        assert sequential_p(d, kind, [9], []) == p_value(d, kind)     # one look: the plain test


def test_the_error_over_every_look_is_at_most_alpha_and_more_of_it_is_used_than_the_union_bound():
    """Exactly, given the sizes of the differences: over all 2^12 sign patterns (the null's outcomes), the
    share rejected at some look of 6, 9, 12 seeds is at most α; the union bound's rejects fewer."""
    d = np.random.default_rng(5).uniform(0.5, 2.0, 12)
    sizes, shares = [6, 9, 12], spent([6, 9, 12])
    sequential = union = 0
    for pattern in itertools.product([1.0, -1.0], repeat=12):
        x = d * np.array(pattern)
        seq_hit = any(sequential_p(x[:n], MEAN, sizes[:k + 1], shares[:k]) <= shares[k] for k, n in enumerate(sizes))
        sequential += seq_hit
        union += any(p_value(x[:n], MEAN) <= shares[k] for k, n in enumerate(sizes))
    total = 2 ** 12
    assert sequential / total <= ALPHA and union / total <= ALPHA
    assert sequential > union


def test_a_later_look_never_has_a_larger_p_than_its_own_test_and_a_shift_rejected_before_stays_rejected():
    rng = np.random.default_rng(11)
    for _ in range(20):
        d = rng.normal(0.5, 1.0, 12)
        assert sequential_p(d, MEAN, [8, 12], [0.0333]) <= p_value(d, MEAN) + 1e-12
    d = np.full(8, 3.0) + np.linspace(0, 0.1, 8)
    assert p_value(d[:6], MEAN) < 0.05 * 6 / 8                       # the first look rejects 0
    assert sequential_p(d, MEAN, [6, 8], [0.05 * 6 / 8]) == 0.0


def test_holm_steps_with_levels_that_move_every_looks_boundary():
    """A sequential p falls as Holm's level rises (h falls); each step calls the smallest below share/h."""
    seen = []

    def p(value, slope):
        def at(h):
            seen.append(h)
            return value + slope * h
        return at
    levels, ps = holm_sequential([p(0.001, 0.0), p(0.004, 0.001), p(0.2, 0.0)], 0.05, 3, 0)
    assert levels[0] == pytest.approx(0.05 / 3) and levels[1] == pytest.approx(0.05 / 2)
    assert ps[1] == pytest.approx(0.006)                  # read at h = 2, after the first call
    assert levels[2] == pytest.approx(0.05 / 1) and ps[2] == 0.2
    levels, ps = holm_sequential([p(0.03, 0.0)], 0.05, 4, 1)   # one called at an earlier look: h = 3
    assert levels == [pytest.approx(0.05 / 3)] and ps == [0.03]


def _frames(d):
    seeds = list(range(len(d)))
    ref = pd.DataFrame({"seed": seeds, "acc": np.zeros(len(d))})
    return pd.DataFrame({"seed": seeds, "acc": d}), ref


def test_comparisons_csv_calls_what_the_sequential_boundary_calls_and_the_union_bound_does_not():
    """A sweep that looked after 8 then 12 seeds: a difference the union bound leaves inconclusive at the
    second look is called, its adjusted interval leaving out 0 exactly as its sequential p says."""
    metric = Metric("acc", higher_is_better=True)
    looks, order = [8, 12], list(range(12))
    rng = np.random.default_rng(0)
    found = 0
    for _ in range(400):
        d = np.round(rng.normal(0.6, 1.0, 12), 2)
        if p_value(d[:8], MEAN) < ALPHA * 8 / 12:
            continue                                          # called at the first look either way
        method, ref = _frames(d)
        table = comparison_table({("all", "m"): method, ("all", "ref"): ref}, "ref", {"acc": metric}, looks, order)
        row = table.iloc[0]
        last = ALPHA * 4 / 12
        p_seq = sequential_p(d, MEAN, [8, 12], [ALPHA * 8 / 12])
        assert row["p_adjusted"] == pytest.approx(min(1.0, p_seq * ALPHA / last))
        assert (row["verdict"] == "better") == (p_seq < last and d.mean() > 0)
        assert (row["adj_ci_low"] > 0 or row["adj_ci_high"] < 0) == (p_seq < last)
        if p_seq < last <= p_value(d, MEAN):
            found += 1
    assert found >= 1, "no case where the sequential boundary calls what the union bound does not"


def test_a_comparison_with_censored_runs_keeps_the_union_bound():
    metric = Metric("rounds_to_target", higher_is_better=False, resolution=1.0, censored=True, horizon=40, low=1.0,
                    high=40.0, grid=1.0)
    d = np.array([3.0, 4, 2, 5, 6, 3, 4, 5, 2, 3])
    method = pd.DataFrame({"seed": range(10), "rounds_to_target": 20 - d})
    method.loc[7, "rounds_to_target"] = math.nan
    ref = pd.DataFrame({"seed": range(10), "rounds_to_target": np.full(10, 20.0)})
    table = comparison_table({("all", "m"): method, ("all", "ref"): ref}, "ref", {"rounds_to_target": metric},
                             [6, 10], list(range(10)))
    row = table.iloc[0]
    assert row["censored_method"] == 1 and row["n_seeds"] == 10
    d_high = np.where(np.arange(10) == 7, 42.0, 20 - d - 20)    # the censored run as late as can be
    plain = p_value(d_high, RANK)
    assert row["p_adjusted"] == pytest.approx(min(1.0, plain * ALPHA / (ALPHA * 4 / 10)))
