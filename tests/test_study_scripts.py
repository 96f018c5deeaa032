"""The studies' shared scoring (docs/results/confirmed.py) on confirm runs with known effects: the
interaction test says which way a lead moves, and says nothing where it does not."""
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "results"))
from confirmed import lead_change  # noqa: E402

CELL = ["partition", "rho"]


def cells(gap_at, seeds=14, noise=0.5):
    """Confirm rows of arms `a` and `fedavg` on 2 partitions x rho 0.1 / 0.9: `a` takes
    gap_at[rho] rounds more than FedAvg (negative: fewer), plus seeded noise."""
    rng = np.random.default_rng(0)
    rows = []
    for seed in range(10, 10 + seeds):
        for partition in ("classes", "dirichlet"):
            for rho in (0.1, 0.9):
                base = 15.0 + 3 * rho + rng.normal(0, 1)
                rows.append({"arm": "fedavg", "partition": partition, "rho": rho, "seed": seed, "rounds": base})
                rows.append({"arm": "a", "partition": partition, "rho": rho, "seed": seed,
                             "rounds": base + gap_at[rho] + rng.normal(0, noise)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("gap_at, verdict, change", [
    ({0.1: 0.0, 0.9: -4.0}, "lead grows", -4.0),     # a gains on FedAvg as rho grows
    ({0.1: -4.0, 0.9: 0.0}, "lead shrinks", 4.0),
    ({0.1: -2.0, 0.9: -2.0}, "inconclusive", 0.0),   # a lead that stays: no interaction to call
])
def test_lead_change_calls_the_direction_the_runs_have(gap_at, verdict, change):
    table = lead_change(cells(gap_at), CELL, "rho", ["a"], "fedavg", rounds=60)
    (row,) = table.to_dict(orient="records")
    assert row["verdict"] == verdict and row["method"] == "a" and row["reference"] == "fedavg"
    assert row["n_seeds"] == 14 and abs(row["change"] - change) < 0.5
    assert row["adj_ci_low"] <= row["change"] <= row["adj_ci_high"]
    assert (row["adj_ci_high"] < 0) == (verdict == "lead grows") and (row["adj_ci_low"] > 0) == (verdict == "lead shrinks")
