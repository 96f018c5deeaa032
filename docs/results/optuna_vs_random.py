"""Does Optuna's TPE find better configs than random draws at the same budget? The rule of
sweeps/baselines_optuna.yaml, from the two sweeps' reports:

    fedsweep tune sweeps/baselines_search.yaml && fedsweep report sweeps/baselines_search.yaml
    fedsweep tune sweeps/baselines_optuna.yaml && fedsweep report sweeps/baselines_optuna.yaml
    python docs/results/optuna_vs_random.py reports     # the folder holding reports/<sweep>/trials.csv

Per confirm seed that every one of the 18 selected configs ran (each method's under random and under
TPE), the mean over the nine methods of (random's rounds to the target - TPE's; a run that never
reached it counts R + 1); the exact sign-flip test of those values (fedsweep.reports.exact) and its
95% interval, and each method's own mean difference over the same seeds.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from fedsweep.reports.exact import MEAN, interval, p_value


def confirm_rounds(folder: Path, sweep: str) -> pd.DataFrame:
    """(seed x method) rounds to the target of each method's confirm runs; never reached: rounds + 1."""
    trials = pd.read_csv(folder / sweep / "trials.csv")
    confirm = trials[(trials["stage"] == "confirm") & (trials["status"] == "finished")]
    rounds = confirm["summary/rounds_to_target"].fillna(confirm["summary/rounds"] + 1)
    return confirm.assign(r=rounds).pivot_table(index="seed", columns="method", values="r")


def main(folder: str = "reports") -> None:
    random = confirm_rounds(Path(folder), "baselines_search")
    tpe = confirm_rounds(Path(folder), "baselines_optuna")
    seeds = random.dropna().index.intersection(tpe.dropna().index)
    methods = sorted(set(random.columns) & set(tpe.columns))
    diff = random.loc[seeds, methods] - tpe.loc[seeds, methods]
    per_seed = diff.mean(axis=1).to_numpy()
    p = p_value(per_seed, MEAN)
    low, high = interval(per_seed, MEAN, 0.05)
    call = ("TPE helps" if p < 0.05 and per_seed.mean() > 0 else "TPE hurts" if p < 0.05
            else "no difference shown at this budget")
    print(f"{len(seeds)} confirm seeds every selected config ran ({', '.join(map(str, seeds))}), {len(methods)} methods")
    print(f"mean over methods of (random - TPE) rounds: {per_seed.mean():+.2f} [{low:+.2f}, {high:+.2f}], "
          f"exact sign-flip p = {p:.3g}: {call}")
    print("\n| method | random | TPE | random − TPE |\n|---|---|---|---|")
    for m in methods:
        print(f"| {m} | {random.loc[seeds, m].mean():.1f} | {tpe.loc[seeds, m].mean():.1f} | {diff[m].mean():+.1f} |")


if __name__ == "__main__":
    main(*sys.argv[1:])
