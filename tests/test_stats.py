"""fedsweep report's statistics (fedsweep/reports/stats.py) on fixed per-seed numbers: the sign-flip
and signed-rank tests against enumeration and scipy, intervals that are those tests inverted, Holm's
levels, verdicts that agree with their adjusted interval, censored rounds, the evaluation cadence,
equivalence margins and power."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fedsweep.reports.stats import (COLUMNS, MEAN, RANK, Metric, compare, comparison_table, estimate, holm,
                                   holm_levels, interval, mean_ci, mean_ci_rows, p_value, power_mde, smallest_p)
from fedsweep.reports.exact import unit_mde

ACCURACY = Metric("acc", higher_is_better=True, margin=0.01, low=0.0, high=1.0)
ROUNDS = Metric("rounds", higher_is_better=False, resolution=5, censored=True, horizon=60, margin=2, low=1, high=60)
EVERY_ROUND = replace(ROUNDS, resolution=1)
REFERENCE = [0.91, 0.93, 0.90, 0.94, 0.92, 0.95, 0.89, 0.90]          # eight seeds


def seeds(values, column: str = "acc", first: int = 0) -> pd.DataFrame:
    """A per-seed frame as the report hands it over: ``seed`` and the metric's column."""
    return pd.DataFrame({"seed": range(first, first + len(values)), column: values})


def called(method, reference, metric=ACCURACY) -> dict:
    """One comparison with its verdict, alone in its report (Holm over one p leaves it as it is)."""
    column = metric.column
    table = comparison_table({("all", "m"): seeds(method, column), ("all", "ref"): seeds(reference, column)}, "ref",
                             {"metric": metric})
    assert len(table) == 1
    return table.iloc[0].to_dict()


def flips_by_hand(x) -> float:
    """Two-sided sign-flip p by listing every pattern."""
    x = np.asarray(x, float)
    sums = [abs(sum(s * v for s, v in zip(signs, x))) for signs in itertools.product([1, -1], repeat=len(x))]
    return sum(t >= abs(x.sum()) - 1e-12 for t in sums) / len(sums)


# -- intervals of a mean ---------------------------------------------------------------------------

def test_mean_ci_is_scipys_t_interval_cut_to_the_metrics_range():
    x = [0.91, 0.93, 0.90, 0.94, 0.92]
    got = mean_ci(x)
    low, high = stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=stats.sem(x))
    assert (got.mean, got.low, got.high, got.n) == pytest.approx((0.92, low, high, 5))
    one = mean_ci([0.87, math.nan])                                              # NaN is no seed
    assert one.mean == 0.87 and one.n == 1 and math.isnan(one.low) and math.isnan(one.high)
    assert mean_ci([0.5, 0.5, 0.5])[:3] == (0.5, 0.5, 0.5)                       # equal seeds: a point
    # what the t-interval says past the possible is cut: accuracy [0.8593, 1.0185] -> [0.8593, 1]
    wide = mean_ci([0.88, 1.0, 0.93, 0.99, 0.9], low=0.0, high=1.0)
    assert wide.high == 1.0 and wide.low == pytest.approx(mean_ci([0.88, 1.0, 0.93, 0.99, 0.9]).low)
    rounds = mean_ci([3, 40, 2, 45], low=1, high=60)                             # never below 1 round
    assert rounds.low == 1 and mean_ci([3, 40, 2, 45]).low < 1


def test_curve_bands_are_the_same_intervals_per_round():
    frame = pd.DataFrame({"s0": [0.1, 0.2, 0.3, 0.4], "s1": [0.2, 0.2, 0.5, math.nan],
                          "s2": [0.3, 0.2, math.nan, math.nan]})
    mean, low, high = mean_ci_rows(frame)
    for i, row in enumerate(frame.to_numpy()):
        want = mean_ci(row)
        assert mean[i] == pytest.approx(want.mean)
        assert [low[i], high[i]] == pytest.approx([want.low, want.high], nan_ok=True)
    assert math.isnan(low[3]) and (low[1], high[1]) == pytest.approx((0.2, 0.2))
    _, low, high = mean_ci_rows(frame, low=0.0, high=0.45)
    assert low.min() >= 0 and high.max() <= 0.45


# -- the tests -------------------------------------------------------------------------------------

def test_sign_flip_p_is_the_share_of_sign_patterns_at_least_as_extreme():
    for d in ([0.01, 0.02, -0.005, 0.03], [-2, -1, -2, -2, -1], [0.5, 0.5, 0.5, 0.5, 0.5, 0.5], [1, -1, 2, -2, 3, 0.5, 4]):
        assert p_value(np.array(d, float), MEAN) == pytest.approx(flips_by_hand(d))
    # the issue's false call of the paired t-test: t p 0.0028, exact 2 / 32
    assert stats.ttest_1samp([-2, -1, -2, -2, -1], 0).pvalue < 0.003
    assert p_value(np.array([-2., -1, -2, -2, -1]), MEAN) == pytest.approx(0.0625)
    assert smallest_p(5) == 0.0625 and smallest_p(8) == 2 / 256


def test_signed_rank_p_is_scipys_exact_wilcoxon_without_ties():
    rng = np.random.default_rng(3)
    for n in (5, 7, 10, 13):
        d = rng.normal(0.3, 1.0, n)
        assert p_value(d, RANK) == pytest.approx(stats.wilcoxon(d, method="exact").pvalue)


def test_up_to_24_seeds_every_sign_pattern_counts():
    """Met in the middle, the p of 20 pairs is the share of all 2^20 patterns (brute force here) at least
    as extreme, and the signed-rank one scipy's exact Wilcoxon."""
    d = np.random.default_rng(5).normal(0.2, 1.0, 20)
    signs = 1.0 - 2.0 * ((np.arange(2 ** 20)[:, None] >> np.arange(20)) & 1)
    assert p_value(d, MEAN) == pytest.approx(np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-9), abs=1e-12)
    assert p_value(d, RANK) == pytest.approx(stats.wilcoxon(d, method="exact").pvalue)
    assert smallest_p(24) == 2 / 2 ** 24


def test_beyond_24_seeds_the_patterns_are_drawn_once_and_the_same_each_time():
    d = np.random.default_rng(0).normal(0.004, 0.01, 30)
    first = p_value(d, MEAN)
    assert first == p_value(d, MEAN) and abs(first - stats.ttest_1samp(d, 0).pvalue) < 0.02
    assert "20,000 random sign patterns" in called(list(0.9 + d), [0.9] * 30)["test"]


def test_an_enumerated_null_calls_no_more_than_the_nominal_rate():
    """Under the null each sign pattern of the paired differences is equally likely: over all of them
    the test rejects at most 5% of the time, for integer rounds and for accuracies alike."""
    for magnitudes, kind in (([2, 1, 2, 2, 1, 1, 3, 2], MEAN), ([2, 1, 2, 2, 1, 1, 3, 2], RANK),
                             ([0.004, 0.012, 0.002, 0.02, 0.008, 0.006, 0.004], MEAN)):
        ps = [p_value(np.multiply(magnitudes, s), kind) for s in itertools.product([1, -1], repeat=len(magnitudes))]
        assert np.mean(np.array(ps) < 0.05) <= 0.05


# -- intervals of a difference: the tests inverted --------------------------------------------------

def test_too_few_seeds_give_the_whole_range_and_an_unbounded_metric_the_whole_line():
    """With 4 pairs no shift is rejected at 0.05 (the smallest p is 2/16): the interval is every value
    the metric allows, and for a metric without bounds the whole line (not a search that overflows)."""
    d = np.array([1.0, 2.0, 3.0, 4.0])
    assert interval(d, MEAN, 0.05) == (-math.inf, math.inf)
    assert interval(d, RANK, 0.05, bound=40.0) == (-40.0, 40.0)
    assert interval(d, MEAN, 0.2) != (-math.inf, math.inf)                  # 0.125 < 0.2: a test there


def test_an_interval_holds_0_exactly_when_its_test_accepts_0():
    rng = np.random.default_rng(7)
    cases = [rng.normal(rng.choice([0, 0.01, 0.03]), 0.01, rng.integers(2, 20)) for _ in range(40)]
    cases += [np.full(6, -5.0), np.array([-5.0] * 5 + [-6.0]), np.round(rng.normal(-1, 1.5, 12)), np.zeros(9),
              np.array([1.0] * 16 + [-32.0])]
    for d in cases:
        for kind in (MEAN, RANK):
            for level in (0.05, 0.01, 0.05 / 6):
                low, high = interval(d, kind, level, bound=100)
                assert low <= estimate(d, kind) <= high
                assert (low <= 0 <= high) == (p_value(d, kind) >= level), (d, kind, level)


def test_the_rank_interval_is_the_walsh_average_interval_of_the_exact_signed_rank_test():
    """Without ties the shifts the exact signed-rank test accepts run from the k-th smallest Walsh
    average to the k-th largest, k from its null distribution (Hollander & Wolfe, 3.3)."""
    d = np.array([1.8, -0.4, 2.9, 0.7, 3.6, 1.1, -1.3, 2.2, 0.3])
    n = len(d)
    i, j = np.triu_indices(n)
    walsh = np.sort((d[i] + d[j]) / 2)
    counts = np.zeros(n * (n + 1) // 2 + 1)            # the null distribution of W+ by enumeration
    for signs in itertools.product([0, 1], repeat=n):
        counts[sum(r for s, r in zip(signs, range(1, n + 1)) if s)] += 1
    cdf = np.cumsum(counts) / counts.sum()
    k = int(np.searchsorted(cdf, 0.025, side="right"))  # P(W+ <= k - 1) <= 0.025 < P(W+ <= k)
    low, high = interval(d, RANK, 0.05)
    assert (low, high) == pytest.approx((walsh[k - 1], walsh[-k]), abs=1e-9)   # k-th smallest, k-th largest
    assert estimate(d, RANK) == pytest.approx(np.median(walsh))


@pytest.mark.parametrize("d", [[4, -4, 10, 1, -3, -6, 1, 7, -1], [7, -3, 11, -4, 11, -4, 11, -5, 9, 3, 4, -4]])
def test_a_rank_interval_holds_every_accepted_shift_past_a_gap(d):
    """Integer differences with ties: the signed-rank test accepts shifts beyond a rejected one (a gap);
    the interval reaches the farthest accepted shift, the midpoints and Walsh averages all tried by hand."""
    d = np.asarray(d, float)
    low, high = interval(d, RANK, 0.05, 60)
    walsh = np.unique([(a + b) / 2 for k, a in enumerate(d) for b in d[k:]])
    shifts = np.unique(np.concatenate([walsh, (walsh[1:] + walsh[:-1]) / 2]))
    accepted = [x for x in shifts if p_value(d, RANK, x) >= 0.05]
    assert low <= min(accepted) and max(accepted) <= high                  # every accepted shift inside
    assert p_value(d, RANK, low - 0.01) < 0.05 and p_value(d, RANK, high + 0.01) < 0.05   # and no wider
    gaps = [x for x in shifts if low < x < high and p_value(d, RANK, x) < 0.05]
    assert gaps                                              # a gap it reached past


def test_intervals_stay_inside_what_a_difference_can_be():
    five = called([0.80, 0.82, 0.79, 0.81, 0.83], [0.91, 0.93, 0.90, 0.94, 0.92])
    assert (five["ci_low"], five["ci_high"]) == (-1.0, 1.0)   # 5 seeds: no shift is rejected at 0.05
    assert five["verdict"] == "inconclusive" and "5 seeds cannot reach the adjusted level 0.05" in five["note"]
    rounds = called([20, 30, 25, 28, 22], [30, 32, 31, 33, 29], ROUNDS)
    assert (rounds["ci_low"], rounds["ci_high"]) == (-60, 60)    # R + 1 - 1


# -- Holm ------------------------------------------------------------------------------------------

def test_holm_against_hand_computed_values():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, math.nan, 0.3]) == pytest.approx([0.6, math.nan, 0.6], nan_ok=True)
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])
    assert len(holm([])) == 0
    # levels: 0.005 < 0.05/4 called at 0.0125; 0.01 < 0.05/3 at 0.01667; 0.03 >= 0.05/2: stop, the rest at 0.025
    level, call = holm_levels([0.01, 0.04, 0.03, 0.005])
    assert level == pytest.approx([0.05 / 3, 0.025, 0.025, 0.0125]) and call.tolist() == [True, False, False, True]
    for p in np.random.default_rng(1).uniform(0, 0.1, (200, 6)):
        assert (holm(p) < 0.05).tolist() == holm_levels(p)[1].tolist()


def test_in_a_family_every_adjusted_interval_agrees_with_its_verdict():
    rng = np.random.default_rng(11)
    for _ in range(6):
        values = {("s", "fedavg"): seeds(REFERENCE)}
        for k, shift in enumerate(rng.choice([0.0, -0.005, -0.02, 0.03], 5)):
            values[("s", f"m{k}")] = seeds(np.add(REFERENCE, rng.normal(shift, 0.006, 8)))
        table = comparison_table(values, "fedavg", {"acc": ACCURACY})
        assert list(table.columns) == COLUMNS
        for _, r in table.iterrows():
            excludes = r["adj_ci_low"] > 0 or r["adj_ci_high"] < 0
            assert excludes == (r["verdict"] in ("better", "worse")) == (r["p_adjusted"] < 0.05)
            assert r["adj_ci_low"] <= r["ci_low"] <= r["difference"] <= r["ci_high"] <= r["adj_ci_high"]
            if r["verdict"] == "better":
                assert r["adj_ci_low"] > 0
            if r["verdict"] == "equivalent":
                assert -0.01 < r["adj_ci_low"] and r["adj_ci_high"] < 0.01


def test_fedprox_losing_eleven_points_is_no_longer_no_difference():
    """The held-out sweep's case: −0.115 [−0.208, −0.021] raw, Holm p 0.060 over two comparisons. The
    call is now `inconclusive`, with an adjusted interval that holds 0, never `no difference`."""
    ref = [0.93, 0.95, 0.92, 0.94]
    values = {("s", "fedavg"): seeds(ref), ("s", "fedprox"): seeds(np.subtract(ref, [0.05, 0.20, 0.09, 0.12])),
              ("s", "fedcm"): seeds(np.add(ref, [0.01, -0.01, 0.005, 0.0]))}
    table = comparison_table(values, "fedavg", {"acc": ACCURACY}).set_index("method")
    prox = table.loc["fedprox"]
    assert prox["verdict"] == "inconclusive" and prox["adj_ci_low"] < 0 < prox["adj_ci_high"]
    assert set(table["verdict"]) <= {"inconclusive"}


# -- verdicts --------------------------------------------------------------------------------------

def test_an_a_a_pair_reads_equivalent_and_with_too_few_seeds_inconclusive():
    """FedCM with α = 1 makes FedAvg's updates: the same accuracy and rounds on every seed."""
    row = called(REFERENCE, REFERENCE)
    assert row["verdict"] == "equivalent" and row["difference"] == 0 and (row["adj_ci_low"], row["adj_ci_high"]) == (0, 0)
    assert row["p_adjusted"] == 1 and "the same on every seed" in row["note"]
    rounds = called([30, 32, 28, 34, 30, 31, 29, 35], [30, 32, 28, 34, 30, 31, 29, 35], ROUNDS)
    assert rounds["verdict"] == "equivalent"
    few = called(REFERENCE[:5], REFERENCE[:5])
    assert few["verdict"] == "inconclusive" and few["power_mde"] == math.inf
    # the same arm with evaluation noise that averages out: inside ±0.01 at eight seeds
    noisy = called(np.add(REFERENCE, [0.002, -0.002, 0.001, -0.001, 0.0, 0.001, -0.001, 0.0]), REFERENCE)
    assert noisy["verdict"] == "equivalent" and noisy["adj_ci_low"] < 0 < noisy["adj_ci_high"]
    assert called(np.add(REFERENCE, [0.002, -0.002, 0.001, -0.001, 0.0, 0.001, -0.001, 0.0]), REFERENCE,
                  replace(ACCURACY, margin=0))["verdict"] == "inconclusive"


def test_a_clearly_worse_arm_reads_worse_and_its_mirror_better():
    worse = np.subtract(REFERENCE, [0.05, 0.06, 0.05, 0.04, 0.05, 0.05, 0.06, 0.04])
    row = called(worse, REFERENCE)
    assert row["verdict"] == "worse" and row["adj_ci_high"] < 0 and row["difference"] == pytest.approx(-0.05)
    assert row["p_adjusted"] == pytest.approx(2 / 256) and row["test"] == "sign-flip (exact)"
    assert called(REFERENCE, worse)["verdict"] == "better"
    slow, fast = [40, 45, 41, 44, 47, 43, 46, 42], [30, 32, 28, 34, 30, 31, 29, 35]
    assert called(slow, fast, ROUNDS)["verdict"] == "worse" and called(fast, slow, ROUNDS)["verdict"] == "better"


def test_constant_differences_are_called_without_jumps():
    """Every seed 5 rounds sooner, or one of them 6: the same p, the same call, at 5 seeds and at 8."""
    for n, want in ((5, "inconclusive"), (8, "better")):
        ref = list(range(40, 40 + 3 * n, 3))
        even, one_off = np.subtract(ref, 5), np.subtract(ref, [5] * (n - 1) + [6])
        a, b = called(even, ref, EVERY_ROUND), called(one_off, ref, EVERY_ROUND)
        assert a["verdict"] == b["verdict"] == want and a["p_adjusted"] == b["p_adjusted"] == 2 / 2 ** n
        for row in (a, b):
            assert row["difference"] == pytest.approx(-5, abs=0.5) and row["test"] == "signed-rank (exact)"
        acc_a, acc_b = (called(np.subtract(REFERENCE[:n], x), REFERENCE[:n]) for x in
                        (0.05, [0.05] * (n - 1) + [0.06]))
        assert acc_a["verdict"] == acc_b["verdict"] and acc_a["p_adjusted"] == acc_b["p_adjusted"]


def test_censored_rounds_are_ranked_and_their_direction_agrees_with_the_test():
    """15 of 16 seeds one round later, one 32 rounds sooner: the median difference said −32 and
    `better` beside a test that found it later; the Hodges–Lehmann estimate and its interval say +1."""
    ref = list(range(20, 36)) + [30]
    method = [x + 1 for x in ref[:16]] + [ref[16] - 32]
    row = called(method, ref, EVERY_ROUND)
    assert row["verdict"] == "worse" and row["difference"] == 1 and row["adj_ci_low"] > 0
    # a run that never got there (R = 60: it counts as 61) ranks last
    method = [20, math.nan, 24, 22, 21, 23, 20, 22]
    reference = [30, 32, 31, 33, 29, 35, 30, 31]
    row = called(method, reference, EVERY_ROUND)
    assert (row["censored_method"], row["censored_reference"]) == (1, 0) and row["verdict"] == "inconclusive"
    late = np.subtract([20, 61, 24, 22, 21, 23, 20, 22], reference)
    assert row["p_adjusted"] == pytest.approx(p_value(late, RANK)) and "the estimate counts them at R + 1" in row["note"]
    assert row["difference"] == pytest.approx(estimate(late, RANK))
    never = called([math.nan] * 8, reference, EVERY_ROUND)
    assert never["verdict"] == "worse" and never["censored_method"] == 8 and never["p_adjusted"] == pytest.approx(2 / 256)
    assert never["adj_ci_low"] > 0 and never["adj_ci_high"] == never["ci_high"] == 60   # open: it could be later still


def test_censored_pairs_never_make_an_equivalence_and_open_their_side():
    """Neither method reaching the target on any seed is no evidence of equal speed: `+0 [0, 0]` read
    `equivalent` before; now the interval is open on both sides (to ±R) and the call inconclusive. The
    reference at round 19 of R = 20 and the method never: `worse`, its interval [2, 20], not [2, 2]."""
    neither = called([math.nan] * 12, [math.nan] * 12, EVERY_ROUND)
    assert neither["verdict"] == "inconclusive" and neither["censored_reference"] == 12
    assert (neither["adj_ci_low"], neither["adj_ci_high"]) == (-60, 60) and "censored runs leave" in neither["note"]
    short = replace(EVERY_ROUND, horizon=20, high=20)
    late = called([math.nan] * 12, [19] * 12, short)
    assert late["verdict"] == "worse" and (late["adj_ci_low"], late["adj_ci_high"]) == (2, 20)
    # a censored reference opens the lower side: a method reaching sooner is `better` on the upper bound
    sooner = called([10] * 12, [math.nan] * 6 + [15] * 6, short)
    assert sooner["verdict"] == "better" and sooner["adj_ci_low"] == -20 and sooner["adj_ci_high"] < 0


def test_a_difference_inside_the_resolution_is_not_called_and_at_every_round_it_is():
    """Rounds to target are seen every eval.every rounds: 2 rounds fewer on every seed, evaluated
    every 5, is no finding; the same evaluated every round is; and 1 round fewer over 20 seeds too."""
    reference = [30, 35, 40, 30, 35, 40, 45, 30]
    faster = np.subtract(reference, 2)
    row = called(faster, reference, replace(ROUNDS, margin=0))
    assert row["verdict"] == "inconclusive" and "below resolution (±5" in row["note"] and row["adj_ci_high"] < 0
    assert called(faster, reference, EVERY_ROUND)["verdict"] == "better"
    twenty = list(range(30, 50))
    assert called(np.subtract(twenty, 1), twenty, EVERY_ROUND)["verdict"] == "better"


def test_power_is_at_the_strictest_holm_level_and_infinite_where_the_seeds_cannot_reach_it():
    d = np.array([0.01, -0.02, 0.015, 0.0, 0.005, -0.01, 0.02, 0.0])
    assert power_mde(d, MEAN, 0.05 / 6) == pytest.approx(unit_mde(8, 0.05 / 6, MEAN) * d.std(ddof=1))
    assert power_mde(d, RANK, 0.05 / 6) == pytest.approx(unit_mde(8, 0.05 / 6, RANK) * d.std(ddof=1))
    assert power_mde(d, MEAN, 0.05 / 100) == math.inf         # 2/256 > 0.0005
    assert power_mde(d[:5], MEAN, 0.05) == math.inf and math.isnan(power_mde(d[:1], MEAN, 0.05))
    row = called(np.add(REFERENCE, d), REFERENCE, replace(ACCURACY, margin=0))
    assert row["verdict"] == "inconclusive" and row["mde"] == row["power_mde"] == pytest.approx(
        unit_mde(8, 0.05, MEAN) * d.std(ddof=1))


@pytest.mark.parametrize("n, family, kind", [(8, 6, MEAN), (12, 16, MEAN), (12, 16, RANK), (18, 6, RANK)])
def test_the_power_line_holds_for_the_exact_tests(n, family, kind):
    """At the difference power_mde names, the exact test calls normal paired differences with that sd
    about 80% of the time (fresh samples, not the ones it was found on); the paired t formula it
    replaced named a difference called 63-73% of the time at n = 8-12 with 6-16 comparisons."""
    level = 0.05 / family
    rng = np.random.default_rng(2024)
    mde = power_mde(rng.standard_normal(n) * 3.0, kind, level)
    sd = mde / unit_mde(n, level, kind)
    called_share = np.mean([p_value(rng.standard_normal(n) * sd + mde, kind) < level for _ in range(300)])
    assert 0.72 <= called_share <= 0.9, called_share
    t_formula = (stats.t.ppf(1 - level / 2, n - 1) + stats.t.ppf(0.8, n - 1)) / math.sqrt(n)
    if n <= 12:
        assert mde / sd > 1.05 * t_formula * (math.sqrt(math.pi / 3) if kind == RANK else 1.0)


def test_pairs_only_the_seeds_both_ran():
    method = seeds([0.80, 0.81, 0.82, 0.83], first=0)      # seeds 0-3
    reference = seeds([0.90, 0.91, 0.92, 0.93], first=2)   # seeds 2-5
    row = compare(method, reference, ACCURACY)
    assert row["n_seeds"] == 2 and row["difference"] == pytest.approx(-0.08)   # seeds 2, 3: 0.82-0.90, 0.83-0.91


def test_one_paired_seed_is_not_tested():
    row = called([0.8], [0.9])
    assert row["verdict"] == "not tested" and row["test"] == "none" and math.isnan(row["p_adjusted"])
    assert math.isnan(row["ci_low"]) and "1 paired seed: no test" in row["note"]


def test_comparisons_that_cannot_be_tested_are_not_in_holms_family():
    """A method better on 8 of 8 seeds reads `better` alone and beside 7 one-seed comparisons (which can
    call nothing), with the same adjusted p."""
    better = [r + 0.05 for r in REFERENCE]
    alone = called(better, REFERENCE)
    values = {("all", "ref"): seeds(REFERENCE), ("all", "m"): seeds(better),
              **{("all", f"one{i}"): seeds([0.5]) for i in range(7)}}
    table = comparison_table(values, "ref", {"metric": ACCURACY}).set_index("method")
    assert alone["verdict"] == table.loc["m", "verdict"] == "better"
    assert table.loc["m", "p_adjusted"] == alone["p_adjusted"]
    assert (table.drop("m")["verdict"] == "not tested").all()


def test_a_setting_without_the_reference_is_not_compared():
    assert comparison_table({("x", "a"): seeds(REFERENCE)}, "fedavg", {"acc": ACCURACY}).empty


def test_a_lead_that_grows_with_the_setting_is_tested_not_read_from_two_estimates():
    """FedLGA 1 point ahead at rho 0.1 and 4 points at rho 0.9 on every seed: its lead grows; a method
    ahead by the same 2 points at both, give or take noise, is inconclusive, never `lead grows`."""
    from fedsweep.reports.interactions import interaction_table
    noise = np.array([0.004, -0.003, 0.002, -0.001, 0.003, -0.004, 0.001, -0.002])
    values = {}
    for rho, lead in (("rho=0.1", 0.01), ("rho=0.9", 0.04)):
        values[(rho, "fedavg")] = seeds(REFERENCE)
        values[(rho, "fedlga")] = seeds(np.add(REFERENCE, lead + noise))
        values[(rho, "fedcm")] = seeds(np.add(REFERENCE, 0.02 + (noise if rho == "rho=0.1" else noise[::-1])))
    table = interaction_table(values, "fedavg", {"acc": ACCURACY}).set_index("method")
    grows, flat = table.loc["fedlga"], table.loc["fedcm"]
    assert grows["verdict"] == "lead grows" and grows["change"] == pytest.approx(0.03) and grows["adj_ci_low"] > 0
    assert (grows["from"], grows["to"], grows["n_seeds"]) == ("rho=0.1", "rho=0.9", 8)
    assert flat["verdict"] == "inconclusive" and flat["adj_ci_low"] < 0 < flat["adj_ci_high"]
    assert table["p_adjusted"].tolist() == pytest.approx(holm([p_value(np.full(8, 0.03), MEAN),
                                                               p_value(noise[::-1] - noise, MEAN)]).tolist())
    # fewer rounds is a gain: a gap in rounds that widens at 0.9 is a lead that grows
    rounds = {("rho=0.1", "fedavg"): seeds([30] * 8, "rounds"), ("rho=0.1", "fedlga"): seeds([28] * 8, "rounds"),
              ("rho=0.9", "fedavg"): seeds([40] * 8, "rounds"), ("rho=0.9", "fedlga"): seeds([30] * 8, "rounds")}
    assert interaction_table(rounds, "fedavg", {"r": EVERY_ROUND}).iloc[0]["verdict"] == "lead grows"
    # neither reaching the target at 0.9 says nothing of the lead there: not `lead shrinks` from −2 to "0"
    never = {**rounds, ("rho=0.9", "fedavg"): seeds([math.nan] * 8, "rounds"),
             ("rho=0.9", "fedlga"): seeds([math.nan] * 8, "rounds")}
    row = interaction_table(never, "fedavg", {"r": EVERY_ROUND}).iloc[0]
    assert row["verdict"] == "inconclusive" and row["change"] == 2 and "censored runs" in row["note"]
    assert interaction_table({k: v for k, v in values.items() if k[0] == "rho=0.1"}, "fedavg", {"acc": ACCURACY}).empty


@pytest.mark.parametrize("n, sigma", [(8, 1.0), (12, 1.0), (8, 2.0)])
def test_the_power_line_holds_on_the_grid_of_whole_rounds(n, sigma):
    """Rounds to target differ by whole rounds (many zeros and ties at a small spread): at the
    difference power_mde names on that grid, the signed-rank test calls round(N(δ, σ)) differences
    about 80% of the time; the continuous value, smaller, is called less often (0.58 at n = 8, σ = 1:
    docs/results/power_grid.py)."""
    from fedsweep.reports.exact import grid_mde
    level = 0.05 / 4
    rng = np.random.default_rng(7)
    seeds = np.round(rng.normal(0, sigma, n))
    sd = float(np.std(seeds, ddof=1))
    step = float(f"{1.0 / sd:.2g}")
    assert power_mde(seeds, RANK, level, grid=1.0) == pytest.approx(grid_mde(n, level, RANK, step) * sd)
    assert grid_mde(n, level, RANK, step) > unit_mde(n, level, RANK)

    def share(delta):
        return np.mean([p_value(np.round(rng.normal(delta, sigma, n)), RANK) < level for _ in range(400)])
    sd = float(np.std(np.round(rng.normal(0, sigma, 100_000))))     # the spread the seeds are drawn with
    assert 0.75 <= share(grid_mde(n, level, RANK, float(f"{1.0 / sd:.2g}")) * sd) <= 0.92
    if n == 8 and sigma == 1.0:
        assert share(unit_mde(n, level, RANK) * sd) < 0.7
