"""fedsweep's Python API end to end: one run, a sweep and its report, from Python (docs/api.md).

Run it from any folder:  python examples/api.py     (about a minute on 2 CPU cores)

It registers nothing by hand: the sweep names the lab's plugin, mylab/mylab.py beside this script,
in ``plugins:``, and uses what the plugin registers by name (the ``wine`` dataset, the ``two_layer``
model, the ``fedavg_decay`` algorithm), as a sweep file would. It prints:

1. one run of FedAvg-with-decay: its summary, and test accuracy and train loss at each evaluation;
2. the sweep's trials, one row each (method, the swept ``model.options.width``, seed, status and the
   numbers the run ended with), then their mean best accuracy per method and width;
3. from the sweep's report, each method against FedAvg at its best width, paired by seed
   (comparisons.csv: the difference, its 95% CI, the Holm-adjusted p and the verdict).

Like the commands, it writes into the working folder: ./mlflow.db (every run and the sweep:
``fedsweep ui`` opens them), ./fedsweep_runs/ (the sweep's state) and ./reports/api_mylab/ (the report).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

import fedsweep

PLUGIN = str(Path(__file__).resolve().parent / "mylab" / "mylab.py")   # a dict's paths: from the working folder

BASE = {
    "rounds": 20, "clients_per_round": 4,
    "data": {"name": "wine", "num_clients": 8, "partition": {"kind": "dirichlet", "alpha": 0.5}},
    "model": {"name": "two_layer", "options": {"width": 16}},
    "local": {"steps": 5, "batch_size": 8, "lr": 0.05},
    "heterogeneity": {"kind": "stragglers", "rho": 0.5},
    "eval": {"every": 2, "target_accuracy": 0.9},
}

SWEEP = {
    "name": "api_mylab",              # a sweep given as a dict needs a name: its folder, lock and MLflow experiment
    "plugins": [PLUGIN],
    "base": BASE,
    "grid": {"model.options.width": [16, 64]},
    "methods": {"fedavg": {}, "fedavg_decay": {}},
    "seeds": [0, 1, 2],               # 2 widths x 2 methods x 3 seeds: 12 trials
}


def main() -> None:
    pd.set_option("display.width", 160)
    pd.set_option("display.max_columns", 12)

    run = fedsweep.run({**BASE, "plugins": [PLUGIN]}, {"algorithm.name": "fedavg_decay", "local.lr": 0.1})
    print(run)
    print(run.history[["test/accuracy", "train/loss"]], end="\n\n")

    trials = fedsweep.tune(SWEEP, report=False)   # quiet; the report is made below, with its tables
    print(trials[["method", "model.options.width", "seed", "status", "best_test_accuracy", "rounds_to_target"]])
    print(trials.groupby(["method", "model.options.width"])["best_test_accuracy"].mean().round(4), end="\n\n")

    report = fedsweep.report(SWEEP)
    print(report)
    print(report.comparisons[["metric", "method", "reference", "n_seeds", "difference", "ci_low", "ci_high",
                              "p_adjusted", "verdict"]])


if __name__ == "__main__":
    main()
