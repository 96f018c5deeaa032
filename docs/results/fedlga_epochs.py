"""Apply the rule in sweeps/fedlga_epochs.yaml's header to that sweep's MLflow runs.

    fedsweep tune sweeps/fedlga_epochs.yaml           # the runs (tuning, then confirm seeds)
    python docs/results/fedlga_epochs.py [--json OUT]  # the table and the comparisons, in markdown

The rule (stated in the sweep file before the runs): nothing is chosen. Each arm's (η_l, η_g) per ρ is
selected on validation by `fedsweep tune` and rerun on the confirm seeds; score(arm, confirm seed) =
the mean over the 3 ρ of its rounds to the target (never or diverged = R + 1). Each arm is compared
with FedLGA's default, extrapolation with the mean gradient, paired by seed (Holm over the arms,
`equivalent` inside ±0.5 rounds).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from confirmed import cell_table, compare_arms, comparisons_markdown, determinism_check, scored_study  # noqa: E402

SWEEP = Path(__file__).resolve().parents[2] / "sweeps" / "fedlga_epochs.yaml"
CELL = ["heterogeneity.rho"]
TUNED = ["local.lr", "server.lr"]
MARGIN = 0.5
DEFAULT = "fedlga extrapolation (mean)"
NOOP = "fedlga extrapolation (mean, λ=1: no-op)"   # λ plays no part in extrapolation: a determinism check


def variant(cfg) -> str:
    a = cfg.algorithm
    if a.name != "fedlga":
        return a.name
    if a.reading == "extrapolation":
        return DEFAULT if a.damping == 0 else NOOP
    return f"fedlga {a.reading} ({a.grad_source}, λ={a.damping:g})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", nargs="?", default=str(SWEEP), help="the sweep file (default: fedlga_epochs.yaml)")
    ap.add_argument("--json", help="also write the scores and verdicts as JSON")
    args = ap.parse_args(argv)
    _, cells, scores, ended, planned, rounds = scored_study(Path(args.sweep), variant, CELL, TUNED)
    if scores.empty:
        return 1
    overall = scores.drop(columns=[NOOP], errors="ignore").mean().sort_values()
    print(cell_table(cells[cells["seed"].isin(scores.index)], CELL, TUNED, list(overall.index), rounds,
                     lambda k: f"ρ={k[0]:g}"))
    print(f"\nRounds to the target on the confirm seeds ({len(scores)}: {', '.join(map(str, scores.index))}) at each "
          f"arm's (η_l, η_g) selected on validation per ρ (in brackets), mean of the seeds; a run that never "
          f"reached it in {rounds} rounds, or diverged, counts as {rounds + 1} ([k/n]: seeds that reached it).")
    if NOOP in scores:
        print(determinism_check(cells, CELL, {NOOP: DEFAULT}, "extrapolation with λ = 1 (a no-op) gave the same rounds to "
                                "target as λ = 0"))
    arms = [a for a in overall.index if a != DEFAULT]
    table = compare_arms(scores, [("every ρ", a, DEFAULT) for a in arms], rounds, margin=MARGIN)
    print(f"\nEach arm against {DEFAULT} (mean rounds over the 3 ρ, paired by confirm seed; Holm over the arms; "
          f"`equivalent` inside ±{MARGIN:g} rounds):\n\n" + comparisons_markdown(table))
    better = list(table.loc[table["verdict"] == "better", "method"])
    print("\n" + (f"Better than the default: {', '.join(better)}." if better else "No arm is better than the default."))
    if args.json:
        Path(args.json).write_text(json.dumps({"overall": overall.to_dict(), "comparisons": table.to_dict(orient="records")},
                                              indent=1, default=str))
    return 0 if ended == planned else 1


if __name__ == "__main__":
    sys.exit(main())
