"""Real power of the report's exact tests at the difference it states (`power_mde`), for rounds to a
target: paired differences on a grid of whole rounds, compared by the signed-rank test (zeros dropped).

For n seeds, a spread of σ rounds and Holm's strictest level with 4 comparisons (0.05 / 4), the stated
difference is computed as the report does from the differences' sd, once as if they were continuous
(`unit_mde`) and once on their grid (`grid_mde`); then 2,000 samples of n differences round(N(δ, σ))
at that δ are tested, and the share called is the real power (aimed at 0.80).

    python docs/results/power_grid.py        # about 1 minute on 2 cores
"""
from __future__ import annotations

import math

import numpy as np

from fedsweep.reports.exact import RANK, grid_mde, p_value, unit_mde

LEVEL = 0.05 / 4
SAMPLES = 2_000


def real_power(n: int, delta: float, sigma: float, rng) -> float:
    d = np.round(rng.normal(delta, sigma, size=(SAMPLES, n)))
    return float(np.mean([p_value(row, RANK) < LEVEL for row in d]))


def main() -> None:
    rng = np.random.default_rng(2026)
    print(f"{'n':>3} {'sigma':>5} | {'continuous: stated':>19} {'real power':>10} | {'on the grid: stated':>20} {'real power':>10}")
    for n in (8, 12, 16):
        for sigma in (1.0, 2.0, 4.0):
            sd = float(np.std(np.round(rng.normal(0, sigma, 200_000))))   # the differences' sd, as observed
            old = unit_mde(n, LEVEL, RANK) * sd
            new = grid_mde(n, LEVEL, RANK, float(f"{1.0 / sd:.2g}")) * sd
            print(f"{n:>3} {sigma:>5.1f} | {old:>19.2f} {real_power(n, old, sigma, rng):>10.2f} | "
                  f"{new:>20.2f} {real_power(n, new, sigma, rng):>10.2f}" if math.isfinite(new) else "")


if __name__ == "__main__":
    main()
