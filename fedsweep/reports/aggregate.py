"""Across settings, in the manner of rliable (Agarwal, Schwarzer, Castro, Courville, Bellemare, "Deep
Reinforcement Learning at the Edge of the Statistical Precipice", NeurIPS 2021): descriptive summaries of
each method's scores over every (setting, seed) run of its selected configs, beside the tested calls.

- **IQM**: the interquartile mean of the method's scores pooled over settings and seeds (the mean of the
  middle 50%: robust to a few outlying runs, less noisy than the median), with a 95% **stratified
  bootstrap** interval (each setting's seeds resampled with replacement within the setting, the IQM
  recomputed, 2,000 times from a fixed seed; percentile interval).
- **P(method > reference)**: the probability of improvement, the average over settings of the share of
  (method run, reference run) pairs in which the method's score is higher (ties count half); the same
  bootstrap gives its interval. 0.5: neither tends to score higher.
- **Performance profile** (``profile.png``): for each score τ, the share of the method's runs scoring
  above τ, a line per method.

They read the score runs are compared by (test accuracy, or ``report.metric``), higher better; nothing is
tested or adjusted here: the verdicts are the paired comparisons'.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

DRAWS, SEED, CONFIDENCE = 2000, 0, 0.95


def _by_setting(values: dict[tuple[str, str], pd.DataFrame], method: str, column: str) -> dict[str, np.ndarray]:
    return {setting: frame[column].dropna().to_numpy(float) for (setting, m), frame in values.items()
            if m == method and len(frame[column].dropna())}


def _iqm(x: np.ndarray) -> float:
    return float(stats.trim_mean(x, 0.25)) if len(x) else float("nan")


def _improvement(x: dict[str, np.ndarray], y: dict[str, np.ndarray]) -> np.ndarray | float:
    """Average over the settings both have of P(a run of x scores above a run of y), ties half; with
    arrays of shape (draws, n) per setting, one value per draw."""
    shares = [((a[..., :, None] > b[..., None, :]) + 0.5 * (a[..., :, None] == b[..., None, :])).mean(axis=(-2, -1))
              for s, a in x.items() if s in y for b in [y[s]]]
    return np.mean(shares, axis=0) if shares else float("nan")


def _resample(groups: dict[str, np.ndarray], rng: np.random.Generator, draws: int) -> dict[str, np.ndarray]:
    """Each setting's runs resampled with replacement within it, ``draws`` times: (draws, n) per setting."""
    return {s: g[rng.integers(0, len(g), (draws, len(g)))] for s, g in groups.items()}


def aggregate_table(values: dict[tuple[str, str], pd.DataFrame], column: str, reference: str | None,
                    draws: int = DRAWS) -> pd.DataFrame:
    """A row per method: ``settings``, ``runs``, ``iqm`` with ``iqm_low``/``iqm_high``, and against
    ``reference`` ``p_improvement`` with ``p_low``/``p_high`` (NaN for the reference or without one)."""
    methods = list(dict.fromkeys(m for _, m in values))
    rng = np.random.default_rng(SEED)
    ref = _by_setting(values, reference, column) if reference is not None else {}
    half = (1 - CONFIDENCE) / 2 * 100
    rows = []
    for method in methods:
        groups = _by_setting(values, method, column)
        if not groups:
            continue
        pooled = np.concatenate(list(groups.values()))
        sample = _resample(groups, rng, draws)
        iqms = stats.trim_mean(np.concatenate(list(sample.values()), axis=1), 0.25, axis=1)
        probs = _improvement(sample, _resample(ref, rng, draws)) if ref and method != reference else []
        row = {"method": method, "settings": len(groups), "runs": len(pooled), "iqm": _iqm(pooled),
               "iqm_low": float(np.percentile(iqms, half)), "iqm_high": float(np.percentile(iqms, 100 - half)),
               "p_improvement": float("nan"), "p_low": float("nan"), "p_high": float("nan")}
        if len(probs):
            row.update(p_improvement=float(_improvement(groups, ref)), p_low=float(np.nanpercentile(probs, half)),
                       p_high=float(np.nanpercentile(probs, 100 - half)))
        rows.append(row)
    return pd.DataFrame(rows)


def profile_png(values: dict[tuple[str, str], pd.DataFrame], column: str, path: Path, label: str,
                title: str = "") -> Path:
    """The performance profile: for each score τ, the share of a method's runs (every setting and seed of
    its selected configs) scoring above τ; a line per method in its report colour."""
    from fedsweep.reports.plots import _colors
    from fedsweep.runs.plots import plt, save_figure
    methods = list(dict.fromkeys(m for _, m in values))
    colors = _colors(methods)
    pooled = {m: np.concatenate(list(_by_setting(values, m, column).values()) or [np.empty(0)]) for m in methods}
    every = np.concatenate(list(pooled.values()))
    grid = np.linspace(min(every.min(), 0.0) if every.size else 0.0, every.max() if every.size else 1.0, 400)
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    for m in methods:
        if pooled[m].size:
            ax.step(grid, (pooled[m][None, :] > grid[:, None]).mean(axis=1), where="post", color=colors[m],
                    label=f"{m} ({pooled[m].size} runs)", lw=1.6)
    ax.set(xlabel=f"τ ({label})", ylabel="share of runs scoring above τ", ylim=(0, 1.02),
           title=title or "performance profile over every setting and seed")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return save_figure(fig, path)


def aggregate_lines(table: pd.DataFrame, reference: str | None, label: str) -> list[str]:
    """The report's "Across settings" section (descriptive)."""
    from fedsweep.reports.tables import _markdown
    if table is None or not len(table):
        return []
    rows = [[r["method"], str(r["settings"]), str(r["runs"]), f"{r['iqm']:.4f} [{r['iqm_low']:.4f}, {r['iqm_high']:.4f}]",
             "—" if pd.isna(r["p_improvement"]) else f"{r['p_improvement']:.2f} [{r['p_low']:.2f}, {r['p_high']:.2f}]"]
            for _, r in table.iterrows()]
    vs = f"P(> {reference})" if reference else "P(> reference)"
    return ["## Across settings (descriptive)", "",
            f"Each method's `{label}` over every setting and seed of its selected configs, in the manner of rliable "
            "(Agarwal et al., NeurIPS 2021): the interquartile mean (IQM) with a 95% stratified bootstrap interval "
            f"(seeds resampled within each setting, {DRAWS:,} times), and the probability of improvement over "
            f"{reference or 'the reference'} (the share of run pairs, averaged over settings, in which the method "
            "scores higher; 0.5: neither). Descriptive: nothing here is tested or adjusted; the verdicts above are "
            "the paired comparisons'. `profile.png`: the share of each method's runs scoring above each τ.", "",
            _markdown(["method", "settings", "runs", "IQM [95% CI]", f"{vs} [95% CI]"], rows), "",
            "![performance profile](profile.png)", ""]
