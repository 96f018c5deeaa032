"""How much larger the simulated power_mde is than the paired t formula reports used up to 2026-11-28.

    python docs/results/power_ratio.py        # ~30 s on 2 cores

For the confirm-seed counts and Holm levels the shipped sweeps use: the difference the exact test
calls with 80% power (fedsweep.reports.exact.unit_mde, in standard deviations of the paired
differences) over the paired t formula's, (t_{1-level/2, n-1} + t_{0.8, n-1}) / sqrt(n) (x sqrt(pi/3)
for the signed-rank test).
"""
import math

from scipy import stats

from fedsweep.reports.exact import MEAN, RANK, unit_mde

print("| test | seeds | level | t formula | simulated | ratio |\n|---|---|---|---|---|---|")
for kind in (MEAN, RANK):
    for n, level in [(8, 0.05 / 6), (8, 0.05 / 2), (12, 0.025 / 6), (12, 0.025 / 16), (18, 0.0125 / 16),
                     (24, 0.0125 / 16), (24, 0.0125 / 2)]:
        t = (stats.t.ppf(1 - level / 2, n - 1) + stats.t.ppf(0.8, n - 1)) / math.sqrt(n)
        t *= math.sqrt(math.pi / 3) if kind == RANK else 1.0
        u = unit_mde(n, level, kind)
        print(f"| {'sign-flip' if kind == MEAN else 'signed-rank'} | {n} | {level:.3g} | {t:.3f} | {u:.3f} | {u / t:.2f} |")
