"""The verdict table of docs/results.md ("Verdicts under the protocol") from the verdict sweeps' reports.

    for s in sweeps/*_verdict.yaml sweeps/fedlga_mnist5k.yaml sweeps/baselines_mnist5k.yaml; do
        fedsweep tune $s && fedsweep report $s; done
    python docs/results/verdicts.py reports        # the folder holding reports/<sweep>/comparisons.csv

One row per (sweep, setting, method) compared with its sweep's reference: rounds to target and the
accuracy the runs are scored by (test, at each run's best validation round), each as `verdict
difference [adjusted interval], seeds (why they stopped), 80% power at ±x` over the confirm seeds,
paired by seed (docs/sweeps.md, "Intervals and verdicts"): the adjusted interval is the one the verdict
reads, so it excludes 0 exactly where the verdict is `better` or `worse`. Then, for the sweeps with one
setting key, whether each method's lead changes from its first value to its last (interactions.csv).
Last, the results-level family: the claims of docs/results.md's headline as one family. Each sweep
holds one Holm family of comparisons and, where it tests an interaction, one of interactions, each at
0.05; over all of them each row's Holm-adjusted p is multiplied by the number of these families
(Bonferroni over the families on top of Holm within each: the chance of any false `better`, `worse`
or interaction call among all of them stays below 0.05). A call that survives holds across the
claims; one that does not holds only within its own sweep. `equivalent` calls are not re-tested there.
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

SWEEPS = ["fedlga_verdict", "fedlga_mnist5k", "baselines_verdict", "baselines_mnist5k",
          "fedclg_verdict", "fedclg_mnist5k_verdict", "fedsoftmax_verdict", "fedsoftmax_mnist5k_verdict"]


def cell(row: dict | None, digits: int) -> str:
    if row is None:
        return "—"
    verdict = row["verdict"]
    if row["difference"] in ("", "nan"):
        return verdict
    diff, low, high = (float(row[k]) for k in ("difference", "adj_ci_low", "adj_ci_high"))
    text = f"{diff:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"
    power = float(row["power_mde"]) if row["power_mde"] not in ("", "nan") else None
    power = "" if power is None else ", power ∞" if power == float("inf") else f", 80% power at ±{power:.{digits}f}"
    censored = int(row.get("censored_method") or 0) + int(row.get("censored_reference") or 0)
    return (f"**{verdict}** {text}, {row['seeds_used']} seeds ({row['stop_reason']}){power}"
            + (f", {censored} censored" if censored else ""))


def setting(text: str) -> str:
    """``heterogeneity.rho=0.1, ...`` as ``rho=0.1, ...``."""
    if text == "all":
        return "—"
    return ", ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in (p.split("=", 1) for p in text.split(", ")))


def table(reports: Path) -> str:
    lines = ["| sweep | setting | method vs reference | rounds to target | test accuracy at best val |",
             "|---|---|---|---|---|"]
    for sweep in SWEEPS:
        path = reports / sweep / "comparisons.csv"
        if not path.exists():
            continue
        rows = list(csv.DictReader(open(path)))
        keyed = {(r["setting"], r["method"], r["metric"].split("/")[-1]): r for r in rows}
        for s, m in dict.fromkeys((r["setting"], r["method"]) for r in rows):
            ref = next(r["reference"] for r in rows if r["method"] == m)
            lines.append(f"| `{sweep}` | {setting(s)} | {m} vs {ref} | {cell(keyed.get((s, m, 'rounds_to_target')), 1)} | "
                         f"{cell(keyed.get((s, m, 'test_accuracy_at_best_val')), 3)} |")
    return "\n".join(lines)


def interactions(reports: Path) -> str:
    lines = ["| sweep | method vs reference | metric | from → to | change [adjusted interval], shared seeds |",
             "|---|---|---|---|---|"]
    for sweep in SWEEPS:
        path = reports / sweep / "interactions.csv"
        if not path.exists():
            continue
        for r in csv.DictReader(open(path)):
            digits = 1 if r["metric"] == "rounds_to_target" else 3
            change, low, high = (float(r[k]) for k in ("change", "adj_ci_low", "adj_ci_high"))
            lines.append(f"| `{sweep}` | {r['method']} vs {r['reference']} | {r['metric'].split('/')[-1]} | "
                         f"{setting(r['from'])} → {setting(r['to'])} | **{r['verdict']}** {change:+.{digits}f} "
                         f"[{low:+.{digits}f}, {high:+.{digits}f}], {r['n_seeds']} |")
    return "\n".join(lines)


def across_claims(reports: Path) -> str:
    """Each `better` / `worse` row and interaction call with its family's Holm-adjusted p × the number of
    families read (each sweep's comparisons.csv and interactions.csv): whether it is still called when
    every claim's tests are one family."""
    files = [(sweep, kind, reports / sweep / f"{kind}.csv") for sweep in SWEEPS
             for kind in ("comparisons", "interactions")]
    files = [f for f in files if f[2].exists()]
    k = len(files)
    lines = [f"Calls across the {len({sweep for sweep, _, _ in files})} claims, {k} families (each sweep's comparisons "
             f"and its interactions; each row's Holm-adjusted p × {k}; called where below 0.05):", "",
             "| sweep | row | metric | verdict | adjusted p | × families | across the claims |",
             "|---|---|---|---|---|---|---|"]
    for sweep, kind, path in files:
        for r in csv.DictReader(open(path)):
            if r["verdict"] not in ("better", "worse", "lead grows", "lead shrinks"):
                continue
            p = float(r["p_adjusted"])
            row = (f"{setting(r['setting'])} {r['method']} vs {r['reference']}" if kind == "comparisons"
                   else f"{r['method']} vs {r['reference']}, {setting(r['from'])} → {setting(r['to'])}")
            lines.append(f"| `{sweep}` | {row} | {r['metric'].split('/')[-1]} | {r['verdict']} | {p:.3g} | "
                         f"{min(1.0, p * k):.3g} | {'**called**' if p * k < 0.05 else 'this sweep only'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "reports")
    print(table(folder))
    print()
    print(interactions(folder))
    print()
    print(across_claims(folder))
