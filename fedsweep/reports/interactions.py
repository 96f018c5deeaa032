"""Does a method's lead over the reference change with a setting? (interactions.csv, report.md's "Does the
lead change with <key>?"): per seed, the change of the paired difference between the setting's first
and last value, tested as :mod:`fedsweep.reports.stats` tests a comparison, Holm over its own rows."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from fedsweep.reports.exact import ALPHA, holm, holm_levels, interval
from fedsweep.reports.stats import Metric, _tested, _worst_p, differences_by_seed, extremes


INTERACTION_COLUMNS = ["metric", "method", "reference", "from", "to", "n_seeds", "change", "ci_low", "ci_high",
                       "adj_ci_low", "adj_ci_high", "p_adjusted", "verdict", "test", "note"]


def interaction_table(values: dict[tuple[str, str], pd.DataFrame], reference: str | None,
                      metrics: dict[str, Metric]) -> pd.DataFrame:
    """Whether each method's lead over ``reference`` changes between the first and the last value of
    the setting (interactions.csv): per seed both runs of both arms, the change of the paired
    difference, (method − reference at the last value) − (the same at the first), tested as the
    metric's differences are (sign-flip on the mean; signed-rank and Hodges–Lehmann on rounds, a
    censored run at R + 1 in the estimate, its interval and p holding every value censored runs could
    take, as :func:`compare`'s) on the seeds all four runs share; Holm over these rows, a family of their
    own. ``lead grows``: the adjusted interval lies on the side where the method gains (more accuracy,
    fewer rounds) at the last value; ``lead shrinks``: the other side; else ``inconclusive``."""
    settings = list(dict.fromkeys(s for s, _ in values))
    rows = []
    if reference is None or len(settings) < 2:
        return pd.DataFrame(columns=INTERACTION_COLUMNS)
    first, last = settings[0], settings[-1]
    methods = [m for s, m in values if s == first and m != reference and (last, m) in values]
    for name, metric in metrics.items():
        for method in methods:
            arms = [values.get((where, who)) for where in (first, last) for who in (method, reference)]
            if any(a is None for a in arms):
                continue
            (lead_first, first_low, first_high), (lead_last, last_low, last_high) = (
                _leads(arms[0], arms[1], metric), _leads(arms[2], arms[3], metric))
            both = lead_first.index.intersection(lead_last.index)
            change = (lead_last[both] - lead_first[both]).to_numpy(float)
            low = (last_low[both] - first_high[both]).to_numpy(float)     # the change's extremes
            high = (last_high[both] - first_low[both]).to_numpy(float)
            tested = _tested(change, metric.kind, 2 * metric.span, "shared seed")
            if len(change) >= 2 and not (np.array_equal(low, change) and np.array_equal(high, change)):
                tested["ci_low"] = interval(low, metric.kind, ALPHA, 2 * metric.span)[0]
                tested["ci_high"] = interval(high, metric.kind, ALPHA, 2 * metric.span)[1]
                tested["p"] = _worst_p(low, high, metric.kind)
                tested["note"] = "censored runs: the interval and p hold every value they could take"
            rows.append({"metric": name, "method": method, "reference": reference, "from": first, "to": last,
                         "n_seeds": len(change), "d": change, "d_low": low, "d_high": high,
                         "change": tested.pop("difference"), **tested})
    table = pd.DataFrame(rows, columns=[*INTERACTION_COLUMNS, "p", "d"])
    if table.empty:
        return table[INTERACTION_COLUMNS]
    table["p_adjusted"] = holm(table["p"])
    levels, _ = holm_levels(table["p"])
    verdicts, lows, highs = [], [], []
    for row, level in zip(rows, levels):
        metric = metrics[row["metric"]]
        if math.isnan(level):
            verdicts.append("not tested"), lows.append(math.nan), highs.append(math.nan)
            continue
        low = interval(row["d_low"], metric.kind, level, 2 * metric.span)[0]
        high = interval(row["d_high"], metric.kind, level, 2 * metric.span)[1]
        gains = (low > 0) if metric.higher_is_better else (high < 0)
        loses = (high < 0) if metric.higher_is_better else (low > 0)
        verdicts.append("lead grows" if gains else "lead shrinks" if loses else "inconclusive")
        lows.append(low), highs.append(high)
    table["verdict"], table["adj_ci_low"], table["adj_ci_high"] = verdicts, lows, highs
    return table[INTERACTION_COLUMNS]


def _leads(method_values: pd.DataFrame, reference_values: pd.DataFrame, metric: Metric) -> tuple[pd.Series, ...]:
    """(paired differences, their lowest, their highest the censored runs allow), each indexed by seed."""
    d, *_ = differences_by_seed(method_values, reference_values, metric)
    low, high = extremes(method_values, reference_values, metric, d.to_numpy(float))
    return d, pd.Series(low, index=d.index), pd.Series(high, index=d.index)
