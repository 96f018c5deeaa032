"""Apply the rule in sweeps/fedlga_readings.yaml's header to that sweep's MLflow runs.

    fedsweep tune sweeps/fedlga_readings.yaml          # the runs
    python docs/results/fedlga_readings.py [--json OUT] # the table and the decision, in markdown
    python docs/results/fedlga_readings.py fedlga_epochs  # the same score on sweeps/fedlga_epochs.yaml

The rule (stated in the sweep file before the runs): score(variant, cell) = the lowest, over
(η_l, η_g), of the mean over seeds of rounds to the target, a seed that never reaches it counting as
rounds + 1; the default is the FedLGA variant with the lowest mean score over the cells, variants
within 0.5 rounds tie, ties go to the simpler variant (SIMPLER below).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from fedsweep.reports import load_trials
from fedsweep.sweep.spec import load_sweep
from fedsweep.runs.tracking import resolve_tracking_uri

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"
CELL = ["data.partition.kind", "heterogeneity.rho"]
VARIANT = ["algorithm.reading", "algorithm.grad_source", "algorithm.damping"]
TIE = 0.5
# Simpler first: fewer terms, then fewer uploads and passes, then no damping; continuation last.
READING_ORDER = {"extrapolation": 0, "projection": 1, "continuation": 2}
SOURCE_ORDER = {"mean": 0, "last": 1, "exact": 2}


def variant(row) -> str:
    if row["method"] != "fedlga":
        return row["method"]
    lam = "" if row["algorithm.reading"] == "extrapolation" else f", λ={row['algorithm.damping']:g}"
    return f"fedlga {row['algorithm.reading']} ({row['algorithm.grad_source']}{lam})"


def simplicity(row) -> tuple:
    return (READING_ORDER[row["algorithm.reading"]], SOURCE_ORDER[row["algorithm.grad_source"]],
            row["algorithm.damping"], row["algorithm.reading"] == "continuation")


def drop_noop_damping(trials: pd.DataFrame) -> tuple[pd.DataFrame, int, int]:
    """λ plays no part in extrapolation: keep its λ = 0 trials, and count how many λ = 1 twins agree."""
    extra = (trials["method"] == "fedlga") & (trials["algorithm.reading"] == "extrapolation")
    twins = trials[extra & (trials["algorithm.damping"] != 0)]
    keys = ["algorithm.grad_source", *CELL, "local.lr", "server.lr", "seed"]
    both = twins.merge(trials[extra & (trials["algorithm.damping"] == 0)], on=keys, suffixes=("", "_0"))
    same = int(((both["rounds_to_target"] == both["rounds_to_target_0"])
                | (both["rounds_to_target"].isna() & both["rounds_to_target_0"].isna())).sum())
    return trials[~(extra & (trials["algorithm.damping"] != 0))], same, len(both)


def scores(trials: pd.DataFrame, rounds: int) -> pd.DataFrame:
    """One row per (variant, cell): the best (η_l, η_g) by censored mean rounds to target."""
    df = trials.copy()
    df["rounds"] = df["rounds_to_target"].where(df["status"].isin(["finished", "diverged"])).fillna(rounds + 1)
    df.loc[df["status"] == "diverged", "rounds"] = rounds + 1
    df["reached"] = df["rounds"] <= rounds
    df["variant"] = df.apply(variant, axis=1)
    cell = CELL
    per_lr = (df.groupby(["variant", *cell, "local.lr", "server.lr"])
                .agg(rounds=("rounds", "mean"), reached=("reached", "sum"), seeds=("seed", "nunique"))
                .reset_index())
    best = per_lr.loc[per_lr.groupby(["variant", *cell])["rounds"].idxmin()]
    return best.reset_index(drop=True)


def decide(best: pd.DataFrame, trials: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    overall = best.groupby("variant")["rounds"].mean().rename("mean score").to_frame()
    fedlga = trials[trials["method"] == "fedlga"].drop_duplicates(VARIANT).copy()
    fedlga["variant"] = fedlga.apply(variant, axis=1)
    fedlga = fedlga.drop_duplicates("variant").set_index("variant")
    cand = overall.loc[overall.index.isin(fedlga.index)].copy()
    low = cand["mean score"].min()
    tied = cand[cand["mean score"] <= low + TIE].index
    winner = min(tied, key=lambda v: simplicity(fedlga.loc[v]))
    return overall.sort_values("mean score"), winner


def markdown(best: pd.DataFrame, overall: pd.DataFrame, rounds: int) -> str:
    cells = sorted({(r["data.partition.kind"], r["heterogeneity.rho"]) for _, r in best.iterrows()})
    header = ["variant", *[f"{k} ρ={rho:g}" for k, rho in cells], "mean score"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for v in overall.index:
        row = [v]
        for k, rho in cells:
            b = best[(best["variant"] == v) & (best["data.partition.kind"] == k) & (best["heterogeneity.rho"] == rho)]
            if b.empty:
                row.append("—")
                continue
            r = b.iloc[0]
            miss = "" if r["reached"] == r["seeds"] else f" [{int(r['reached'])}/{int(r['seeds'])}]"
            row.append(f"{r['rounds']:.1f}{miss}")
        row.append(f"{overall.loc[v, 'mean score']:.2f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + (f"\n\nRounds to 0.8 test accuracy at each variant's best (η_l, η_g) per cell, mean of "
                              f"the seeds; a seed that never reached it in {rounds} rounds counts as {rounds + 1} "
                              "([k/n]: seeds that reached it).")


def fill_constant_columns(trials: pd.DataFrame, plan: list) -> pd.DataFrame:
    """load_trials keeps only the params that vary; take the constant ones from the trials' configs."""
    by_id = {t.config_id: t.config for t in plan}
    for key in [*CELL, *VARIANT]:
        if key not in trials:
            trials[key] = [_dotted(by_id[c], key) for c in trials["config_id"]]
    return trials


def _dotted(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part, None)
    return cfg


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", nargs="?", default="fedlga_readings", help="a sweep file in sweeps/ (default fedlga_readings)")
    ap.add_argument("--json", help="also write the scores as JSON")
    args = ap.parse_args(argv)
    path = SWEEPS / f"{args.sweep}.yaml"
    sweep = load_sweep(path)
    uri = resolve_tracking_uri(sweep.mlflow.tracking_uri)
    trials = load_trials(uri, sweep.mlflow.experiment or sweep.name, sweep.name)
    rounds = int(sweep.base["rounds"])
    scored = trials["status"].isin(["finished", "diverged"]).sum()
    from fedsweep.sweep.spec import expand
    plan = expand(sweep, source=str(path))
    expected = len(plan)
    trials = fill_constant_columns(trials, plan)
    if scored < expected:
        print(f"**Incomplete: {scored} of {expected} trials have ended; the rule needs all of them.**\n")
    trials, same, pairs = drop_noop_damping(trials)
    best = scores(trials, rounds)
    overall, winner = decide(best, trials)
    print(markdown(best, overall, rounds))
    if scored < expected:
        return 1
    print(f"\nDeterminism check: extrapolation with λ = 1 (a no-op) gave the same rounds to target as λ = 0 in "
          f"{same} of {pairs} trial pairs.")
    print(f"\nDefault by the rule: {winner} (mean score {overall.loc[winner, 'mean score']:.2f}; "
          f"ties within {TIE} rounds go to the simpler variant).")
    if args.json:
        Path(args.json).write_text(json.dumps({"winner": winner, "overall": overall["mean score"].to_dict(),
                                               "cells": best.to_dict(orient="records")}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
