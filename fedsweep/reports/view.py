"""The sweep's saved views in the MLflow UI: one row per config, with fedsweep's numbers.

MLflow 3.17 keeps a runs table's saved views as experiment tags (``mlflow.sharedViewState.<key>``:
a name and the table's state, zlib-compressed JSON) and opens one from its *Views* menu or from the
address ``#/experiments/<id>/runs?viewStateShareKey=<key>``. ``tune`` (and ``report``) write two per
sweep, on the config runs the report writes (:mod:`fedsweep.reports.config_runs`), never on trial runs
grouped in the browser (MLflow averages only the runs a page has loaded, 100 at a time):

* ``fedsweep: <sweep> selected configs`` (the one ``fedsweep ui`` opens first): each method's selected
  config under each setting, its score's mean and 95% interval, seeds, and against the reference the
  paired difference, its adjusted interval and the verdict; sorted by the score (fewest rounds to the
  target where there is one);
* ``fedsweep: <sweep> tuning configs``: every tuning config, what selection ranks it by, its score,
  seeds and rank, sorted by what selection reads.

The settings, the method and the tuned keys are columns (the runs' params); every run is one row, so
every number is the report's, whatever the sweep's size.
"""
from __future__ import annotations

import base64
import json
import re
import time
import zlib

#: Experiment tag prefix MLflow 3.17's runs page reads saved views from.
TAG_PREFIX = "mlflow.sharedViewState."
VIEW_NAMES = {"selected": "fedsweep: {sweep} selected configs", "tuning": "fedsweep: {sweep} tuning configs"}


def view_key(sweep: str, stage: str = "selected") -> str:
    """The view's share key: letters, digits, ``-`` and ``_`` (it goes into the address)."""
    return "fedsweep-" + re.sub(r"[^A-Za-z0-9_-]", "_", sweep)[:200] + ("" if stage == "selected" else f"-{stage}")


def view_columns(stage: str, target: bool, compared: bool = True) -> tuple[list[str], list[str]]:
    """(metrics, tags) a stage's view shows, the one it sorts by first."""
    if stage == "tuning":
        metrics = (["selects_rounds", "selects"] if target else ["selects"]) + ["score/mean", "score/std"] + \
            (["rounds/mean", "rounds/reached"] if target else []) + ["seeds", "rank"]
        return metrics, ["selected"]
    rounds = ["rounds/mean", "rounds/ci_low", "rounds/ci_high", "rounds/reached"] if target else []
    score = ["score/mean", "score/ci_low", "score/ci_high"]
    metrics = (rounds + score if target else score) + ["seeds"]
    tags = []
    if compared:
        if target:
            metrics += ["vs_rounds/difference", "vs_rounds/adj_low", "vs_rounds/adj_high"]
            tags.append("verdict_rounds")
        metrics += ["vs_reference/difference", "vs_reference/adj_low", "vs_reference/adj_high"]
        tags.append("verdict")
    return metrics, tags


def view_state(sweep: str, stage: str, metrics: list[str], params: list[str], tags: list[str] = (),
               ascending: bool = False) -> dict:
    """The runs table's state (the fields MLflow 3.17 saves; the rest keep its defaults): the sweep's
    config runs of ``stage``, sorted by the first of ``metrics``."""
    metric_cols = [f"metrics.`{m}`" for m in metrics]
    param_cols = [f"params.`{p}`" for p in params]
    tag_cols = [f"tags.`{t}`" for t in tags]
    return {
        "searchFilter": f"tags.`fedsweep.sweep` = '{sweep}' and tags.`fedsweep.role` = 'config' and "
                        f"tags.`fedsweep.stage` = '{stage}'",
        "orderByKey": metric_cols[0], "orderByAsc": ascending, "startTime": "ALL", "lifecycleFilter": "Active",
        "datasetsFilter": [], "modelVersionFilter": "All Runs",
        "selectedColumns": param_cols + tag_cols + metric_cols,
        "columnOrder": ["attributes.`Run Name`", *param_cols, *tag_cols, *metric_cols],
        "columnWidths": {"attributes.`Run Name`": 300, **{c: 110 for c in metric_cols}},
        "runsHiddenMode": "SHOW_ALL", "viewMaximized": False, "runListHidden": False, "isAccordionReordered": False,
        "useGroupedValuesInCharts": True, "hideEmptyCharts": True, "groupBy": None, "groupsExpanded": {},
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }


def view_tag(sweep: str, state: dict, stage: str = "selected") -> tuple[str, str]:
    """(tag key, tag value) of the saved view, as MLflow 3.17's *Save view* writes it."""
    now = int(time.time() * 1000)
    packed = "deflate;" + base64.b64encode(zlib.compress(json.dumps(state).encode())).decode()
    value = {"name": VIEW_NAMES[stage].format(sweep=sweep), "createdAt": now, "updatedAt": now, "state": packed}
    return TAG_PREFIX + view_key(sweep, stage), json.dumps(value)


def read_view(value: str) -> dict:
    """The state a saved view's tag value holds (tests, and what `fedsweep ui` checks)."""
    packed = json.loads(value)["state"]
    kind, data = packed.split(";", 1)
    assert kind == "deflate", kind
    return json.loads(zlib.decompress(base64.b64decode(data)))


def write_view(client, experiment_id: str, sweep, trials) -> None:
    """Save the sweep's views on its experiment (replacing older ones of the same sweep), from its file."""
    seen: dict[str, set] = {}
    for t in trials[:5000]:   # the keys the sweep varies, flattened as the runs' params are
        for k, v in t.config.flat().items():
            seen.setdefault(k, set()).add(str(v))
    settings = [k for k in sweep.report.settings if k in seen]
    tuned = [k for k, values in seen.items() if len(values) > 1 and k not in ("seed", "algorithm.name", *settings)]
    target = trials[0].config.eval.target_accuracy is not None or sweep.report.relative_target is not None
    write_views(client, experiment_id, sweep.name, settings, tuned, target, sweep.report.mode == "min")


def write_views(client, experiment_id: str, sweep: str, settings, tuned, target: bool, lower_better: bool = False,
                compared: bool = True) -> None:
    """Both views of :mod:`fedsweep.reports.view` (module docstring) as experiment tags."""
    params = [*settings, "algorithm.name", *tuned]
    for stage in ("selected", "tuning"):
        metrics, tags = view_columns(stage, target, compared)
        key, value = view_tag(sweep, view_state(sweep, stage, metrics, params, tags, target or lower_better), stage)
        client.set_experiment_tag(experiment_id, key, value)


def view_url(experiment_id: str, sweep: str, port: int, host: str = "127.0.0.1", stage: str = "selected") -> str:
    return (f"http://{host}:{port}/#/experiments/{experiment_id}/runs?viewStateShareKey={view_key(sweep, stage)}"
            "&workflowType=machine_learning")
