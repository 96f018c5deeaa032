"""The report's markdown tables: best config per method, rounds to target per setting, comparisons with
the reference method, all configs."""
from __future__ import annotations

import math

import pandas as pd

from fedsweep.reports.trials import _fmt_value, _groups, _present
from fedsweep.runs.summary import FEDSWEEP_PREFIXES, own_metric


def _pm(mean, std, digits: int) -> str:
    if not _present(mean):
        return "—"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if _present(std) else "")


def _ci(interval, digits: int) -> str:
    """``0.9120 [0.9010, 0.9230]``: a mean over seeds and its 95% interval (:func:`stats.mean_ci`)."""
    if interval is None or not _present(interval.mean):
        return "—"
    if not _present(interval.low):
        return f"{interval.mean:.{digits}f} [1 seed: no CI]"
    return f"{interval.mean:.{digits}f} [{interval.low:.{digits}f}, {interval.high:.{digits}f}]"


def _num(v, digits: int = 1) -> str:
    return f"{v:,.{digits}f}" if _present(v) else "—"


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    esc = [[str(c).replace("|", "\\|") for c in r] for r in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in esc])


def _score_label(attrs: dict) -> str:
    """What the tables call the number runs are scored by (``report.metric``, or test accuracy)."""
    metric, on_val = attrs.get("metric"), attrs.get("selected_on") == "validation"
    if metric and own_metric(metric):
        return f"final {metric} ({'lower' if attrs.get('mode') == 'min' else 'higher'} better)"
    if metric:
        return f"{metric} at best val" if on_val else f"best {metric}"
    return "test acc at best val" if on_val else "best acc"


def _targeted(best: pd.DataFrame) -> bool:
    """Whether the selected configs' runs had a target accuracy (absolute or relative): the report's
    tables show reaching it only then."""
    return "target" not in best or bool(best["target"].notna().any())


def _best_table(best: pd.DataFrame) -> str:
    """A row per selected config; the columns of reaching the target only where runs had one."""
    settings = best.attrs["settings"]
    accuracy = _score_label(best.attrs)
    targeted = _targeted(best)
    reach = ["rounds to target", "reached", "s to target", "models up to target"] if targeted else []
    header = [*settings, "method", "config", "seeds", accuracy, "final acc", *reach, "s / round", "stability",
              "diverged"]
    rows = [[*(_fmt_value(r[k]) for k in settings), r["method"], r["config"] or "—", str(r["n"]),
             _ci(r["acc_ci"], 4), _ci(r["final_ci"], 4),
             *([_ci(r["rtt_ci"], 1), f"{r['reached']}/{r['n']}", _num(r["sec_to_target"], 2),
                _num(r["comm_to_target"], 0)] if targeted else []),
             _num(r["sec_per_round"], 3), _num(r.get("stability"), 2), str(r["diverged"])] for _, r in best.iterrows()]
    return _markdown(header, rows)


def _rounds_table(best: pd.DataFrame, reference: str | None, comparisons: pd.DataFrame | None = None) -> str:
    """Settings × methods: mean rounds to target with its 95% CI and the speed-up over ``reference``
    (FedCLG Table I), and after each method's the verdict of its paired comparison (``comparisons``).

    Speed-up = reference's mean rounds / the method's, under the same setting, where both reached the
    target; "k/n reached" says only k of n seeds reached it (their mean and CI are shown)."""
    methods = sorted(best["method"].unique(), key=lambda m: (m != reference, m))
    called = {} if comparisons is None or not len(comparisons) else {
        (r["setting"], r["method"]): r["verdict"] for _, r in comparisons.iterrows() if r["metric"] == "rounds_to_target"}
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
            cell = _ci(r["rtt_ci"], 1) + (f" ({ref_rtt / r['rtt_mean']:.2f}×)" if ref_rtt else "")
            cells.append(cell + (f", {r['reached']}/{r['n']} reached" if r["reached"] < r["n"] else ""))
        for i, m in enumerate(methods):   # the paired call, beside the unpaired means
            verdict = called.get((label or "all", m))
            if verdict and cells[i]:
                cells[i] += f"; **{verdict}**" if verdict in ("better", "worse") else f"; {verdict}"
        rows.append([label or "all", *cells])
    return _markdown(["setting", *methods], rows)


def _signed(v, digits: int) -> str:
    return f"{v:+.{digits}f}" if _present(v) else "—"


def _interval(low, high, digits: int) -> str:
    return f"[{_signed(low, digits)}, {_signed(high, digits)}]" if _present(low) else "—"


def _comparisons_table(table: pd.DataFrame) -> str:
    """The verdict table of comparisons.csv: difference [95% CI], the adjusted CI, Holm-adjusted p,
    verdict, the power of these seeds, how it was tested."""
    rows = []
    for _, r in table.iterrows():
        digits = 1 if r["metric"] == "rounds_to_target" else 4
        ci = f" {_interval(r['ci_low'], r['ci_high'], digits)}" if _present(r["ci_low"]) else ""
        power = r["power_mde"]
        power = "—" if not _present(power) else "∞" if math.isinf(power) else f"±{power:.{digits}f}"
        censored = (f"{r['censored_method']} / {r['censored_reference']}" if r["metric"] == "rounds_to_target"
                    else "")
        rows.append([r["setting"], r["metric"], r["method"], f"{r['n_seeds']} ({r['stop_reason']})",
                     _signed(r["difference"], digits) + ci,
                     _interval(r["adj_ci_low"], r["adj_ci_high"], digits),
                     "—" if math.isnan(r["p_adjusted"]) else f"{r['p_adjusted']:.3g}", r["verdict"], power,
                     r["test"], censored, r["note"]])
    return _markdown(["setting", "metric", "method", "paired seeds (stopped)", "difference [95% CI]", "adjusted CI",
                      "p (Holm)",
                      "verdict", "80% power at", "test", "censored (method / ref.)", "note"], rows)


def _interactions_table(table: pd.DataFrame) -> str:
    """The interaction rows: the change of a method's paired difference between two setting values."""
    rows = []
    for _, r in table.iterrows():
        digits = 1 if r["metric"] == "rounds_to_target" else 4
        ci = f" {_interval(r['ci_low'], r['ci_high'], digits)}" if _present(r["ci_low"]) else ""
        rows.append([r["metric"], r["method"], f"{r['from']} → {r['to']}", str(r["n_seeds"]),
                     _signed(r["change"], digits) + ci, _interval(r["adj_ci_low"], r["adj_ci_high"], digits),
                     "—" if math.isnan(r["p_adjusted"]) else f"{r['p_adjusted']:.3g}", r["verdict"], r["test"]])
    return _markdown(["metric", "method", "from → to", "shared seeds", "change [95% CI]", "adjusted CI", "p (Holm)",
                      "verdict", "test"], rows)


def _all_table(configs: pd.DataFrame, targeted: bool = True) -> str:
    """Every tuning config, ranked within its method and settings; with a validation split the
    numbers selection ranks by (validation) beside the ones reported (test); rounds to target only
    where runs had a target (``targeted``)."""
    settings = configs.attrs["settings"]
    on_val, metric = configs.attrs.get("selected_on") == "validation", configs.attrs.get("metric")
    accuracy = _score_label(configs.attrs)
    twin = ("final " + metric if own_metric(metric) else "/val_".join(metric.split("/", 1))) if metric else "val acc"
    selects = [f"{twin} (selects)", *(["val rounds to target (selects)"] if targeted else [])] if on_val else []
    reach = ["rounds to target (± std)", "reached"] if targeted else []
    header = ["method", *settings, "rank", "config", *selects, f"{accuracy} (± std)", *reach, "seeds", "statuses",
              "config_id"]
    rows = [[r["method"], *(_fmt_value(r[k]) for k in settings), str(r["rank"]), r["config"] or "—",
             *([_num(r["sel_acc_mean"], 4), *([_num(r["sel_rtt_mean"], 1)] if targeted else [])] if on_val else []),
             _pm(r["acc_mean"], r["acc_std"], 4),
             *([_pm(r["rtt_mean"], r["rtt_std"], 1), f"{r['reached']}/{r['n']}"] if targeted else []),
             str(r["n"]), r["statuses"], f"`{r['config_id']}`"]
            for _, r in configs.iterrows()]
    return _markdown(header, rows)


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------


#: Per-client evaluation's models (runs/summary.CLIENT_KINDS) as the report names them.
CLIENT_MODELS = {"clients": "global", "finetuned": "fine-tuned", "personal": "personal",
                 "unseen": "unseen clients, global", "unseen_finetuned": "unseen clients, fine-tuned"}


def _per_best_config(best: pd.DataFrame, trials: pd.DataFrame, cells, header: list[str]) -> str:
    """Settings × methods: a row per best config, its scored runs' count and ``cells(runs)`` of them."""
    settings = best.attrs["settings"]
    by_run = trials.set_index("run_id")
    rows = []
    for _, r in best.iterrows():
        runs = by_run.loc[[i for i in r["run_ids"] if i in by_run.index]]
        rows.append([*(_fmt_value(r[k]) for k in settings), r["method"], str(len(runs)), *cells(runs)])
    return _markdown([*settings, "method", "seeds", *header], rows)


def _client_table(best: pd.DataFrame, trials: pd.DataFrame) -> str | None:
    """Settings × methods: each model's per-client accuracy at the last evaluation (mean over clients /
    mean of the worst 10% / lowest client), averaged over the best config's scored runs; None when no
    run evaluated per client (``eval.clients``)."""
    cols = {kind: [f"summary/final_{kind}_accuracy_{s}" for s in ("mean", "p10", "min")] for kind in CLIENT_MODELS}
    kinds = [k for k, c in cols.items() if c[0] in trials and trials[c[0]].notna().any()]
    if not kinds:
        return None

    def cells(runs):
        means = [[runs[c].mean() if c in runs else math.nan for c in cols[kind]] for kind in kinds]
        return [" / ".join(_num(v, 3) for v in m) if _present(m[0]) else "—" for m in means]
    return _per_best_config(best, trials, cells, [f"{CLIENT_MODELS[k]}: mean / worst 10% / min" for k in kinds])


def own_columns(trials: pd.DataFrame) -> list[str]:
    """The summary columns of the algorithms' own metrics (``summary/final_qffl_mean_Fq``; runs/summary.py's
    ``own_summary``): ``final_<prefix>_...`` whose prefix is none of fedsweep's."""
    head = "summary/final_"
    return [c for c in trials if c.startswith(head) and c[len(head):].split("_")[0] not in FEDSWEEP_PREFIXES
            and trials[c].notna().any()]


def _own_table(best: pd.DataFrame, trials: pd.DataFrame) -> str | None:
    """Settings × methods: each algorithm's own metrics (its ``round_metrics``) as of the runs' end, mean ±
    std over the best config's scored runs; None when no method logs any."""
    cols = own_columns(trials)
    if not cols:
        return None
    return _per_best_config(best, trials, lambda runs: [
        _pm(runs[c].mean(), runs[c].std(), 4) if c in runs and runs[c].notna().any() else "—" for c in cols],
        [c[len("summary/final_"):] for c in cols])

