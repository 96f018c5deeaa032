"""Apply the rule in sweeps/fedlga_safeguards.yaml's header to that sweep's MLflow runs.

    fedsweep tune sweeps/fedlga_safeguards.yaml          # the runs
    python docs/results/fedlga_safeguards.py [--json OUT] # the tables and the decision, in markdown

The rule (stated in the sweep file before the runs): a grid point is (dataset, partition, ρ, η_l); a
FedLGA variant is disqualified if any of its seeds diverges at a grid point where no seed of FedAvg
diverges. score(variant, cell) = the lowest, over η_l, of the mean over seeds of rounds to the target
(never = rounds + 1); a cell = (dataset, partition, ρ). The default is the qualified variant with the
lowest mean score over the cells; variants within 0.5 rounds tie, ties go to the simpler (SIMPLER).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from fedsweep.reports import load_trials
from fedsweep.sweep.spec import expand, load_sweep
from fedsweep.runs.tracking import resolve_tracking_uri

SWEEP = Path(__file__).resolve().parents[2] / "sweeps" / "fedlga_safeguards.yaml"
CELL = ["data.name", "data.partition.kind", "heterogeneity.rho"]
POINT = [*CELL, "local.lr"]
TIE = 0.5
# Simpler first: no Hessian term, then the paper's undamped term, then the parameter-free damping,
# then a constant to choose.
SIMPLER = ["fedlga extrapolation", "fedlga continuation λ=0", "fedlga continuation λ=step",
           "fedlga continuation λ=1"]


def variant(cfg) -> str:
    a = cfg.algorithm
    if a.name != "fedlga":
        return a.name
    if a.reading == "extrapolation":
        return "fedlga extrapolation"
    lam = a.damping if a.damping == "step" else f"{a.damping:g}"
    return f"fedlga {a.reading} λ={lam}"


def with_plan(trials: pd.DataFrame, plan: list) -> pd.DataFrame:
    """Each trial's variant and grid point, from its config (load_trials keeps only varying params)."""
    by_id = {t.config_id: t.config for t in plan}
    trials = trials[trials["config_id"].isin(by_id)].copy()
    trials["variant"] = [variant(by_id[c]) for c in trials["config_id"]]
    for key in POINT:
        trials[key] = [_dotted(by_id[c], key) for c in trials["config_id"]]
    return trials


def _dotted(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def disqualified(trials: pd.DataFrame) -> dict[str, list[str]]:
    """variant -> the grid points where a seed of it diverged and no seed of FedAvg did."""
    div = trials.assign(diverged=trials["status"] == "diverged").groupby(["variant", *POINT])["diverged"].any()
    fedavg_ok = ~div.xs("fedavg", level="variant")
    out: dict[str, list[str]] = {}
    for (v, *point), d in div.items():
        if v != "fedavg" and d and fedavg_ok.get(tuple(point), False):
            out.setdefault(v, []).append(" ".join(f"{k.split('.')[-1]}={p}" for k, p in zip(POINT, point)))
    return out


def scores(trials: pd.DataFrame, rounds: int) -> pd.DataFrame:
    """One row per (variant, cell): the best η_l by censored mean rounds to target."""
    df = trials.copy()
    hit = df["rounds_to_target"] if "rounds_to_target" in df else pd.Series(float("nan"), index=df.index)
    df["rounds"] = hit.where(df["status"] == "finished").fillna(rounds + 1)
    df["reached"] = df["rounds"] <= rounds
    per_lr = (df.groupby(["variant", *POINT]).agg(rounds=("rounds", "mean"), reached=("reached", "sum"),
                                                 seeds=("seed", "nunique")).reset_index())
    return per_lr.loc[per_lr.groupby(["variant", *CELL])["rounds"].idxmin()].reset_index(drop=True)


def table(best: pd.DataFrame, cells: list[tuple], order: list[str]) -> str:
    header = ["variant", *[f"{n} {k} ρ={rho:g}" for n, k, rho in cells], "mean"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for v in order:
        row, vals = [v], []
        for cell in cells:
            b = best[(best["variant"] == v) & (best[CELL].apply(tuple, axis=1) == cell)]
            r = b.iloc[0]
            vals.append(r["rounds"])
            miss = "" if r["reached"] == r["seeds"] else f" [{int(r['reached'])}/{int(r['seeds'])}]"
            row.append(f"{r['rounds']:.1f} (η_l {r['local.lr']:g}){miss}")
        row.append(f"{sum(vals) / len(vals):.2f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", nargs="?", default=str(SWEEP), help="the sweep file (default: fedlga_safeguards.yaml)")
    ap.add_argument("--json", help="also write the scores as JSON")
    args = ap.parse_args(argv)
    sweep = load_sweep(args.sweep)
    plan = expand(sweep, source=args.sweep)
    trials = load_trials(resolve_tracking_uri(sweep.mlflow.tracking_uri), sweep.mlflow.experiment or sweep.name,
                         sweep.name)
    trials = with_plan(trials, plan)
    rounds = int(sweep.base["rounds"])
    ended = int(trials["status"].isin(["finished", "diverged"]).sum())
    if ended < len(plan):
        print(f"**Incomplete: {ended} of {len(plan)} trials have ended; the rule needs all of them.**\n")
    best = scores(trials, rounds)
    out = {"disqualified": disqualified(trials), "datasets": {}}
    overall = best.groupby("variant")["rounds"].mean()
    for name in sorted(best["data.name"].unique()):
        part = best[best["data.name"] == name]
        cells = sorted({tuple(c) for c in part[CELL].itertuples(index=False)})
        means = part.groupby("variant")["rounds"].mean().sort_values()
        out["datasets"][name] = means.to_dict()
        print(f"### {name}\n\n{table(part, cells, list(means.index))}\n")
    print(f"Rounds to the target at each variant's best η_l per cell (η_g = 1), mean of the seeds; a seed "
          f"that never reached it in {rounds} rounds, or diverged, counts as {rounds + 1} ([k/n]: seeds that "
          "reached it).\n")
    for v, points in sorted(out["disqualified"].items()):
        print(f"- **{v} is disqualified**: it diverged where FedAvg did not, at {len(points)} grid point(s): "
              + "; ".join(points[:4]) + (" ..." if len(points) > 4 else ""))
    qualified = [v for v in SIMPLER if v in overall.index and v not in out["disqualified"]]
    print("\n| variant | mean over all cells |\n|---|---|")
    for v in overall.sort_values().index:
        print(f"| {v}{' (disqualified)' if v in out['disqualified'] else ''} | {overall[v]:.2f} |")
    if ended < len(plan):
        return 1
    if not qualified:
        print("\nNo FedLGA variant qualifies.")
        return 0
    low = min(overall[v] for v in qualified)
    winner = next(v for v in qualified if overall[v] <= low + TIE)
    out["winner"], out["overall"] = winner, overall.to_dict()
    mnist = out["datasets"].get("mnist_5k", {})
    beats = [v for v in qualified if mnist.get(v, 1e9) < mnist.get("fedavg", -1)]
    print(f"\nDefault by the rule: {winner} (mean score {overall[winner]:.2f}; ties within {TIE} rounds go to the "
          "simpler variant).")
    print("On mnist_5k: " + (f"{', '.join(beats)} beat{'s' if len(beats) == 1 else ''} FedAvg's mean score "
                             f"{mnist['fedavg']:.2f}." if beats else
                             f"no qualified FedLGA variant beats FedAvg (mean score {mnist.get('fedavg', float('nan')):.2f})."))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
