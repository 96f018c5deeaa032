"""Apply the rule in sweeps/fedlga_readings.yaml's header to that sweep's MLflow runs.

    fedsweep tune sweeps/fedlga_readings.yaml           # the runs (tuning, then confirm seeds)
    python docs/results/fedlga_readings.py [--json OUT]  # the table and the decision, in markdown

The rule (stated in the sweep file before the runs): each arm's (η_l, η_g) per cell (partition, ρ) is
selected on validation by `fedsweep tune` and rerun on the confirm seeds; score(arm, confirm seed) =
the mean over the 6 cells of its rounds to the target (never or diverged = R + 1). D = the FedLGA
variant with the lowest mean score; each simpler FedLGA variant (simplicity below) is compared with D
paired by seed (Holm over those); the pick is the simplest one not `worse` than D. Each FedLGA variant
and FedNova is compared with FedAvg too (Holm over those, `equivalent` inside ±0.5 rounds).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from confirmed import (cell_table, compare_arms, comparisons_markdown, determinism_check,  # noqa: E402
                       interactions_markdown, lead_change, scored_study)

SWEEP = Path(__file__).resolve().parents[2] / "sweeps" / "fedlga_readings.yaml"
CELL = ["data.partition.kind", "heterogeneity.rho"]
TUNED = ["local.lr", "server.lr"]
MARGIN = 0.5
# Simpler first: fewer terms, then fewer uploads and passes, then no damping.
READINGS = ["extrapolation", "projection", "continuation"]
SOURCES = ["mean", "last", "exact"]


def variant(cfg) -> str:
    a = cfg.algorithm
    if a.name != "fedlga":
        return a.name
    if a.reading == "extrapolation":   # λ plays no part: its λ = 1 runs are a determinism check
        return f"fedlga extrapolation ({a.grad_source}{'' if a.damping == 0 else ', λ=1: no-op'})"
    return f"fedlga {a.reading} ({a.grad_source}, λ={a.damping:g})"


def simplicity(arm: str) -> tuple:
    reading, rest = arm.split(" ", 2)[1], arm.split("(", 1)[1]
    source = rest.split(",")[0].rstrip(")")
    return READINGS.index(reading), SOURCES.index(source), "λ=1" in rest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", nargs="?", default=str(SWEEP), help="the sweep file (default: fedlga_readings.yaml)")
    ap.add_argument("--json", help="also write the scores and verdicts as JSON")
    args = ap.parse_args(argv)
    _, cells, scores, ended, planned, rounds = scored_study(Path(args.sweep), variant, CELL, TUNED)
    if scores.empty:
        return 1
    noop = [a for a in scores if "no-op" in a]
    overall = scores.drop(columns=noop).mean().sort_values()
    print(cell_table(cells[cells["seed"].isin(scores.index)], CELL, TUNED, list(overall.index), rounds,
                     lambda k: f"{k[0]} ρ={k[1]:g}"))
    print(f"\nRounds to the target on the confirm seeds ({len(scores)}: {', '.join(map(str, scores.index))}) at each "
          f"arm's (η_l, η_g) selected on validation per cell (in brackets), mean of the seeds; a run that never "
          f"reached it in {rounds} rounds, or diverged, counts as {rounds + 1} ([k/n]: seeds that reached it).")
    if noop:
        twin_of = {a: a.replace(", λ=1: no-op", "") for a in noop}
        print(determinism_check(cells, CELL, twin_of, "extrapolation with λ = 1 (a no-op) gave the same rounds to "
                                "target as λ = 0"))
    where = f"{len(cells[CELL].drop_duplicates())} cells"
    fedlga = sorted((a for a in overall.index if a.startswith("fedlga")), key=simplicity)
    lead = min(fedlga, key=lambda a: overall[a])
    simpler = fedlga[:fedlga.index(lead)]
    pick, against = lead, None
    if simpler:
        against = compare_arms(scores, [(where, a, lead) for a in simpler], rounds)
        print(f"\nEach simpler FedLGA variant against the lowest, {lead} (mean rounds over the cells, paired by "
              "confirm seed; Holm over these):\n\n" + comparisons_markdown(against))
        pick = next((a for a, call in zip(simpler, against["verdict"]) if call != "worse"), lead)
    print(f"\nPick by the rule: {pick} (mean score {overall[pick]:.2f}; lowest: {lead}, {overall[lead]:.2f}).")
    others = [a for a in overall.index if a != "fedavg"]
    fedavg = compare_arms(scores, [(where, a, "fedavg") for a in others], rounds, margin=MARGIN)
    print(f"\nEach arm against FedAvg (Holm over these; `equivalent` inside ±{MARGIN:g} rounds):\n\n"
          + comparisons_markdown(fedavg))
    # Added after the run, not part of the rule: the paper's claim is a lead that grows with ρ.
    asked = list(dict.fromkeys([pick, lead]))
    grows = lead_change(cells[cells["seed"].isin(scores.index)], CELL, "heterogeneity.rho", asked, "fedavg", rounds)
    print("\nDoes the lead over FedAvg grow from ρ = 0.1 to 0.9? (added after the run, not in the rule: per confirm "
          "seed, (arm − FedAvg at ρ = 0.9) − (arm − FedAvg at ρ = 0.1), each the mean over the two partitions; "
          "Holm over these):\n\n" + interactions_markdown(grows, "ρ"))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "pick": pick, "lowest": lead, "overall": overall.to_dict(),
            "against_lowest": [] if against is None else against.to_dict(orient="records"),
            "against_fedavg": fedavg.to_dict(orient="records"),
            "lead_change": grows.to_dict(orient="records")}, indent=1, default=str))
    return 0 if ended == planned else 1


if __name__ == "__main__":
    sys.exit(main())
