"""The verdicts against the reference, as a reader meets them: a line each at the end of ``tune`` and
``report``, a markdown table opening the sweep's MLflow run, a forest plot of the paired differences
(``comparisons.png``) and a LaTeX table for a paper (``verdicts.tex``). All read comparisons.csv's rows
(:func:`fedsweep.reports.stats.comparison_table`); none computes anything of its own."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fedsweep.reports.tables import _interval, _markdown, _signed

#: A verdict's colour in the forest plot (called ones saturated, the others grey).
VERDICT_COLORS = {"better": "#1a9850", "worse": "#d73027", "equivalent": "#4575b4", "inconclusive": "#7f7f7f",
                  "not tested": "#bdbdbd"}


def _digits(metric: str) -> int:
    return 1 if metric == "rounds_to_target" else 4


def _metric_label(metric: str) -> str:
    return str(metric).removeprefix("summary/").replace("_", " ")


def _rows(table: pd.DataFrame) -> list[list[str]]:
    """setting, method, metric, difference [adjusted CI], paired seeds, verdict: each comparison's words."""
    out = []
    for _, r in table.iterrows():
        digits = _digits(r["metric"])
        what = (f"{_signed(r['difference'], digits)} {_interval(r['adj_ci_low'], r['adj_ci_high'], digits)}"
                if not pd.isna(r["difference"]) else "—")
        out.append([str(r["setting"] or "—"), str(r["method"]), _metric_label(r["metric"]), what,
                    str(r["n_seeds"]), str(r["verdict"])])
    return out


def verdict_lines(table: pd.DataFrame, reference: str | None) -> list[str]:
    """What ``fedsweep tune`` and ``fedsweep report`` print at their end: a line per comparison with the
    reference (setting, method, metric: difference, adjusted 95% interval, paired seeds, verdict), the
    columns aligned; [] without a reference or a comparison."""
    if reference is None or table is None or not len(table):
        return []
    rows = [[*r[:4], f"{r[4]} seeds", r[5]] for r in _rows(table)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [f"verdicts against {reference} (paired by seed; difference [Holm-adjusted 95% interval]):",
            *("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)]


def verdict_table(table: pd.DataFrame, reference: str | None) -> list[str]:
    """The parent run's first lines: a markdown table of the verdicts against the reference; [] without any."""
    if reference is None or table is None or not len(table):
        return []
    rows = [[*r[:5], f"**{r[5]}**" if r[5] in ("better", "worse") else r[5]] for r in _rows(table)]
    return [f"## Verdicts against {reference}", "", "Paired by seed; the difference and its Holm-adjusted 95% "
            "interval (comparisons.csv, and the report below, say how).", "",
            _markdown(["setting", "method", "metric", "difference [adjusted CI]", "seeds", "verdict"], rows), ""]


def _tex(text: str) -> str:
    """``text`` safe in LaTeX: its special characters escaped, minus signs as math."""
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"),
                 ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"), ("^", r"\^{}")):
        text = text.replace(a, b)
    return text.replace("ρ", r"$\rho$").replace("η", r"$\eta$").replace("−", "$-$")


def verdicts_tex(table: pd.DataFrame, reference: str | None, path: Path) -> Path | None:
    """``verdicts.tex``: the verdicts as a booktabs table (``\\usepackage{booktabs}``), to ``\\input`` in a
    paper; None without a reference or a comparison."""
    if reference is None or table is None or not len(table):
        return None
    body = []
    for setting, method, metric, what, seeds, verdict in _rows(table):
        what = what.replace("-", "−")
        shown = rf"\textbf{{{verdict}}}" if verdict in ("better", "worse") else verdict
        body.append(" & ".join([_tex(setting), _tex(method), _tex(metric), _tex(what), seeds, shown]) + r" \\")
    lines = [f"% fedsweep: each method against {reference}, paired by seed; difference [Holm-adjusted 95% interval]",
             r"\begin{tabular}{lllrrl}", r"\toprule",
             r"Setting & Method & Metric & Difference [adj.\ 95\% CI] & Seeds & Verdict \\", r"\midrule", *body,
             r"\bottomrule", r"\end{tabular}", ""]
    path = Path(path)
    path.write_text("\n".join(lines))
    return path


def forest_png(table: pd.DataFrame, reference: str | None, path: Path, resolution: float = 1.0,
               title: str = "") -> Path | None:
    """``comparisons.png``: a panel per metric, a row per (setting, method): the paired difference from the
    reference (a dot) and its Holm-adjusted 95% interval (a line), coloured by verdict and named at the
    right; the shaded band is ±``report.margin`` (inside it: no difference that matters), the dashed
    lines ±``resolution`` for rounds (inside them nothing is called better or worse), the solid line 0.
    None without a reference or a comparison."""
    if reference is None or table is None or not len(table):
        return None
    from fedsweep.runs.plots import plt, save_figure
    metrics = list(dict.fromkeys(table["metric"]))
    heights = [max(1.5, 0.38 * int((table["metric"] == m).sum()) + 0.9) for m in metrics]
    fig, axes = plt.subplots(len(metrics), 1, figsize=(8.0, sum(heights) + 0.6), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, metric in zip(axes[:, 0], metrics):
        rows = table[table["metric"] == metric].reset_index(drop=True)
        y = np.arange(len(rows))[::-1]
        margin = float(rows["margin"].iloc[0]) if "margin" in rows and not pd.isna(rows["margin"].iloc[0]) else 0.0
        if margin > 0:
            ax.axvspan(-margin, margin, color="#d9d9d9", alpha=0.6, lw=0, label=f"±margin {margin:g}")
        rounds = metric == "rounds_to_target"
        if rounds and resolution > 1:
            for side in (-resolution, resolution):
                ax.axvline(side, color="grey", ls="--", lw=0.8)
        ax.axvline(0.0, color="black", lw=0.8)
        for yi, (_, r) in zip(y, rows.iterrows()):
            color = VERDICT_COLORS.get(r["verdict"], "#7f7f7f")
            if not pd.isna(r["adj_ci_low"]):
                ax.plot([r["adj_ci_low"], r["adj_ci_high"]], [yi, yi], color=color, lw=2.2, solid_capstyle="butt")
            if not pd.isna(r["difference"]):
                ax.plot(r["difference"], yi, "o", color=color, ms=5)
            ax.annotate(f"{r['verdict']} ({r['n_seeds']} seeds)", xy=(1.01, yi), xycoords=("axes fraction", "data"),
                        va="center", fontsize=8, color=color)
        labels = [f"{r['method']}" + (f" · {r['setting']}" if r["setting"] not in ("", "all", None) else "")
                  for _, r in rows.iterrows()]
        ax.set_yticks(y, labels, fontsize=8)
        ax.set_ylim(-0.7, len(rows) - 0.3)
        better = "fewer rounds is better" if rounds else "higher is better"
        ax.set_xlabel(f"{_metric_label(metric)}: method − {reference} (paired, Holm-adjusted 95% CI; {better})",
                      fontsize=8)
        ax.grid(axis="x", alpha=0.3)
        finite = rows[["adj_ci_low", "adj_ci_high", "difference"]].to_numpy(float)
        finite = finite[np.isfinite(finite)]
        if finite.size:
            span = max(float(np.abs(finite).max()), margin, resolution if rounds else 0.0) * 1.1 or 1.0
            ax.set_xlim(-span, span)
    fig.suptitle(title or f"each method against {reference}, paired by seed", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)

