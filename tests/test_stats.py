"""fedsweep report's statistics (fedsweep/reports/stats.py) on fixed per-seed numbers: intervals as
scipy makes them, Holm by hand, verdicts paired by seed, censored rounds, the evaluation cadence."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fedsweep.reports.stats import (COLUMNS, PAIRED_T, RANK_TEST, Metric, compare, comparison_table, holm, mean_ci,
                                   mean_ci_rows, verdict)

ACCURACY = Metric("acc", higher_is_better=True)
ROUNDS = Metric("rounds", higher_is_better=False, resolution=5, censored=True, horizon=60)


def seeds(values, column: str = "acc", first: int = 0) -> pd.DataFrame:
    """A per-seed frame as the report hands it over: ``seed`` and the metric's column."""
    return pd.DataFrame({"seed": range(first, first + len(values)), column: values})


def called(method, reference, metric=ACCURACY) -> dict:
    """One comparison with its verdict, alone in its report (Holm over one p leaves it as it is)."""
    table = comparison_table({("all", "m"): method, ("all", "ref"): reference}, "ref", {"metric": metric})
    assert len(table) == 1
    return table.iloc[0].to_dict()


def test_mean_ci_is_scipys_t_interval():
    x = [0.91, 0.93, 0.90, 0.94, 0.92]
    got = mean_ci(x)
    low, high = stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=stats.sem(x))
    assert (got.mean, got.low, got.high, got.n) == pytest.approx((0.92, low, high, 5))
    assert (got.low, got.high) == pytest.approx((0.900368, 0.939632), abs=1e-6)   # 0.92 ± 2.776 · 0.0158 / √5
    assert mean_ci([0.9, 0.8], confidence=0.5).high == pytest.approx(0.9)        # t(0.75, 1) = 1: mean ± sem
    one = mean_ci([0.87, math.nan])                                              # NaN is no seed
    assert one.mean == 0.87 and one.n == 1 and math.isnan(one.low) and math.isnan(one.high)
    assert mean_ci([0.5, 0.5, 0.5])[:3] == (0.5, 0.5, 0.5)                       # equal seeds: a point


def test_curve_bands_are_the_same_intervals_per_round():
    frame = pd.DataFrame({"s0": [0.1, 0.2, 0.3, 0.4], "s1": [0.2, 0.2, 0.5, math.nan],
                          "s2": [0.3, 0.2, math.nan, math.nan]})
    mean, low, high = mean_ci_rows(frame)
    for i, row in enumerate(frame.to_numpy()):
        want = mean_ci(row)
        assert mean[i] == pytest.approx(want.mean)
        assert [low[i], high[i]] == pytest.approx([want.low, want.high], nan_ok=True)
    assert math.isnan(low[3]) and (low[1], high[1]) == pytest.approx((0.2, 0.2))


def test_holm_against_hand_computed_values():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # a comparison without a test stays NaN and is not counted: m = 2
    assert holm([0.5, math.nan, 0.3]) == pytest.approx([0.6, math.nan, 0.6], nan_ok=True)
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])                          # capped at 1
    assert len(holm([])) == 0


def test_an_a_a_pair_reads_no_difference_with_a_ci_holding_0():
    """FedCM with α = 1 makes FedAvg's updates: the same accuracy and rounds on every seed."""
    acc = [0.912, 0.905, 0.921, 0.899, 0.915]
    row = called(seeds(acc), seeds(acc))
    assert row["verdict"] == "no difference" and row["difference"] == 0 and row["test"] == "identical"
    assert row["ci_low"] <= 0 <= row["ci_high"] and row["p_adjusted"] == 1
    rounds = called(seeds([30, 32, 28, 34, 30], "rounds"), seeds([30, 32, 28, 34, 30], "rounds"), ROUNDS)
    assert rounds["verdict"] == "no difference" and rounds["ci_low"] <= 0 <= rounds["ci_high"]
    # the same arm again with evaluation noise that averages out: tested, not called, its mde said
    noisy = called(seeds(np.add(acc, [0.002, -0.002, 0.001, -0.001, 0.0])), seeds(acc))
    assert noisy["test"] == PAIRED_T and noisy["verdict"] == "no difference"
    assert noisy["ci_low"] < 0 < noisy["ci_high"] and noisy["mde"] > 0


def test_a_clearly_worse_arm_reads_worse_and_its_mirror_better():
    reference = [0.91, 0.93, 0.90, 0.94, 0.92]
    worse = np.subtract(reference, [0.05, 0.06, 0.05, 0.04, 0.05])
    row = called(seeds(worse), seeds(reference))
    assert row["verdict"] == "worse" and row["test"] == PAIRED_T and row["ci_high"] < 0
    assert row["difference"] == pytest.approx(-0.05) and math.isnan(row["mde"])   # mde only for no difference
    result = stats.ttest_rel(worse, reference)
    assert row["p_adjusted"] == pytest.approx(result.pvalue)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx(tuple(result.confidence_interval(0.95)))
    assert called(seeds(reference), seeds(worse))["verdict"] == "better"
    # fewer rounds is better, more is worse
    slow, fast = seeds([40, 45, 41, 44, 47], "rounds"), seeds([30, 32, 28, 34, 30], "rounds")
    assert called(slow, fast, ROUNDS)["verdict"] == "worse" and called(fast, slow, ROUNDS)["verdict"] == "better"


def test_no_difference_reports_the_smallest_detectable_difference():
    method, reference = [0.90, 0.93, 0.91, 0.92], [0.91, 0.91, 0.92, 0.90]
    row = called(seeds(method), seeds(reference))
    d = np.subtract(method, reference)
    mde = (stats.t.ppf(0.975, 3) + stats.t.ppf(0.8, 3)) * d.std(ddof=1) / 2     # (3.182 + 0.978) · sd / √4
    assert row["verdict"] == "no difference" and row["mde"] == pytest.approx(mde)
    assert row["mde"] == pytest.approx(4.1609 * 0.017321 / 2, rel=1e-3)         # d = ±0.015 about 0.005


def test_pairs_only_the_seeds_both_ran():
    method = seeds([0.80, 0.81, 0.82, 0.83], first=0)      # seeds 0-3
    reference = seeds([0.90, 0.91, 0.92, 0.93], first=2)   # seeds 2-5
    row = compare(method, reference, ACCURACY)
    assert row["n_seeds"] == 2 and row["difference"] == pytest.approx(-0.08)   # seeds 2, 3: 0.82-0.90, 0.83-0.91


def test_one_paired_seed_is_not_tested():
    row = called(seeds([0.8]), seeds([0.9]))
    assert row["verdict"] == "not tested" and row["test"] == "none" and math.isnan(row["p_adjusted"])
    assert math.isnan(row["ci_low"]) and "1 paired seed: no test" in row["note"]


def test_censored_rounds_are_ranked_never_averaged():
    method = [20, math.nan, 24, 22, 21, 23]          # one run never reached the target in R = 60 rounds
    reference = [30, 32, 31, 33, 29, 35]
    row = compare(seeds(method, "rounds"), seeds(reference, "rounds"), ROUNDS)
    assert row["test"] == RANK_TEST and (row["censored_method"], row["censored_reference"]) == (1, 0)
    # the difference of the medians, the censored run counted as later than every other: 22.5 - 31.5;
    # averaging it in as R + 1 = 61 would give 28.5 - 31.67
    assert row["difference"] == pytest.approx(-9.0)
    late = [20, 61, 24, 22, 21, 23]
    assert row["p"] == pytest.approx(stats.wilcoxon(late, reference).pvalue)
    assert row["ci_low"] <= -9 <= row["ci_high"]
    # a method that never gets there is worse, and its median is a bound
    never = called(seeds([math.nan] * 6, "rounds"), seeds(reference, "rounds"), ROUNDS)
    assert never["verdict"] == "worse" and never["censored_method"] == 6
    assert never["difference"] == pytest.approx(61 - 31.5) and "a median is censored" in never["note"]
    assert never["p_adjusted"] == pytest.approx(2 / 2 ** 6)    # all six pairs on one side, exactly
    neither = called(seeds([math.nan] * 6, "rounds"), seeds([math.nan] * 6, "rounds"), ROUNDS)
    assert neither["verdict"] == "no difference" and neither["censored_reference"] == 6
    few = called(seeds([math.nan] * 3, "rounds"), seeds(reference[:3], "rounds"), ROUNDS)
    assert few["verdict"] == "no difference" and "the rank test's smallest p is 0.25" in few["note"]


def test_a_difference_inside_the_resolution_is_not_called():
    """Rounds to target are seen every eval.every rounds: 2 rounds fewer on every seed, evaluated
    every 5, is no finding; the same at every round is."""
    reference = [30, 35, 40, 30, 35, 40, 45, 30]
    faster = seeds(np.subtract(reference, 2), "rounds")
    row = called(faster, seeds(reference, "rounds"), ROUNDS)
    assert row["verdict"] == "no difference" and "below resolution (±5)" in row["note"]
    assert (row["ci_low"], row["ci_high"]) == (-2, -2) and row["p_adjusted"] < 0.05
    every_round = Metric("rounds", higher_is_better=False, resolution=1, censored=True, horizon=60)
    assert called(faster, seeds(reference, "rounds"), every_round)["verdict"] == "better"
    noisy = called(seeds(np.subtract(reference, [1, 2, 1.5, 1, 2, 1.5, 1, 2]), "rounds"),
                   seeds(reference, "rounds"), ROUNDS)
    assert noisy["test"] == PAIRED_T and noisy["verdict"] == "no difference" and "below resolution" in noisy["note"]


def test_equal_differences_over_two_seeds_are_no_finding():
    """Every seed 5 rounds slower, from two seeds: the t-test would say p = 0 (no variance); the rank
    test says what two seeds can: p = 0.5."""
    row = called(seeds([35, 45], "rounds"), seeds([30, 40], "rounds"), replace(ROUNDS, resolution=1))
    assert row["test"] == RANK_TEST and row["p_adjusted"] == pytest.approx(0.5)
    assert row["verdict"] == "no difference" and "every paired difference is +5" in row["note"]


def test_holm_runs_over_every_comparison_of_the_report():
    reference = [0.91, 0.93, 0.90, 0.94, 0.92]
    values = {("rho=0.1", "fedavg"): seeds(reference),
              ("rho=0.1", "a"): seeds(np.subtract(reference, [0.05, 0.06, 0.05, 0.04, 0.05])),
              ("rho=0.1", "b"): seeds(np.add(reference, [0.01, -0.02, 0.02, 0.0, 0.01])),
              ("rho=0.5", "fedavg"): seeds(reference),
              ("rho=0.5", "a"): seeds(np.subtract(reference, [0.02, 0.01, 0.03, 0.0, 0.02]))}
    table = comparison_table(values, "fedavg", {"acc": ACCURACY})
    assert list(table.columns) == COLUMNS
    assert list(zip(table["setting"], table["method"])) == [("rho=0.1", "a"), ("rho=0.1", "b"), ("rho=0.5", "a")]
    raw = [compare(values[k], values[(k[0], "fedavg")], ACCURACY)["p"] for k in
           [("rho=0.1", "a"), ("rho=0.1", "b"), ("rho=0.5", "a")]]
    assert table["p_adjusted"].tolist() == pytest.approx(holm(raw).tolist())
    assert (table["p_adjusted"] >= raw).all() and (table["reference"] == "fedavg").all()
    # a setting without the reference is not compared
    assert comparison_table({("x", "a"): seeds(reference)}, "fedavg", {"acc": ACCURACY}).empty


def test_verdict_direction_follows_the_metric():
    row = {"difference": -3.0, "ci_low": -4.0, "ci_high": -2.0, "note": ""}
    assert verdict(row, 0.01, Metric("rounds", higher_is_better=False)) == ("better", "")
    assert verdict(row, 0.01, Metric("acc", higher_is_better=True)) == ("worse", "")
    assert verdict(row, 0.2, Metric("acc", higher_is_better=True)) == ("no difference", "")
    assert verdict(row, math.nan, ACCURACY)[0] == "not tested"
