"""One MLflow run per config, holding fedsweep's numbers: what the sweep's view in the MLflow UI opens on.

MLflow's runs table groups and averages only the runs it has loaded (100 a page), so a view that
groups trial runs by config miscounts a sweep of more than 100 runs, and nothing says so. Instead
``fedsweep report`` (and ``tune`` at its end) writes, as children of the sweep's parent run, one run
per config (tag ``fedsweep.role = config``) with the report's own numbers, rounded to 4 significant
digits (rounds to 2 decimals):

* ``fedsweep.stage = selected``: each method's selected config under each setting, scored as the
  report scores it (on the confirm stage's seeds where there is one): ``score/mean``, ``score/ci_low``,
  ``score/ci_high`` (the report's score: ``report.metric``, or test accuracy), with a target
  ``rounds/mean``, ``rounds/ci_low``, ``rounds/ci_high``, ``rounds/reached``; ``seeds``; and against the
  reference, paired by seed, ``vs_reference/difference``, ``vs_reference/adj_low``,
  ``vs_reference/adj_high`` (Holm-adjusted) with its verdict as the tag ``verdict`` (``vs_rounds/*``
  and ``verdict_rounds`` for rounds to target);
* ``fedsweep.stage = tuning``: every tuning config: ``selects`` (what selection ranks it by, on
  validation where runs have it; ``selects_rounds`` with a target), ``score/mean``, ``score/std``,
  ``rounds/mean``, ``rounds/reached``, ``seeds``, ``rank`` within its method and setting.

Each run's params are its method (``algorithm.name``), the settings and the tuned keys, so the view shows
the setting as a column. A later report updates these runs in place (matched by the tag
``fedsweep.config_key``) and deletes those it no longer has (a config no longer selected).
"""
from __future__ import annotations

import math
import time

import pandas as pd

ROLE = "config"
#: MLflow takes this many metrics, params and tags in one call.
BATCH = 100


def _round(name: str, v) -> float | None:
    """4 significant digits (rounds: 2 decimals); a float's noise around 0 (−1.9e−09) is 0."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if "rounds" in name:
        return round(float(v), 2) + 0.0
    return 0.0 if abs(float(v)) < 1e-9 else float(f"{float(v):.4g}")


def _interval(prefix: str, interval) -> dict:
    if interval is None:
        return {}
    return {f"{prefix}/mean": interval.mean, f"{prefix}/ci_low": interval.low, f"{prefix}/ci_high": interval.high}


def _params(row, settings, tuned) -> dict[str, str]:
    from fedsweep.reports.trials import _fmt_value
    out = {"algorithm.name": str(row["method"])}
    for k in settings:
        if k in row and not pd.isna(row[k]):
            out[k] = _fmt_value(row[k])
    for k in tuned:
        value = row.get(f"param:{k}")
        if value is not None and not pd.isna(value):
            out[k] = _fmt_value(value)
    return out


def config_rows(trials: pd.DataFrame, configs: pd.DataFrame, best: pd.DataFrame,
                comparisons: pd.DataFrame | None) -> list[dict]:
    """One dict per config run: ``key``, ``name``, ``params``, ``metrics`` (rounded; None dropped), ``tags``."""
    from fedsweep.reports.trials import _setting_label
    settings, tuned = configs.attrs.get("settings", []), configs.attrs.get("tuned", [])
    target = configs.attrs.get("rule") == "target"
    from fedsweep.reports.stats import _key
    labels = trials[trials["stage"] != "confirm"].groupby("config_id")["config_label"].first().to_dict() \
        if "config_label" in trials else {}

    def name(r) -> str:   # the runs' name less the seed, as the trials' fedsweep.config tag has it
        return labels.get(r["config_id"]) or f"{r['method']} {r['config'] or ''}".strip()
    rows = []
    for _, r in configs.iterrows():
        setting = _setting_label(r, settings)
        metrics = {"selects": r["sel_acc_mean"], "score/mean": r["acc_mean"], "score/std": r["acc_std"],
                   "seeds": r["n"], "rank": r["rank"]}
        if target:
            metrics.update({"selects_rounds": r["sel_rtt_mean"], "rounds/mean": r["rtt_mean"],
                            "rounds/reached": r["reached"]})
        rows.append({"key": f"tuning/{r['config_id']}/{setting}", "stage": "tuning",
                     "name": name(r), "params": _params(r, settings, tuned), "metrics": metrics,
                     "tags": {"fedsweep.config_id": str(r["config_id"]), "selected": "yes" if r["rank"] == 1 else "no"}})
    called: dict[tuple, list] = {}
    for _, c in (comparisons if comparisons is not None else pd.DataFrame()).iterrows():
        called.setdefault((c["setting"], c["method"]), []).append(c)
    reference = comparisons["reference"].iloc[0] if called else None
    for _, r in best.iterrows():
        setting = _setting_label(r, settings)
        metrics = {**_interval("score", r.get("acc_ci")), "seeds": r["n"]}
        if target:
            metrics.update({**_interval("rounds", r.get("rtt_ci")), "rounds/reached": r["reached"]})
        tags = {"fedsweep.config_id": str(r["config_id"]), "scored_on": str(r["scored_on"])}
        for c in called.get(_key(r, settings), []):
            prefix, tag = ("vs_rounds", "verdict_rounds") if c["metric"] == "rounds_to_target" else ("vs_reference", "verdict")
            metrics.update({f"{prefix}/difference": c["difference"], f"{prefix}/adj_low": c["adj_ci_low"],
                            f"{prefix}/adj_high": c["adj_ci_high"]})
            tags[tag] = str(c["verdict"])
        if called and r["method"] == reference:
            tags["verdict"] = "reference"
        rows.append({"key": f"selected/{r['config_id']}/{setting}", "stage": "selected",
                     "name": name(r), "params": _params(r, settings, tuned), "metrics": metrics, "tags": tags})
    for row in rows:
        row["metrics"] = {k: v for k, v in ((k, _round(k, v)) for k, v in row["metrics"].items()) if v is not None}
    return rows


def write_config_runs(client, experiment_id: str, parent_id: str, sweep: str, rows: list[dict]) -> None:
    """Make the store's config runs of ``sweep`` those of ``rows``: update the ones it has (by key),
    create the others under ``parent_id``, delete the rest."""
    from mlflow.entities import Metric, Param, RunTag
    have, token = {}, None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token, filter_string=(
            f"tags.`fedsweep.role` = '{ROLE}' and tags.`fedsweep.sweep` = '{sweep}'"))
        have.update({r.data.tags.get("fedsweep.config_key"): r for r in page})
        token = page.token
        if not token:
            break
    now = int(time.time() * 1000)
    for row in rows:
        tags = {**row["tags"], "fedsweep.role": ROLE, "fedsweep.sweep": sweep, "fedsweep.stage": row["stage"],
                "fedsweep.config_key": row["key"], "mlflow.parentRunId": parent_id}
        old = have.pop(row["key"], None)
        if old is None:
            run_id = client.create_run(experiment_id, start_time=now, tags=tags, run_name=row["name"][:250]).info.run_id
            params = [Param(k[:250], v[:6000]) for k, v in row["params"].items()]
        else:
            run_id = old.info.run_id
            params = [Param(k[:250], v[:6000]) for k, v in row["params"].items() if k not in old.data.params]
            for gone in set(old.data.tags) - set(tags):
                if not gone.startswith("mlflow."):
                    client.delete_tag(run_id, gone)
        metrics = [Metric(k, v, now, 0) for k, v in row["metrics"].items()]
        for stale in set(old.data.metrics if old is not None else ()) - set(row["metrics"]):
            metrics.append(Metric(stale, math.nan, now, 0))   # MLflow deletes no metric: marked not measured
        tag_list = [RunTag(k, v) for k, v in tags.items()]
        for i in range(0, max(len(metrics), len(params), len(tag_list)), BATCH):
            client.log_batch(run_id, metrics=metrics[i:i + BATCH], params=params[i:i + BATCH],
                             tags=tag_list[i:i + BATCH])
        if old is None or old.info.status != "FINISHED":
            client.set_terminated(run_id, status="FINISHED", end_time=now)
    for old in have.values():   # configs this report no longer has
        client.delete_run(old.info.run_id)
