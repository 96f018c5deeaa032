"""The report's markdown tables: best config per method, rounds to target per setting, all configs."""
from __future__ import annotations

import pandas as pd

from fedsweep.report.trials import _fmt_value, _groups, _present


def _pm(mean, std, digits: int) -> str:
    if not _present(mean):
        return "—"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if _present(std) else "")


def _num(v, digits: int = 1) -> str:
    return f"{v:,.{digits}f}" if _present(v) else "—"


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    esc = [[str(c).replace("|", "\\|") for c in r] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in esc])


def _best_table(best: pd.DataFrame) -> str:
    settings = best.attrs["settings"]
    header = [*settings, "method", "config", "seeds", "best acc", "final acc", "rounds to target",
              "reached", "s to target", "models up to target", "s / round", "stability", "diverged"]
    rows = [[*(_fmt_value(r[k]) for k in settings), r["method"], r["config"] or "—", str(r["n"]),
             _pm(r["acc_mean"], r["acc_std"], 4), _pm(r["final_mean"], r["final_std"], 4),
             _pm(r["rtt_mean"], r["rtt_std"], 1), f"{r['reached']}/{r['n']}",
             _num(r["sec_to_target"], 2), _num(r["comm_to_target"], 0), _num(r["sec_per_round"], 3),
             _num(r.get("stability"), 2), str(r["diverged"])] for _, r in best.iterrows()]
    return _markdown(header, rows)


def _rounds_table(best: pd.DataFrame, reference: str | None) -> str:
    """Settings × methods: mean rounds to target and the speed-up over ``reference`` (FedCLG Table I).

    Speed-up = reference's mean rounds / the method's, under the same setting, where both reached the
    target; "[k/n]" says only k of n seeds reached it (their mean is shown)."""
    methods = sorted(best["method"].unique(), key=lambda m: (m != reference, m))
    rows = []
    for label, g in _groups(best):
        ref = g[g["method"] == reference]
        ref_rtt = ref.iloc[0]["rtt_mean"] if reference is not None and not ref.empty and ref.iloc[0]["reached"] else None
        cells = []
        for m in methods:
            hit = g[g["method"] == m]
            if hit.empty:
                cells.append("")
                continue
            r = hit.iloc[0]
            if r["reached"] == 0:
                cells.append(f"not reached (0/{r['n']})")
                continue
            cell = f"{r['rtt_mean']:.1f}" + (f" ({ref_rtt / r['rtt_mean']:.2f}×)" if ref_rtt else "")
            cells.append(cell + (f" [{r['reached']}/{r['n']}]" if r["reached"] < r["n"] else ""))
        rows.append([label or "all", *cells])
    return _markdown(["setting", *methods], rows)


def _all_table(configs: pd.DataFrame) -> str:
    settings = configs.attrs["settings"]
    header = ["method", *settings, "rank", "config", "best acc", "rounds to target", "reached", "seeds",
              "statuses", "config_id"]
    rows = [[r["method"], *(_fmt_value(r[k]) for k in settings), str(r["rank"]), r["config"] or "—",
             _pm(r["acc_mean"], r["acc_std"], 4), _pm(r["rtt_mean"], r["rtt_std"], 1),
             f"{r['reached']}/{r['n']}", str(r["n"]), r["statuses"], f"`{r['config_id']}`"]
            for _, r in configs.iterrows()]
    return _markdown(header, rows)


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------
