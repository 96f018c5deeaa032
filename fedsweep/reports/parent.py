"""The report on the sweep's MLflow parent run: where users compare, the answer is one row.

``fedsweep report`` (and ``tune`` at its end) logs the report's files under the parent run's
``report/`` artifacts (report.md, its plots, trials.csv, comparisons.csv), its selected result per
method and setting as the parent's metrics, and the best-config table as the run's description (the
MLflow UI shows it on the run's page). Metric names: ``<method>[ <setting>]/<what>``, the setting in
the short form of run names (``fedlga ρ0.5/rounds_to_target``), so that the runs table's columns
group them by method; values are rounded to 4 significant digits (the UI shows them whole). Each
comparison with the reference is there too: its difference and adjusted interval as metrics
(``<what>_difference``, ``<what>_adj_low``, ``<what>_adj_high``) and its verdict, in words, as a tag
whose key the UI shows whole, ``verdict/<method>[ <setting>]/<acc|rounds>`` ("worse −0.0412 [−0.0590,
−0.0230] · 8 seeds"; the reference in ``verdict/reference``). The description opens on the verdicts'
table; its brackets are escaped (the UI's markdown reads ``[a, b] (x)`` as a link). The sweep's tags
``sweep.trials`` and ``sweep.seeds`` count every trial and tuning seed, ``sweep.confirm_seeds`` the
confirm stage's.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

#: The report's files that go onto the parent run (the plots: every PNG it wrote).
FILES = ("report.md", "trials.csv", "comparisons.csv", "verdicts.tex")
#: MLflow 3.17 keeps a tag value (the description) up to this many characters.
NOTE_LIMIT = 8000


def parent_run_id(trials: pd.DataFrame) -> str | None:
    """The sweep's parent run: that of its newest trial (an older parent, of a sweep started over,
    holds older trials)."""
    have = trials.dropna(subset=["parent_run_id"])
    if have.empty:
        return None
    return str(have.sort_values("start_time").iloc[-1]["parent_run_id"])


def metric_name(method: str, setting: str, what: str) -> str:
    import re
    name = f"{method} {setting}/{what}" if setting else f"{method}/{what}"
    return re.sub(r"[^/\w.\- :]", "_", name)    # what MLflow allows in a metric's name


def selected_metrics(best: pd.DataFrame) -> dict[str, float]:
    """Each method's selected config per setting: its scored accuracy and rounds to target (means
    over the seeds it is scored on), as parent metrics."""
    settings = best.attrs["settings"]
    out = {}
    for _, r in best.iterrows():
        setting = _short_setting(r, settings)
        for what, column in (("test_accuracy", "acc_ci"), ("rounds_to_target", "rtt_ci")):
            interval = r.get(column)
            if interval is not None and not _missing(interval.mean):
                out[metric_name(r["method"], setting, what)] = float(f"{interval.mean:.4g}")
        out[metric_name(r["method"], setting, "seeds_reached_target")] = float(r["reached"])
    return out


def verdict_entries(best: pd.DataFrame, comparisons: pd.DataFrame) -> tuple[dict[str, float], dict[str, str]]:
    """(metrics, tags) of each comparison of ``comparisons`` on the parent run (module docstring)."""
    from fedsweep.reports.trials import _setting_label
    settings = best.attrs["settings"]
    where = {_setting_label(r, settings) or "all": _short_setting(r, settings) for _, r in best.iterrows()}
    metrics, tags = {}, {}
    for _, c in comparisons.iterrows():
        what = "rounds_to_target" if c["metric"] == "rounds_to_target" else "test_accuracy"
        digits = 1 if what == "rounds_to_target" else 4
        name = metric_name(c["method"], where.get(c["setting"], ""), what)
        for part, value in (("difference", c["difference"]), ("adj_low", c["adj_ci_low"]), ("adj_high", c["adj_ci_high"])):
            if not _missing(value):
                metrics[f"{name}_{part}"] = float(f"{value:.4g}")
        shown = "" if _missing(c["adj_ci_low"]) else (f" {c['difference']:+.{digits}f} [{c['adj_ci_low']:+.{digits}f}, "
                                                       f"{c['adj_ci_high']:+.{digits}f}]")
        key = metric_name(c["method"], where.get(c["setting"], ""), "rounds" if digits == 1 else "acc")
        tags[f"verdict/{key}"] = f"{c['verdict']}{shown} · {int(c['n_seeds'])} seeds"
        tags["verdict/reference"] = str(c["reference"])
    return metrics, tags


def sweep_counts(trials: pd.DataFrame) -> dict[str, str]:
    """The parent's ``sweep.trials`` (every trial, confirm runs too), ``sweep.seeds`` (the tuning stage's)
    and ``sweep.confirm_seeds`` (the confirm stage's, where it ran), as the runs in the store have them."""
    stage = trials["stage"] if "stage" in trials else pd.Series("tune", index=trials.index)
    seeds = {s: sorted(int(x) for x in trials.loc[stage == s, "seed"].dropna().unique()) for s in ("tune", "confirm")}
    return {"sweep.trials": str(len(trials)), "sweep.seeds": str(seeds["tune"]),
            **({"sweep.confirm_seeds": str(seeds["confirm"])} if seeds["confirm"] else {})}


def _short_setting(row, settings) -> str:
    """A row of ``best``'s setting values in the short form of run names (``ρ0.5``), as metric names use."""
    from fedsweep.config.names import short
    return " ".join(short(k, row[k]) for k in settings if k in row and not _missing(row[k]))


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def log_to_parent(client, run_id: str, out_dir: Path, best: pd.DataFrame, note: str,
                  comparisons: pd.DataFrame | None = None, trials: pd.DataFrame | None = None) -> None:
    """Replace the parent run's ``report/`` artifacts with ``out_dir``'s files, log the selected
    results as metrics, ``note`` (markdown) as its description and, with ``trials``, the sweep's counts."""
    import tempfile

    from mlflow.entities import Metric, RunTag
    out_dir = Path(out_dir)
    files = [out_dir / f for f in FILES if (out_dir / f).exists()] + sorted(out_dir.glob("*.png"))
    with tempfile.TemporaryDirectory(prefix="fedsweep-report-") as tmp:   # only the report's own files
        for f in files:
            (Path(tmp) / f.name).write_bytes(f.read_bytes())
        client.log_artifacts(run_id, tmp, artifact_path="report")
    import time
    now = int(time.time() * 1000)
    verdict_metrics, verdict_tags = verdict_entries(best, comparisons) if comparisons is not None else ({}, {})
    metrics = [Metric(k, v, now, 0) for k, v in {**selected_metrics(best), **verdict_metrics}.items()]
    if len(note) > NOTE_LIMIT:
        note = note[:NOTE_LIMIT - 80].rsplit("\n", 1)[0] + "\n\n… (cut: the whole report is report/report.md)"
    for i in range(0, len(metrics), 1000):   # MLflow takes 1,000 metrics a call
        client.log_batch(run_id, metrics=metrics[i:i + 1000])
    counts = sweep_counts(trials) if trials is not None else {}
    tags = [RunTag("mlflow.note.content", note), RunTag("fedsweep.reports", "report/report.md"),
            *(RunTag(k[:250], v) for k, v in {**verdict_tags, **counts}.items())]
    for i in range(0, len(tags), 100):   # MLflow takes 100 tags a call
        client.log_batch(run_id, tags=tags[i:i + 100])


def note_text(lines: list[str], verdicts: list[str] | None = None) -> str:
    """The parent run's description: ``verdicts`` (the verdict table's lines) first, then the report's
    text down to its all-configs table, without the images (the run's artifacts hold them, under
    report/), its brackets escaped so that no ``[a, b] (x)`` reads as a link."""
    kept = []
    for line in [*(verdicts or []), *lines]:
        if line.startswith("## All configs"):
            break
        if not line.startswith("!["):
            kept.append(line.replace("[", "\\[").replace("]", "\\]"))
    return "\n".join(kept).strip() + "\n\nThe whole report, its plots and tables: this run's artifacts, report/."
