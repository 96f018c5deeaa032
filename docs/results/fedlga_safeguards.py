"""Apply the rule in sweeps/fedlga_safeguards.yaml's header to that sweep's MLflow runs.

    fedsweep tune sweeps/fedlga_safeguards.yaml          # the runs (tuning, then confirm seeds)
    python docs/results/fedlga_safeguards.py [--json OUT] # the tables and the decision, in markdown

The rule (stated in the sweep file before the runs): a grid point is (dataset, partition, ρ, η_l); a
FedLGA variant is disqualified if any of its tuning seeds diverges at a grid point where no tuning
seed of FedAvg diverges. Each arm's η_l per cell (dataset, partition, ρ) is selected on validation by
`fedsweep tune`, and rerun on the confirm seeds; score(arm, confirm seed) = the mean over the 12 cells
of its rounds to the target (never or diverged = R + 1). D = the qualified variant with the lowest
mean score; each simpler qualified variant (SIMPLER) is compared with D paired by seed (Holm over
those); the default is the simplest one not `worse` than D. Each qualified variant is compared with
FedAvg on each dataset's cells too (Holm over those, `equivalent` inside ±0.5 rounds).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from confirmed import cell_table, compare_arms, comparisons_markdown, scored_study, seed_scores  # noqa: E402

SWEEP = Path(__file__).resolve().parents[2] / "sweeps" / "fedlga_safeguards.yaml"
CELL = ["data.name", "data.partition.kind", "heterogeneity.rho"]
POINT = [*CELL, "local.lr"]
MARGIN = 0.5
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


def disqualified(tuning: pd.DataFrame) -> dict[str, list[str]]:
    """variant -> the grid points where a tuning seed of it diverged and no seed of FedAvg did."""
    div = tuning.assign(diverged=tuning["status"] == "diverged").groupby(["arm", *POINT])["diverged"].any()
    fedavg_ok = ~div.xs("fedavg", level="arm")
    out: dict[str, list[str]] = {}
    for (v, *point), d in div.items():
        if v != "fedavg" and d and fedavg_ok.get(tuple(point), False):
            out.setdefault(v, []).append(" ".join(f"{k.split('.')[-1]}={p}" for k, p in zip(POINT, point)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", nargs="?", default=str(SWEEP), help="the sweep file (default: fedlga_safeguards.yaml)")
    ap.add_argument("--json", help="also write the scores and verdicts as JSON")
    args = ap.parse_args(argv)
    trials, cells, complete, ended, planned, rounds = scored_study(Path(args.sweep), variant, CELL, ["local.lr"])
    if complete.empty:
        return 1
    tuning = trials[trials["stage"] == "tune"]
    out = {"disqualified": disqualified(tuning), "seeds": [int(s) for s in complete.index]}
    overall = complete.mean().sort_values()
    for name in sorted(cells["data.name"].unique()):
        part = cells[cells["data.name"] == name]
        order = list(seed_scores(part, CELL).loc[complete.index].mean().sort_values().index)
        print(f"### {name}\n\n" + cell_table(part, CELL, ["local.lr"], order, rounds,
                                            lambda k: f"{k[0]} {k[1]} ρ={k[2]:g}") + "\n")
    print(f"Rounds to the target on the confirm seeds ({len(complete)}: {', '.join(map(str, complete.index))}) at "
          f"each arm's η_l selected on validation per cell (in brackets), mean of the seeds; a run that never "
          f"reached it in {rounds} rounds, or diverged, counts as {rounds + 1} ([k/n]: seeds that reached it).\n")
    for v, points in sorted(out["disqualified"].items()):
        print(f"- **{v} is disqualified**: a tuning seed diverged where FedAvg's did not, at {len(points)} grid "
              "point(s): " + "; ".join(points[:4]) + (" ..." if len(points) > 4 else ""))
    print("\n| arm | mean score over all cells |\n|---|---|")
    for v in overall.index:
        print(f"| {v}{' (disqualified)' if v in out['disqualified'] else ''} | {overall[v]:.2f} |")
    qualified = [v for v in SIMPLER if v in complete and v not in out["disqualified"]]
    if not qualified:
        print("\nNo FedLGA variant qualifies.")
        return 0
    lead = min(qualified, key=lambda v: overall[v])
    simpler = qualified[:qualified.index(lead)]
    default = lead
    if simpler:
        against = compare_arms(complete, [("all cells", v, lead) for v in simpler], rounds)
        print(f"\nEach simpler qualified variant against the lowest, {lead} (difference in mean rounds over the "
              "cells, paired by confirm seed; Holm over these):\n\n" + comparisons_markdown(against))
        default = next((v for v, call in zip(simpler, against["verdict"]) if call != "worse"), lead)
        out["against_lowest"] = against.to_dict(orient="records")
    print(f"\nDefault by the rule: {default} (mean score {overall[default]:.2f}; lowest: {lead}, {overall[lead]:.2f}).")
    pairs = []
    for name in sorted(cells["data.name"].unique()):
        part = seed_scores(cells[cells["data.name"] == name], CELL).loc[complete.index]
        for v in qualified:
            pairs.append((name, v, "fedavg"))
            complete[f"{v} @ {name}"], complete[f"fedavg @ {name}"] = part[v], part["fedavg"]
    named = [(name, f"{v} @ {name}", f"fedavg @ {name}") for name, v, _ in pairs]
    fedavg = compare_arms(complete, named, rounds, margin=MARGIN)
    fedavg["method"] = [v for _, v, _ in pairs]
    fedavg["reference"] = "fedavg"
    print(f"\nEach qualified variant against FedAvg on each dataset's cells (Holm over these; `equivalent` inside "
          f"±{MARGIN:g} rounds):\n\n" + comparisons_markdown(fedavg))
    out.update(default=default, lowest=lead, overall=overall.to_dict(), against_fedavg=fedavg.to_dict(orient="records"))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0 if ended == planned else 1


if __name__ == "__main__":
    sys.exit(main())
