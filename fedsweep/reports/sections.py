"""The report's prose sections around its tables: how the comparisons are read, the lead's change with a
setting, the descriptive aggregate across settings, and which split selected and scored the configs."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedsweep.reports.tables import _comparisons_table, _interactions_table, _score_label
from fedsweep.reports.trials import score_column
from fedsweep.runs.summary import own_metric


def _comparison_lines(comparisons, reference: str | None, resolution: float) -> list[str]:
    """The report's "Comparisons with <reference>" section: the verdict table and how to read it."""
    if reference is None:
        return ["## Comparisons", "", "No reference method, so no verdicts: set `report.reference` (default "
                "`fedavg` where the sweep has it).", ""]
    tested = int(comparisons["p_adjusted"].notna().sum())
    margins = ", ".join(f"{m} ±{g:g}" for m, g in comparisons.groupby("metric")["margin"].first().items())
    how = (
        f"Each method's selected config against {reference}'s under the same setting, on the seeds both ran "
        f"(paired by seed); `difference` is the method's minus {reference}'s. Accuracy: the mean paired "
        "difference and the exact paired sign-flip permutation test. Rounds to target: the Hodges–Lehmann "
        "estimate (median of the differences' Walsh averages) and the exact signed-rank test; a run that never "
        "reached the target is censored and counts as later than every run that did (`censored`: such runs of "
        f"the method / of {reference}). Each interval is its test inverted, so it holds 0 exactly when its test "
        "does not reject; with n seeds no test goes below p = 2 / 2^n (0.0625 at 5 seeds, whose intervals are "
        f"then the whole range). `p (Holm)`: adjusted over the {tested} tested comparisons of this report; "
        "`adjusted CI`: at the level Holm's step-down tested the comparison, so a verdict never contradicts it. "
        "`better`/`worse`: the adjusted CI excludes 0, on the metric's good or bad side (higher accuracy, fewer "
        f"rounds); `equivalent`: it lies inside the margin ({margins}); `inconclusive`: neither, the seeds "
        "cannot tell (not evidence of no difference); `not tested`: fewer than two paired seeds."
        + (f" Rounds are seen every {resolution:g} rounds: an adjusted CI inside ±{resolution:g} is never called "
           "better or worse (`below resolution`)." if resolution > 1 else "")
        + " `80% power at`: the difference these seeds would call with 80% power after adjustment (at α/m; "
        "∞: these seeds cannot reach that level). `comparisons.csv` holds every column.")
    figure = ["![each method against the reference: paired difference and adjusted interval](comparisons.png)", ""] \
        if len(comparisons) else []
    return [f"## Comparisons with {reference}", "", *figure, how, "",
            _comparisons_table(comparisons) if len(comparisons) else "No method to compare.", "",
            *(["The same verdicts as a LaTeX (booktabs) table: `verdicts.tex`.", ""] if len(comparisons) else [])]


def _across_settings(values, configs: pd.DataFrame, reference: str | None, several: bool, out: Path,
                     sweep: str) -> list[str]:
    """The report's descriptive "Across settings" section and ``profile.png`` (reports/aggregate.py), where
    there are several settings and the score is higher-better (not an algorithm's own metric of ``mode:
    min``)."""
    from fedsweep.reports.aggregate import aggregate_lines, aggregate_table, profile_png
    metric = configs.attrs.get("metric")
    if not several or (metric and own_metric(metric) and configs.attrs.get("mode") == "min"):
        return []
    column = score_column(configs.attrs["selected_on"], metric)
    label = _score_label(configs.attrs)
    table = aggregate_table(values, column, reference)
    if not len(table):
        return []
    table.to_csv(out / "aggregate.csv", index=False)
    profile_png(values, column, out / "profile.png", label, title=f"{sweep}: performance profile")
    return aggregate_lines(table, reference, label)


def _interaction_lines(interactions: pd.DataFrame, key: str) -> list[str]:
    """The report's "Does the lead change with <key>?" section."""
    first, last = interactions.iloc[0]["from"], interactions.iloc[0]["to"]
    how = (f"Whether a method's lead over {interactions.iloc[0]['reference']} is larger at {last} than at {first}: "
           "per seed, the method's paired difference at the last value minus the one at the first (`change`), "
           "tested as the comparisons are (accuracy: sign-flip on the mean; rounds: signed-rank and "
           "Hodges–Lehmann, censored runs last) on the seeds all four runs share, Holm over these rows (a family of "
           "their own). `lead grows`: the adjusted interval lies on the side where the method gains at the last "
           "value (more accuracy, fewer rounds); `lead shrinks`: the other side; `inconclusive`: neither. A lead "
           "read from two point estimates is not this test. `interactions.csv` holds every column.")
    return [f"## Does the lead change with {key}?", "", how, "", _interactions_table(interactions), ""]


def _splits_text(split: str, best: pd.DataFrame, trials: pd.DataFrame) -> str:
    """Which split selected each method's config and which runs its numbers come from."""
    tuning = trials[trials["stage"] == "tune"] if "stage" in trials else trials
    if not tuning["status"].isin(["finished", "stopped"]).any():
        return "nothing was selected: every tuning run diverged or failed, so none has a result to select by"
    metric = best.attrs.get("metric")
    if metric and own_metric(metric):
        chose = (f"selected and scored by `{metric}`, the algorithm's own metric on training data (each run's "
                 "value at its end): no test data enters selection" + ("; the test numbers beside it come from "
                 "the same runs" if split == "validation" else ""))
    elif split == "validation" and metric:
        kind, _, name = metric.partition("/")
        chose = (f"selected on the validation split (the best `{kind}/val_{name}` over the evaluations); scored "
                 f"on the test split, each run's `{metric}` at its round of best `{kind}/val_{name}`")
    elif split == "validation":
        chose = ("selected on the validation split (best validation accuracy; rounds to the target on "
                 "validation); scored on the test split, each run at its round of best validation accuracy")
    else:
        chose = ("selected and scored on the test split: these runs have no validation split "
                 "(`data.validation_fraction`), so each best config's numbers are optimistic")
    confirmed = (best["scored_on"] == "confirm").all()
    if confirmed:
        return f"{chose}; every number of a best config comes from its confirm runs (fresh seeds), not the seeds it was selected on"
    if (best["scored_on"] == "confirm").any():
        return f"{chose}; best configs with confirm runs are scored on them, the others on their tuning seeds"
    return (f"{chose}; the numbers come from the tuning seeds the configs were selected on (no `confirm:` stage), "
            "so the best of several configs is favoured by its seeds' luck (the winner's curse)")
