"""The metrics a sweep's trials report to Tune, which ASHA, optuna and ``report.metric`` may read, and
each test metric's validation twin (docs/sweeps.md, Selection and the confirm stage)."""
from __future__ import annotations

from fedsweep.runs.summary import CLIENT_KINDS, CLIENT_KINDS_TEXT, own_metric


#: What every report of a trial to Tune holds (``TuneReporter.report`` in sweep/trainable.py), so what a
#: scheduler or a searcher may read; ``round`` is reported too, as the scheduler's time axis.
#: ``rounds_to_target``: the first evaluated round at ``eval.target_accuracy``, else rounds + 1. The
#: ``VAL_METRICS`` (the same on val/accuracy) only where a trial has a validation split.
#: Per-client evaluation's (``eval.clients``: docs/run.md), as of the last evaluation, where the trials
#: evaluate per client: ``<model>/accuracy_<stat>`` on the clients' test data, ``<model>/val_accuracy_<stat>``
#: on their validation data.
CLIENT_TEST_METRICS = tuple(f"{kind}/accuracy_{stat}" for kind in CLIENT_KINDS
                            for stat in ("mean", "weighted", "p10", "min", "std"))
CLIENT_VAL_METRICS = tuple(m.replace("/accuracy_", "/val_accuracy_") for m in CLIENT_TEST_METRICS)
VAL_METRICS = ("val/accuracy", "val/loss", "best/val_accuracy", "val_rounds_to_target", *CLIENT_VAL_METRICS)
TUNE_METRICS = ("test/accuracy", "test/loss", "best/test_accuracy", "rounds_to_target", *CLIENT_TEST_METRICS,
                *VAL_METRICS)
#: What ``report.metric`` may name: the per-client accuracies whose larger value is better.
REPORT_METRICS = tuple(m for m in CLIENT_TEST_METRICS if not m.endswith("_std"))
#: The metrics trials report, as an error line lists them.
METRICS_TEXT = (", ".join(TUNE_METRICS[:4]) + ", " + CLIENT_KINDS_TEXT + "/accuracy_<mean|weighted|p10|min|std> "
                "(eval.clients), and on a validation split " + ", ".join(VAL_METRICS[:4]) +
                ", <model>/val_accuracy_<stat>; an algorithm's own metrics (its `metrics`, e.g. qffl/mean_Fq)")


def reported(metric: str) -> bool:
    """Whether trials report ``metric`` to Tune (so ASHA and optuna may read it)."""
    return metric in TUNE_METRICS or own_metric(metric)


#: Each test metric's validation twin: what selection reads once the trials have a validation split.
ON_VALIDATION = {"test/accuracy": "val/accuracy", "test/loss": "val/loss", "best/test_accuracy": "best/val_accuracy",
                 "rounds_to_target": "val_rounds_to_target", **dict(zip(CLIENT_TEST_METRICS, CLIENT_VAL_METRICS))}
