"""The report's figures: accuracy curves of each method's best config, rounds to target, each method
across settings, and loss-aware aggregation weights. Bands and error bars are the 95% CI of the mean
over seeds (:mod:`fedsweep.reports.stats`)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from fedsweep.config.names import short
from fedsweep.reports.stats import mean_ci_rows
from fedsweep.reports.trials import _fmt_value, _groups, _present, _Runs

def _tick_labels(best: pd.DataFrame, groups) -> list[str]:
    """Short x labels for grouped bars: only the setting keys that vary, by their last name, one a line
    (``shard_size=33`` over ``temperature=0.1``), so many groups do not run into each other."""
    settings = [k for k in best.attrs["settings"] if best[k].nunique(dropna=False) > 1]
    if not settings:
        return [label or "all" for label, _ in groups]
    return ["\n".join(f"{k.split('.')[-1]}={_fmt_value(rows.iloc[0][k])}" for k in settings) for _, rows in groups]


def _colors(methods) -> dict:
    from fedsweep.runs.plots import method_color
    return {m: method_color(m) for m in methods}


BAND_NOTE = "mean over seeds; bands: 95% CI of the mean over seeds (t), clipped to [0, 1]"


def _mean_curve(runs: _Runs, run_ids):
    """(mean, CI low, CI high) over runs of test accuracy by round, or None if no run logged it."""
    curves = {rid: runs.accuracy(rid) for rid in run_ids}
    if not curves or all(c.empty for c in curves.values()):
        return None
    return mean_ci_rows(pd.DataFrame(curves).sort_index())


def _band(ax, curve, color, label: str, alpha: float) -> None:
    """A mean curve with the 95% CI of its mean over seeds as a band (none for one seed), clipped to
    accuracy's [0, 1]: a t-interval over few seeds can reach past it."""
    mean, low, high = curve
    ax.plot(mean.index, mean.values, color=color, label=label)
    ax.fill_between(mean.index, np.clip(low, 0.0, 1.0), np.clip(high, 0.0, 1.0), color=color, alpha=alpha, lw=0)


def _config_label(method: str, config: str) -> str:
    """``fedlga ηl0.1 ηg1`` from a best row's ``local.lr=0.1, server.lr=1``: which config a curve is."""
    pairs = [p.split("=", 1) for p in config.split(", ") if "=" in p] if isinstance(config, str) else []
    return " ".join([method, *(short(k, v) for k, v in pairs)])


def _cadence(curves) -> str:
    """'evaluated every N rounds' from the rounds the curves hold (what limits their resolution)."""
    steps = {int(b - a) for c in curves for a, b in zip(c[0].index[:-1], c[0].index[1:])}
    return f" (evaluated every {min(steps)} rounds)" if steps and min(steps) > 1 else ""


def _finish_axes(ax, xlabel: str) -> None:
    ax.set(xlabel=xlabel, ylim=(max(0.0, ax.get_ylim()[0]), min(1.02, ax.get_ylim()[1])))
    ax.grid(alpha=0.3)


def _panel_grid(n: int):
    """A figure of ``n`` accuracy panels, at most three per row, sharing the y axis."""
    from fedsweep.runs.plots import plt
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    return plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.6 * nrows), squeeze=False, sharey=True)


def _save_panels(fig, axes, used: int, path: Path, title: str) -> Path:
    from fedsweep.runs.plots import save_figure
    for ax in axes[:, 0]:
        ax.set_ylabel("test accuracy")
    for ax in list(axes.flat)[used:]:
        ax.set_visible(False)
    import textwrap
    width = max(30, int(fig.get_figwidth() * 9))   # characters a line of the title holds (~9 an inch)
    title = "\n".join(textwrap.fill(line, width) for line in title.split("\n"))
    return save_figure(fig, path, title)


def accuracy_curves_png(best: pd.DataFrame, runs: _Runs, path: Path, title: str = "") -> Path:
    """Test accuracy vs round of each method's best config: mean over seeds, 95% CI band; the target
    (``best["target"]``, if any) dashed."""
    groups = _groups(best)
    colors = _colors(best["method"].unique())
    fig, axes = _panel_grid(len(groups))
    for ax, (label, rows) in zip(axes.flat, groups):
        curves = []
        for _, r in rows.iterrows():
            if (curve := _mean_curve(runs, r["run_ids"])) is not None:
                curves.append(curve)
                _band(ax, curve, colors[r["method"]],
                      f"{_config_label(r['method'], r.get('config', ''))} ({r['n']} seeds)", 0.2)
        target = rows["target"].iloc[0] if "target" in rows else None
        if target is not None and _present(target):
            ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:.3g}")
        ax.set_title(label)
        _finish_axes(ax, "round" + _cadence(curves))
        ax.legend(fontsize=7, loc="lower right")
    return _save_panels(fig, axes, len(groups), path, "\n".join(t for t in (title, BAND_NOTE) if t))


def settings_curves_png(best: pd.DataFrame, runs: _Runs, path: Path, reference: str | None = None,
                        title: str = "") -> Path:
    """How each method responds to a setting: one panel per method (and value of the other settings),
    one curve per value of the last setting key, its best config there (mean over seeds).

    With ``settings: [server_data.fraction]`` this is the FedCLG paper's Fig. 6 (m_s ablation); with
    ``[data.partition.shard_size, algorithm.temperature]`` the FedSoftMax paper's Fig. 5 (one curve per
    T). A reference method that lacks the last key (one curve for all its values: FedAvg and T) is drawn
    dashed in black in every other method's panel, as the yardstick."""
    from fedsweep.runs.plots import plt

    settings = best.attrs["settings"]
    last, outer = settings[-1], settings[:-1]
    values = sorted(best[last].dropna().unique())
    shades = dict(zip(values, plt.get_cmap("viridis")(np.linspace(0.0, 0.85, len(values)))))
    panels = [(m, key, g) for m in sorted(best["method"].unique())
              for key, g in (best[best["method"] == m].groupby(outer, sort=True, dropna=False) if outer
                             else [((), best[best["method"] == m])])]
    # the reference needs no panel of its own where it has a single curve: it is dashed in the others
    if len(panels) > 1:
        panels = [p for p in panels if p[0] != reference or p[2]["run_ids"].map(tuple).nunique() > 1] or panels
    fig, axes = _panel_grid(len(panels))
    for ax, (method, key, rows) in zip(axes.flat, panels):
        key = key if isinstance(key, tuple) else (key,)
        drawn, curves = set(), []
        for _, r in rows.sort_values(last).iterrows():
            if tuple(r["run_ids"]) in drawn or (curve := _mean_curve(runs, r["run_ids"])) is None:
                continue
            drawn.add(tuple(r["run_ids"]))
            curves.append(curve)
            _band(ax, curve, shades.get(r[last], "grey"),
                  " ".join([short(last, _fmt_value(r[last])), _config_label("", r.get("config", ""))]).strip(), 0.15)
        if reference is not None and method != reference:
            ref = best[best["method"] == reference]
            for k, v in zip(outer, key):
                ref = ref[ref[k] == v]
            # only a reference that is one run set across the curves (it lacks the key) is a yardstick
            one = not ref.empty and ref["run_ids"].map(tuple).nunique() == 1
            if one and (curve := _mean_curve(runs, ref.iloc[0]["run_ids"])) is not None:
                ax.plot(curve[0].index, curve[0].values, color="black", ls="--", lw=1.2, label=reference)
        target = rows["target"].iloc[0] if "target" in rows and len(rows) else None
        if target is not None and _present(target):
            ax.axhline(target, color="grey", ls=":", lw=1)
        ax.set_title(" ".join([method, *(short(k, _fmt_value(v)) for k, v in zip(outer, key))]))
        _finish_axes(ax, "round" + _cadence(curves))
        ax.legend(fontsize=7, loc="lower right")
    return _save_panels(fig, axes, len(panels), path, "\n".join(t for t in (title, BAND_NOTE) if t))


def _error_bar(row, name: str, upper: float = math.inf):
    """Matplotlib's ``yerr`` of a bar from the row's ``<name>_ci`` interval (:func:`stats.add_intervals`),
    clipped to [0, ``upper``] (neither rounds nor accuracy go below 0, accuracy not above 1); None
    for one seed or a row without intervals."""
    interval = row.get(f"{name}_ci")
    if interval is None or not _present(interval.low):
        return None
    return np.array([[interval.mean - max(interval.low, 0.0)], [min(interval.high, upper) - interval.mean]])


def rounds_to_target_png(best: pd.DataFrame, path: Path, max_rounds: float | None = None,
                         target: float | None = None, title: str = "", relative: bool = False) -> Path:
    """Bars per method grouped by setting: mean rounds to target over the seeds that reached it, or best
    accuracy without a target; error bars: the 95% CI of the mean over seeds (``acc_ci``/``rtt_ci``).

    A method none of whose seeds reached the target gets a hatched bar at ``max_rounds``
    labelled "not reached"; a partial one is labelled "k/n"."""
    from fedsweep.runs.plots import plt, save_figure

    groups = _groups(best)
    max_rounds = max_rounds or float(np.nanmax([*best["rtt_mean"], 1.0]))
    methods = sorted(best["method"].unique())
    colors = _colors(methods)
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(groups) * len(methods) + 1.5), 4.0))
    top, hatched = 0.0, False
    for gi, (_, rows) in enumerate(groups):
        for mi, m in enumerate(methods):
            hit = rows[rows["method"] == m]
            if hit.empty:
                continue
            r = hit.iloc[0]
            x = gi + (mi - (len(methods) - 1) / 2) * width
            if target is None and not relative:
                y, yerr, note = r["acc_mean"], _error_bar(r, "acc", upper=1.0), None
            elif r["reached"] == 0:
                y, yerr, note = max_rounds, None, "not reached"
            else:
                y, yerr = r["rtt_mean"], _error_bar(r, "rtt")
                note = None if r["reached"] == r["n"] else f"{r['reached']}/{r['n']} reached"
            above = 0.0 if yerr is None else float(yerr[1, 0])
            if note == "not reached":
                ax.bar(x, y, width, facecolor="none", edgecolor=colors[m], hatch="//", lw=1.2)
                ax.text(x, y / 2, note, rotation=90, ha="center", va="center", fontsize=8,
                        bbox=dict(facecolor="white", edgecolor="none", pad=1))
                hatched = True
            else:
                ax.bar(x, y, width, color=colors[m], yerr=yerr, capsize=3)
                if note:
                    ax.text(x, y + above, note, ha="center", va="bottom", fontsize=8)
            top = max(top, y + above)
    ax.set_xticks(range(len(groups)), _tick_labels(best, groups), fontsize=8)
    if relative:
        ax.set(ylabel="rounds to the relative target", ylim=(0, top * 1.12 or 1),
               title=title or "rounds to target per method (mean, 95% CI)")
    elif target is None:
        ax.set(ylabel="best test accuracy (mean, 95% CI)", ylim=(0, min(1.05, top * 1.12) or 1),
               title=title or "best test accuracy per method (no target set; CI clipped to [0, 1])")
    else:
        ax.set(ylabel=f"rounds to target accuracy {target:g}", ylim=(0, top * 1.12 or 1),
               title=title or "rounds to target per method (mean over its own seeds, 95% CI; unpaired)")
    from matplotlib.patches import Patch
    handles = [Patch(color=colors[m], label=m) for m in methods]
    if hatched:
        handles.append(Patch(facecolor="none", edgecolor="grey", hatch="//", label=f"not reached\n(bar at {max_rounds:g})"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def weights_png(logs: list[tuple[str, pd.DataFrame]], path: Path, title: str = "", top: int | None = None) -> Path:
    """Per row (one run): |α_i − p_i| of every client over the rounds (the FedSoftMax paper's Fig. 6)
    and which clients carry the weight, round by round (its Fig. 7: the ``top`` largest α_i of each
    round in yellow, default a fifth of the clients and at most ten; the other sampled clients in blue,
    clients not sampled blank)."""
    from matplotlib.colors import ListedColormap

    from fedsweep.runs.plots import plt, save_figure

    fig, axes = plt.subplots(len(logs), 2, figsize=(10.5, 3.3 * len(logs)), squeeze=False)
    for (label, log), (ax_dev, ax_top) in zip(logs, axes):
        dev = log.pivot_table(index="round", columns="client", values="abs_dev")
        ax_dev.plot(dev.index, dev.values, color="tab:blue", lw=0.6, alpha=0.35)
        ax_dev.plot(dev.index, dev.mean(axis=1), color="black", lw=1.5, label="mean over clients")
        ax_dev.set(xlabel="round", ylabel="|α_i − p_i|", title=label)
        ax_dev.grid(alpha=0.3)
        ax_dev.legend(fontsize=7)
        # the paper marks the top 10 of 50 clients: a fifth, at most ten
        top = top or min(10, max(1, log["client"].nunique() // 5))
        rank = log.assign(_r=log.groupby("round")["alpha"].rank(ascending=False, method="first"))
        mark = rank.assign(_top=(rank["_r"] <= top).astype(float)).pivot_table(index="round", columns="client",
                                                                              values="_top")
        ax_top.imshow(mark.values, aspect="auto", interpolation="nearest", origin="lower",
                      cmap=ListedColormap(["#2c5aa0", "#f5d000"]), vmin=0, vmax=1,
                      extent=(-0.5, mark.shape[1] - 0.5, mark.index.min() - 0.5, mark.index.max() + 0.5))
        ticks = np.linspace(0, mark.shape[1] - 1, min(mark.shape[1], 10)).round().astype(int)
        ax_top.set_xticks(ticks, [str(mark.columns[i]) for i in ticks], fontsize=7)
        ax_top.set(xlabel="client", ylabel="round", title=f"top {top} α_i per round (yellow)")
    return save_figure(fig, path, title)


def weights_figures(best: pd.DataFrame, runs: _Runs, out: Path, max_rows: int = 4) -> list[tuple[str, str]]:
    """``weights_<method>.png`` for each method whose runs kept per-client weights: one row per setting
    (its best config there, first seed; at most ``max_rows``, evenly spread). Returns (method, file name)."""
    made = []
    for method in sorted(best["method"].unique()):
        rows = best[best["method"] == method]
        rows = rows[~rows["run_ids"].map(tuple).duplicated()]
        if rows.empty or not rows.iloc[0]["run_ids"] or runs.client_log(rows.iloc[0]["run_ids"][0]) is None:
            continue
        if len(rows) > max_rows:
            rows = rows.iloc[np.linspace(0, len(rows) - 1, max_rows).round().astype(int)]
        settings = best.attrs["settings"]
        logs = []
        for _, r in rows.iterrows():
            log = runs.client_log(r["run_ids"][0])
            if log is not None and {"alpha", "abs_dev"} <= set(log.columns):
                logs.append((", ".join([method, *(f"{k}={_fmt_value(r[k])}" for k in settings)]), log))
        if logs:
            name = f"weights_{method}.png"
            weights_png(logs, out / name, title=f"{method}: aggregation weights")
            made.append((method, name))
    return made


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


def search_png(configs: pd.DataFrame, keys: Sequence[str], path: Path, title: str = "") -> Path:
    """Where the good region is: one panel per sampled key, a point per config (its mean best test
    accuracy over seeds against the key's value), coloured by method; a log axis where the values
    span more than a factor of 20 (as loguniform draws do)."""
    from fedsweep.runs.plots import plt, save_figure
    keys = [k for k in keys if f"param:{k}" in configs]
    colors = _colors(configs["method"].unique())
    from matplotlib.ticker import NullFormatter
    fig, axes = _panel_grid(len(keys))
    for ax, key in zip(axes.flat, keys):
        for method, rows in configs.groupby("method"):
            x = pd.to_numeric(rows[f"param:{key}"], errors="coerce")
            if x.notna().any():
                ax.scatter(x, rows["acc_mean"], s=22, color=colors[method], label=method, alpha=0.85)
        values = pd.to_numeric(configs[f"param:{key}"], errors="coerce").dropna()
        if len(values) and values.min() > 0 and values.max() / values.min() > 20:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())   # decades only: the minor labels overlap
        ax.set(xlabel=key, title=short(key, "").strip() or key)
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("best test accuracy (mean over seeds)")
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    seen = {}                                  # one entry per method, whichever panel drew it
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    axes[0, 0].legend(list(seen.values()), list(seen), fontsize=7, loc="lower right")
    return save_figure(fig, path, title or "each sampled config: best test accuracy against the sampled keys")


def search_draws_png(configs: pd.DataFrame, random_first: int, path: Path, title: str = "") -> Path:
    """An optuna search in the order it drew: one panel per study (method, and settings where there
    are several), a point per config (its mean best test accuracy over seeds) at its draw number,
    the best so far as a line, and a mark where TPE took over from the random first draws."""
    from fedsweep.runs.plots import save_figure
    drawn = configs[configs["draw"].notna()]
    studies = list(drawn.groupby(["method", *configs.attrs.get("settings", [])], sort=False))
    colors = _colors(drawn["method"].unique())
    fig, axes = _panel_grid(len(studies))
    for ax, (key, rows) in zip(axes.flat, studies):
        rows = rows.sort_values("draw")
        x, y = rows["draw"].astype(int) + 1, rows["acc_mean"]
        method = rows["method"].iloc[0]
        ax.scatter(x, y, s=22, color=colors[method])
        ax.step(x, y.cummax(), where="post", color=colors[method], alpha=0.6)
        ax.axvline(random_first + 0.5, color="0.5", ls="--", lw=0.8)
        ax.set(title=" ".join(map(str, key)) if isinstance(key, tuple) else str(key), xlabel="draw")
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("best test accuracy (mean over seeds)")
    for ax in list(axes.flat)[len(studies):]:
        ax.set_visible(False)
    return save_figure(fig, path, title or f"optuna's draws in order (dashed: TPE after {random_first} random)")


#: Per-client evaluation's models: the columns of client_eval.csv and their panels' names.
CLIENT_CURVES = (("accuracy", "global"), ("finetuned_accuracy", "fine-tuned"), ("personal_accuracy", "personal"))


def client_ecdf_png(best: pd.DataFrame, runs: _Runs, path: Path, title: str = "") -> Path | None:
    """The distribution of per-client test accuracy at the last evaluation (``client_eval.csv``): a row
    of panels per setting, a panel per model (global, fine-tuned, personal: those some run has), a line
    per method in its colour, each the ECDF of every evaluated client of the best config's runs,
    pooled. None when no run evaluated per client."""
    from fedsweep.runs.plots import plt, save_figure
    groups = _groups(best)
    tables = {idx: pd.concat(ts) for idx, r in best.iterrows()
              if (ts := [t for run in r["run_ids"] if (t := runs.client_eval(run)) is not None])}
    if not tables:
        return None
    models = [(c, m) for c, m in CLIENT_CURVES if any(c in t and t[c].notna().any() for t in tables.values())]
    colors = _colors(best["method"].unique())
    fig, axes = plt.subplots(len(groups), len(models), figsize=(4.2 * len(models), 3.4 * len(groups)),
                             squeeze=False, sharex=True, sharey=True)
    for row, (label, g) in zip(axes, groups):
        for ax, (column, model) in zip(row, models):
            for idx, r in g.iterrows():
                pooled = tables.get(idx)
                acc = np.sort(pooled[column].dropna().to_numpy()) if pooled is not None and column in pooled else []
                if len(acc):
                    ax.step(acc, np.arange(1, len(acc) + 1) / len(acc), where="post", color=colors[r["method"]],
                            label=r["method"])
            ax.set_title(f"{label}: {model}" if label else model, fontsize=9)
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1.02)
            if ax.lines:
                ax.legend(fontsize=7, loc="upper left")
        row[0].set_ylabel("share of clients at or below")
    for ax in axes[-1]:
        ax.set_xlabel("a client's test accuracy")
    return save_figure(fig, path, title)
