"""Power and error of the confirm stage's designs: seeds added until answered (looks after 8, 12 and
16 seeds, `confirm: {seeds: 8 of them, step: 4, max_seeds: 16}`) against a fixed 16 seeds, for m
comparisons tested together (Holm over them), each a paired difference of normal seeds N(δ, 1).

Designs, each deciding as comparisons.csv does (a call is p < the look's Holm level, which is where the
adjusted interval leaves out 0; tests/test_sequential.py checks that the two agree):
- fixed 16 seeds: one look at α = 0.05;
- union bound: each look at its share of α, α·(n_k − n_{k−1})/16, on its own p (fedsweep up to
  2026-12-01);
- exact boundary, ρ = 1: the same shares, each look's p counted on the sign patterns no earlier look
  rejected (fedsweep.reports.sequential, equation 1);
- exact boundary, ρ = 3: shares α·(t_k³ − t_{k−1}³), t_k = n_k/16 (close to O'Brien–Fleming: little
  spent early).

The rule for the default spending, written before the runs: keep ρ = 1 unless ρ = 3's power at
δ = 1.0, averaged over m = 4, 8, 16, is higher by more than two standard errors while its mean seeds per
comparison at δ = 1.0 stay at most 14 of 16 (a design that saves fewer than two seeds is no reason to
look early).

    python docs/results/sequential_power.py        # 15 minutes on 2 cores
"""
from __future__ import annotations

import functools
import time

import numpy as np

from fedsweep.reports.exact import ALPHA, MEAN, p_value, spent
from fedsweep.reports.sequential import holm_sequential, sequential_p

LOOKS = [8, 12, 16]
REPLICATES = 300


def cubic(looks):
    t = [n / looks[-1] for n in looks]
    return [ALPHA * (b ** 3 - a ** 3) for a, b in zip([0.0, *t[:-1]], t)]


def confirm(D: np.ndarray, looks, shares, exact: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(called better, called either way, seeds used) per comparison (a row of D) of a sequential
    confirm stage."""
    m = len(D)
    called, rejected, used = np.zeros(m, bool), np.zeros(m, bool), np.full(m, looks[-1])
    pending, before, history = list(range(m)), 0, {i: [] for i in range(m)}
    for k, n in enumerate(looks):
        p_at = []
        for i in pending:
            d, sizes, earlier = D[i, :n], [s for s, _ in history[i]] + [n], [a for _, a in history[i]]
            if exact and history[i]:
                p_at.append(functools.lru_cache(None)(
                    lambda h, d=d, sizes=sizes, earlier=earlier: sequential_p(d, MEAN, sizes, [a / h for a in earlier])))
            else:
                p_at.append(lambda h, d=d: p_value(d, MEAN))
        levels, ps = holm_sequential(p_at, shares[k], m, before)
        still = []
        for i, level, p in zip(pending, levels, ps):
            if p < level:
                called[i], rejected[i], used[i], before = D[i, :n].mean() > 0, True, n, before + 1
            else:
                history[i].append((n, shares[k]))
                still.append(i)
        pending = still
    return called, rejected, used


def main() -> None:
    designs = {"fixed 16 seeds": ([16], [ALPHA], False), "union bound, ρ = 1": (LOOKS, spent(LOOKS), False),
               "exact boundary, ρ = 1": (LOOKS, spent(LOOKS), True), "exact boundary, ρ = 3": (LOOKS, cubic(LOOKS), True)}
    print("| δ (sd) | m | design | power (s.e.) | mean seeds | any call (null: FWER) |\n|---|---|---|---|---|---|")
    start = time.time()
    for delta in (1.0, 0.0):
        for m in (4, 8, 16):
            rng = np.random.default_rng(1000 * m + int(10 * delta))
            data = [rng.normal(delta, 1.0, size=(m, 16)) for _ in range(REPLICATES)]
            for name, (looks, shares, exact) in designs.items():
                out = [confirm(D, looks, shares, exact) for D in data]
                calls = np.array([c.mean() for c, _, _ in out])
                seeds = np.mean([u.mean() for _, _, u in out])
                anything = np.mean([r.any() for _, r, _ in out])
                power = calls.mean()
                se = calls.std(ddof=1) / np.sqrt(len(calls))
                print(f"| {delta:.1f} | {m} | {name} | {power:.3f} ({se:.3f}) | {seeds:.1f} | {anything:.3f} |", flush=True)
    print(f"\n{REPLICATES} replicates per row; {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
