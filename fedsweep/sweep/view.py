"""The sweep's saved view in the MLflow UI: one row per config with the mean over its seeds.

MLflow 3.17 keeps a runs table's saved views as experiment tags (``mlflow.sharedViewState.<key>``:
a name and the table's state, zlib-compressed JSON) and opens one from its *Views* menu or from the
address ``#/experiments/<id>/runs?viewStateShareKey=<key>``. ``tune`` writes one per sweep: the
sweep's trial runs (not its parent, which Group by would put in an "Unassigned" group), grouped by
the ``fedsweep.config`` tag (the run name less its seed) with the average over seeds, the metric
selection reads (on validation where runs have it), the scored ones and the swept keys as columns, sorted
by the selection metric, the run-name column wide enough for the
names, and every run in the charts (the UI's default shows the first 10). ``fedsweep ui`` prints its
address.
"""
from __future__ import annotations

import base64
import json
import re
import time
import zlib

#: Experiment tag prefix MLflow 3.17's runs page reads saved views from.
TAG_PREFIX = "mlflow.sharedViewState."
VIEW_NAME = "fedsweep: {sweep} by config"


def view_key(sweep: str) -> str:
    """The view's share key: letters, digits, ``-`` and ``_`` (it goes into the address)."""
    return "fedsweep-" + re.sub(r"[^A-Za-z0-9_-]", "_", sweep)[:200]


def view_columns(validation: bool, target: bool) -> tuple[list[str], bool]:
    """(the metrics shown, whether the first sorts ascending): first the one selection reads (fewest
    rounds to the target, else the best accuracy, on validation where runs have it), then what scores
    a config."""
    if validation:
        selects = ["summary/val_rounds_to_target", "best/val_accuracy"] if target else ["best/val_accuracy"]
        return selects + ["summary/test_accuracy_at_best_val"] + (["summary/rounds_to_target"] if target else []), target
    return (["summary/rounds_to_target", "best/test_accuracy"] if target else ["best/test_accuracy"]), target


def view_state(sweep: str, metrics: list[str], params: list[str], ascending: bool = False) -> dict:
    """The runs table's state (the fields MLflow 3.17 saves; the rest keep its defaults), sorted by
    the first of ``metrics``."""
    metric_cols = [f"metrics.`{m}`" for m in metrics]
    param_cols = [f"params.`{p}`" for p in params]
    return {
        "searchFilter": f"tags.`fedsweep.sweep` = '{sweep}' and tags.`fedsweep.role` = 'trial'",
        "orderByKey": metric_cols[0], "orderByAsc": ascending, "startTime": "ALL", "lifecycleFilter": "Active",
        "datasetsFilter": [], "modelVersionFilter": "All Runs",
        "selectedColumns": metric_cols + param_cols,
        "columnOrder": ["attributes.`Run Name`", *metric_cols, *param_cols],
        "columnWidths": {"attributes.`Run Name`": 340, **{c: 170 for c in metric_cols}},
        "runsHiddenMode": "SHOW_ALL", "viewMaximized": False, "runListHidden": False, "isAccordionReordered": False,
        "useGroupedValuesInCharts": True, "hideEmptyCharts": True,
        "groupBy": {"aggregateFunction": "average",
                    "groupByKeys": [{"mode": "tag", "groupByData": "fedsweep.config"}]},
        "groupsExpanded": {},
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
    }


def view_tag(sweep: str, state: dict) -> tuple[str, str]:
    """(tag key, tag value) of the saved view, as MLflow 3.17's *Save view* writes it."""
    now = int(time.time() * 1000)
    packed = "deflate;" + base64.b64encode(zlib.compress(json.dumps(state).encode())).decode()
    value = {"name": VIEW_NAME.format(sweep=sweep), "createdAt": now, "updatedAt": now, "state": packed}
    return TAG_PREFIX + view_key(sweep), json.dumps(value)


def read_view(value: str) -> dict:
    """The state a saved view's tag value holds (tests, and what `fedsweep ui` checks)."""
    packed = json.loads(value)["state"]
    kind, data = packed.split(";", 1)
    assert kind == "deflate", kind
    return json.loads(zlib.decompress(base64.b64decode(data)))


def write_view(client, experiment_id: str, sweep, trials) -> None:
    """Save the sweep's view on its experiment (replacing an older one of the same sweep)."""
    seen: dict[str, set] = {}
    for t in trials[:5000]:   # the keys the sweep varies, flattened as the runs' params are
        for k, v in t.config.flat().items():
            seen.setdefault(k, set()).add(str(v))
    params = [k for k, values in seen.items() if len(values) > 1 and k not in ("seed", "algorithm.name")]
    first = trials[0].config
    metrics, ascending = view_columns(first.data.validation_fraction > 0, first.eval.target_accuracy is not None)
    key, value = view_tag(sweep.name, view_state(sweep.name, metrics, ["algorithm.name", *params], ascending))
    client.set_experiment_tag(experiment_id, key, value)


def view_url(experiment_id: str, sweep: str, port: int, host: str = "127.0.0.1") -> str:
    return (f"http://{host}:{port}/#/experiments/{experiment_id}/runs?viewStateShareKey={view_key(sweep)}"
            "&workflowType=machine_learning")
