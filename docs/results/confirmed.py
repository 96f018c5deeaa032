"""What the studies that choose a default (fedlga_safeguards.py, fedlga_epochs.py) share: their
sweep's runs with each trial's arm and cell read from its config, the confirm runs scored per seed,
and paired comparisons made by `fedsweep report`'s own tests (fedsweep.reports.stats.comparison_table:
exact sign-flip test, Holm, adjusted intervals, `equivalent` inside a margin, power).

A score on a confirm seed is the mean over the cells of an arm's rounds to the target, a run that
never reached it or diverged counting R + 1: a mean of bounded numbers, tested by its mean.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from fedsweep.reports import load_trials
from fedsweep.reports.interactions import interaction_table
from fedsweep.reports.stats import Metric, comparison_table
from fedsweep.runs.tracking import resolve_tracking_uri
from fedsweep.sweep.spec import expand, load_sweep

SYMBOLS = {"local.lr": "η_l", "server.lr": "η_g"}


def dotted(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part, None)
    return cfg


def sweep_runs(path: Path, arm_of: Callable, keys: Sequence[str]) -> tuple[pd.DataFrame, int, int]:
    """(trials with columns ``arm`` and ``keys`` read from each trial's config, planned tuning
    trials, R). load_trials keeps only the params that vary; the config has every key."""
    sweep = load_sweep(path)
    plan = expand(sweep, source=str(path))
    trials = load_trials(resolve_tracking_uri(sweep.mlflow.tracking_uri), sweep.mlflow.experiment or sweep.name,
                         sweep.name)
    by_id = {t.config_id: t.config for t in plan}
    trials = trials[trials["config_id"].isin(by_id)].copy()
    trials["arm"] = [arm_of(by_id[c]) for c in trials["config_id"]]
    for key in keys:
        trials[key] = [dotted(by_id[c], key) for c in trials["config_id"]]
    return trials, len(plan), int(sweep.base["rounds"])


def rounds_or_late(trials: pd.DataFrame, rounds: int) -> pd.Series:
    """Rounds to the target; a finished run that never reached it, or a diverged one, R + 1."""
    hit = trials["rounds_to_target"] if "rounds_to_target" in trials else pd.Series(math.nan, index=trials.index)
    return hit.where(trials["status"] == "finished").fillna(rounds + 1)


def confirm_cells(trials: pd.DataFrame, cell: Sequence[str], rounds: int, tuned: Sequence[str]) -> pd.DataFrame:
    """One row per (arm, cell, confirm seed): ``rounds`` (R + 1 if never reached), with the selected
    config's ``tuned`` keys."""
    confirm = trials[(trials["stage"] == "confirm") & trials["status"].isin(["finished", "diverged"])].copy()
    confirm["rounds"] = rounds_or_late(confirm, rounds)
    return confirm[["arm", *cell, *tuned, "seed", "rounds", "status"]]


def cell_table(cells: pd.DataFrame, cell: Sequence[str], tuned: Sequence[str], order: Sequence[str],
               rounds: int, label: Callable[[tuple], str]) -> str:
    """Markdown: an arm per row, a cell per column: mean confirm rounds (its selected ``tuned``
    values), [k/n] where some seeds never reached the target; the mean over cells last."""
    keys = sorted({tuple(c) for c in cells[list(cell)].itertuples(index=False)})
    lines = ["| arm | " + " | ".join(label(k) for k in keys) + " | mean |", "|" + "---|" * (len(keys) + 2)]
    for arm in order:
        row, means = [arm], []
        for k in keys:
            part = cells[(cells["arm"] == arm) & (cells[list(cell)].apply(tuple, axis=1) == k)]
            if part.empty:
                row.append("—")
                continue
            mean, reached = part["rounds"].mean(), int((part["rounds"] <= rounds).sum())
            means.append(mean)
            picked = ", ".join(f"{SYMBOLS.get(t, t)} {part[t].iloc[0]:g}" for t in tuned)
            miss = "" if reached == len(part) else f" [{reached}/{len(part)}]"
            row.append(f"{mean:.1f} ({picked}){miss}")
        row.append(f"{sum(means) / len(means):.2f}" if len(means) == len(keys) else "—")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def seed_scores(cells: pd.DataFrame, cell: Sequence[str]) -> pd.DataFrame:
    """(seed x arm) mean over the cells of rounds; a seed missing a cell of an arm is NaN for it."""
    n_cells = cells[list(cell)].drop_duplicates().shape[0]
    grouped = cells.groupby(["seed", "arm"])["rounds"]
    score = grouped.mean().where(grouped.count() == n_cells)
    return score.unstack("arm")


def scored_study(path: Path, arm_of: Callable, cell: Sequence[str], tuned: Sequence[str]):
    """What each study reads first: (trials, confirm cells, per-seed scores of the seeds with every
    arm in every cell, tuning trials ended, planned, R), saying so when the rule cannot be applied yet."""
    trials, planned, rounds = sweep_runs(path, arm_of, [*cell, *tuned])
    ended = int(trials[trials["stage"] == "tune"]["status"].isin(["finished", "diverged"]).sum())
    cells = confirm_cells(trials, cell, rounds, tuned)
    scores = seed_scores(cells, cell).dropna()
    if ended < planned or scores.empty:
        print(f"**Incomplete: {ended} of {planned} tuning trials have ended and {len(scores)} confirm seeds have "
              "every arm in every cell; the rule needs all of them.**\n")
    return trials, cells, scores, ended, planned, rounds


def determinism_check(cells: pd.DataFrame, cell: Sequence[str], twin_of: dict[str, str], what: str) -> str:
    """A line saying in how many confirm runs each arm of ``twin_of`` (a setting that changes nothing,
    e.g. a damping the reading never reads) gave the same rounds as its twin, the arm it maps to:
    ``what`` says which ("X gave the same rounds to target as Y")."""
    twins = cells[cells["arm"].isin(twin_of)].assign(arm=lambda f: f["arm"].map(twin_of))
    both = twins.merge(cells, on=["arm", "seed", *cell], suffixes=("", "_0"))
    return (f"\nDeterminism check: {what} in "
            f"{int((both['rounds'] == both['rounds_0']).sum())} of {len(both)} confirm runs.")


def compare_arms(scores: pd.DataFrame, pairs: Sequence[tuple[str, str, str]], rounds: int,
                 margin: float = 0.0) -> pd.DataFrame:
    """comparisons.csv's rows for (label, arm, reference) pairs of columns of ``scores``, one Holm
    family: difference arm − reference (lower is better), its interval and the adjusted one (inside
    ±R: a score lies in [1, R + 1]), verdict, power (``power_mde``)."""
    metric = Metric("score", higher_is_better=False, margin=margin, low=1.0, high=rounds + 1.0)
    family = {}   # a setting per pair keeps the pairs apart; Holm runs over all of them
    for label, arm, ref in pairs:
        for role, name in (("arm", arm), ("ref", ref)):
            family[(f"{label}: {arm} vs {ref}", role)] = scores[name].dropna().rename("score").reset_index()
    table = comparison_table(family, "ref", {"rounds": metric})
    table["setting"] = [label for label, _, _ in pairs]
    table["method"] = [arm for _, arm, _ in pairs]
    table["reference"] = [ref for _, _, ref in pairs]
    return table


def lead_change(cells: pd.DataFrame, cell: Sequence[str], along: str, arms: Sequence[str], reference: str,
                rounds: int) -> pd.DataFrame:
    """Whether each arm's lead over ``reference`` changes between the first and the last value of
    ``along``, one of the ``cell`` keys: `fedsweep report`'s own interaction test (interactions.csv's
    rows, fedsweep.reports.interactions.interaction_table) on each arm's per-seed score at those two values,
    a mean over the other cells at each. ``lead grows``: fewer rounds than the reference by more at
    the last value."""
    values = sorted(cells[along].unique())
    per_seed = {}
    for value in (values[0], values[-1]):   # inserted first, then last: the order the test reads
        scores = seed_scores(cells[cells[along] == value], cell)
        for arm in (*arms, reference):
            per_seed[(f"{value:g}", arm)] = scores[arm].dropna().rename("score").reset_index()
    metric = Metric("score", higher_is_better=False, low=1.0, high=rounds + 1.0)
    return interaction_table(per_seed, reference, {"rounds": metric})


def interactions_markdown(table: pd.DataFrame, along: str) -> str:
    lines = ["| from → to | arm | reference | seeds | change [95% CI] | adjusted CI | p (Holm) | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        lines.append(f"| {along} {r['from']} → {r['to']} | {r['method']} | {r['reference']} | {r['n_seeds']} | "
                     f"{r['change']:+.2f} [{r['ci_low']:+.2f}, {r['ci_high']:+.2f}] | "
                     f"[{r['adj_ci_low']:+.2f}, {r['adj_ci_high']:+.2f}] | {r['p_adjusted']:.3g} | {r['verdict']} |")
    return "\n".join(lines)


def power(mde: float) -> str:
    return "∞ (these seeds cannot call any)" if math.isinf(mde) else f"±{mde:.2f}"


def comparisons_markdown(table: pd.DataFrame) -> str:
    lines = ["| cells | arm | reference | seeds | difference [95% CI] | adjusted CI | p (Holm) | verdict | 80% power at |",
             "|---|---|---|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        lines.append(f"| {r['setting']} | {r['method']} | {r['reference']} | {r['n_seeds']} | "
                     f"{r['difference']:+.2f} [{r['ci_low']:+.2f}, {r['ci_high']:+.2f}] | "
                     f"[{r['adj_ci_low']:+.2f}, {r['adj_ci_high']:+.2f}] | {r['p_adjusted']:.3g} | "
                     f"{r['verdict']} | {power(r['power_mde'])} |")
    return "\n".join(lines)
