"""Selection reads the validation split, never test (docs/sweeps.md, "Selection and the confirm stage"):
the report's best config, a confirm stage's configs, ASHA's and optuna's metric; test only scores.
And the whole protocol end to end: a real sweep with an A/A pair (FedCM with α = 1 makes FedAvg's
updates), a clearly worse arm, a validation split and a confirm stage gets the right verdicts."""
from __future__ import annotations

import csv
import re
import time

import pytest
import yaml

from fedsweep.cli import main
from fedsweep.config.schema import ConfigError
from fedsweep.reports.trials import best_configs, config_table, load_trials, selected_configs
from fedsweep.sweep.checks import select_on_validation
from fedsweep.sweep.spec import expand, load_sweep

SWEEP, EXPERIMENT = "sel", "sel-exp"
# config -> per seed (best validation accuracy, its round's test accuracy, best test accuracy,
# validation rounds to 0.8, test rounds to 0.8). On validation lr 0.1 wins; on test lr 0.05 would.
RUNS = {
    ("fedavg", 0.05): [(0.80, 0.95, 0.97, 40, 12), (0.81, 0.94, 0.96, 42, 14)],
    ("fedavg", 0.1): [(0.90, 0.85, 0.86, 10, 30), (0.91, 0.84, 0.85, 12, 32)],
    ("fedprox", 0.05): [(0.70, 0.96, 0.98, None, 10), (0.71, 0.96, 0.98, None, 11)],
    ("fedprox", 0.1): [(0.88, 0.80, 0.81, 20, 40), (0.89, 0.79, 0.80, 21, 41)],
}


def store(tmp_path, runs=RUNS, flip_test: bool = False) -> str:
    """A sweep's runs in a real MLflow store, laid out as `fedsweep tune` writes them; ``flip_test``
    swaps which config looks best on every test metric (selection must not notice)."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment(EXPERIMENT, artifact_location=(tmp_path / "art").as_uri())
    parent = client.create_run(exp).info.run_id
    now = int(time.time() * 1000)
    for (method, lr), seeds in runs.items():
        other = runs[(method, 0.1 if lr == 0.05 else 0.05)]
        for seed, values in enumerate(seeds):
            val, test_at_val, best_test, val_rtt, rtt = values
            if flip_test:
                _, test_at_val, best_test, _, rtt = other[seed]
            run = client.create_run(exp, tags={"mlflow.parentRunId": parent, "fedsweep.role": "trial",
                                               "fedsweep.sweep": SWEEP, "fedsweep.method": method,
                                               "fedsweep.config_id": f"{method}-{lr}", "fedsweep.status": "finished"})
            summary = {"best/val_accuracy": val, "summary/best_val_accuracy": val,
                       "summary/test_accuracy_at_best_val": test_at_val, "summary/final_val_accuracy": val,
                       "best/test_accuracy": best_test, "summary/best_test_accuracy": best_test,
                       "summary/final_test_accuracy": best_test, "summary/rounds": 60, "summary/target_accuracy": 0.8,
                       **({"val_rounds_to_target": val_rtt} if val_rtt else {}),
                       **({"rounds_to_target": rtt} if rtt else {})}
            client.log_batch(run.info.run_id, metrics=[Metric(k, float(v), now, 0) for k, v in summary.items()],
                             params=[Param("seed", str(seed)), Param("algorithm.name", method),
                                     Param("local.lr", str(lr))])
            client.set_terminated(run.info.run_id)
    return uri


def picked(uri) -> dict:
    best = best_configs(config_table(load_trials(uri, EXPERIMENT, SWEEP), ()))
    return dict(zip(best["method"], best["config"]))


def test_the_best_config_is_chosen_on_validation_and_scored_on_test(tmp_path):
    uri = store(tmp_path)
    configs = config_table(load_trials(uri, EXPERIMENT, SWEEP), ())
    assert configs.attrs["selected_on"] == "validation"
    best = best_configs(configs)
    assert dict(zip(best["method"], best["config"])) == {"fedavg": "local.lr=0.1", "fedprox": "local.lr=0.1"}
    fedavg = best.set_index("method").loc["fedavg"]
    assert fedavg["acc_mean"] == pytest.approx(0.845)       # test accuracy at the best validation round
    assert fedavg["rtt_mean"] == pytest.approx(31)          # rounds to target on test: reported, not selected on


def test_no_selection_reads_a_test_metric(tmp_path):
    """Every test metric made to favour the other config: the same configs are selected (a selection
    that read any test metric would flip), for the report and for a confirm stage alike."""
    assert picked(store(tmp_path / "a")) == picked(store(tmp_path / "b", flip_test=True))
    first = selected_configs(store(tmp_path / "c"), EXPERIMENT, SWEEP, ())
    again = selected_configs(store(tmp_path / "d", flip_test=True), EXPERIMENT, SWEEP, ())
    assert list(first["config_id"]) == list(again["config_id"]) == ["fedavg-0.1", "fedprox-0.1"]


def _sweep(tmp_path, **over):
    spec = {"base": {"rounds": 4, "data": {"num_clients": 8, "validation_fraction": 0.1}, "clients_per_round": 4,
                     "eval": {"target_accuracy": 0.5}},
            "grid": {"local.lr": [0.05, 0.1]}, **over}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(spec))
    sweep = load_sweep(path)
    return sweep, expand(sweep), str(path)


def test_asha_and_optuna_select_on_validation_where_there_is_one(tmp_path):
    sweep, trials, path = _sweep(tmp_path, scheduler={"grace_period": 2},
                                 search={"space": {"server.lr": {"uniform": [0.5, 1.5]}}, "num_samples": 2,
                                         "searcher": "optuna"})
    select_on_validation(sweep, trials, path)
    assert sweep.scheduler.metric == "val/accuracy" and sweep.search.metric == "best/val_accuracy"
    sweep, trials, path = _sweep(tmp_path, scheduler={"metric": "test/accuracy"})
    with pytest.raises(ConfigError, match=r"scheduler.metric: 'test/accuracy' reads the test split, which only "
                                          r"scores runs; with a validation split selection reads 'val/accuracy'"):
        select_on_validation(sweep, trials, path)
    sweep, trials, path = _sweep(tmp_path, scheduler={"metric": "rounds_to_target", "mode": "min"})
    with pytest.raises(ConfigError, match="'val_rounds_to_target'"):
        select_on_validation(sweep, trials, path)


@pytest.mark.usefixtures("fresh_home")
def test_an_a_a_pair_reads_equivalent_and_a_worse_arm_worse(tmp_path, monkeypatch):
    """FedCM with α = 1 makes exactly FedAvg's updates (the same model, round by round, at a seed):
    `equivalent`, its adjusted interval [0, 0]; FedProx with a proximal weight that pins clients to the
    server's model barely learns: `worse` on accuracy and on rounds to target (censored on every seed),
    with an adjusted interval on the bad side. Selected on validation, scored on the eight confirm
    seeds (the fewest whose smallest p, 2/256, passes Holm's 0.05/4); the best-config table and the
    parent run's metrics are those seeds' test accuracy at their best validation round."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    confirm = list(range(10, 18))
    spec = {"name": "aa",
            "base": {"rounds": 30, "clients_per_round": 4, "device": "cpu", "model": {"name": "mlp", "options": {"hidden": 32}},
                     "data": {"name": "digits", "num_clients": 8, "partition": {"kind": "iid"},
                              "validation_fraction": 0.1},
                     "local": {"steps": 3, "batch_size": 10, "lr": 0.1}, "eval": {"every": 1, "target_accuracy": 0.6}},
            "methods": {"fedavg": {}, "fedcm": {"algorithm.alpha": [1.0]}, "fedprox": {"algorithm.mu": [1000.0]}},
            "grid": {"local.lr": [0.05, 0.1]},
            "seeds": [0], "confirm": {"seeds": confirm}, "max_concurrent": 2,
            "pack": 4}   # the confirm stage packed too (its 24 runs in packs of up to 4: the same numbers)
    (tmp_path / "aa.yaml").write_text(yaml.safe_dump(spec))
    assert main(["tune", str(tmp_path / "aa.yaml")]) == 0
    assert main(["report", str(tmp_path / "aa.yaml")]) == 0
    rows = list(csv.DictReader(open(tmp_path / "reports" / "aa" / "comparisons.csv")))
    verdicts = {(r["method"], r["metric"]): r for r in rows}
    for metric in ("summary/test_accuracy_at_best_val", "rounds_to_target"):
        same = verdicts[("fedcm", metric)]
        assert same["n_seeds"] == "8"                                 # the confirm seeds, paired
        assert same["verdict"] == "equivalent" and float(same["adj_ci_low"]) == float(same["adj_ci_high"]) == 0
        worse = verdicts[("fedprox", metric)]
        assert worse["verdict"] == "worse"
        assert (float(worse["adj_ci_high"]) < 0) if metric != "rounds_to_target" else (float(worse["adj_ci_low"]) > 0)
    assert verdicts[("fedprox", "rounds_to_target")]["censored_method"] == "8"
    text = (tmp_path / "reports" / "aa" / "report.md").read_text()
    assert "selected on the validation split" in text and "comes from its confirm runs" in text
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("aa").experiment_id
    runs = client.search_runs([exp], filter_string="tags.`fedsweep.stage` = 'confirm'")
    chosen = set(selected_configs(uri, "aa", "aa", ())["config_id"])
    assert len(runs) == 24 and {r.data.tags["fedsweep.config_id"] for r in runs} == chosen   # 3 methods x 8 seeds
    # the headline number: the confirm runs' test accuracy at their best validation round, not the best over rounds
    parent = client.search_runs([exp], filter_string="tags.`fedsweep.role` = 'sweep'")[0]
    optimistic = 0
    for method in ("fedavg", "fedcm"):
        mine = [r.data.metrics for r in runs if r.data.params["algorithm.name"] == method]
        at_best_val = sum(m["summary/test_accuracy_at_best_val"] for m in mine) / 8
        assert parent.data.metrics[f"{method}/test_accuracy"] == pytest.approx(float(f"{at_best_val:.4g}"))
        assert f"{at_best_val:.4f} [" in text
        optimistic += sum(m["best/test_accuracy"] > m["summary/test_accuracy_at_best_val"] for m in mine)
    assert optimistic > 0                                  # the best over rounds would have read higher
    assert parent.data.metrics["fedprox/test_accuracy"] == 0   # diverged on every seed: scored 0
    # each verdict on the parent run, as a tag in words and its adjusted interval as metrics
    assert parent.data.tags["verdict/fedprox/acc"].startswith("worse -0.")
    assert parent.data.tags["verdict/fedprox/acc"].endswith("] · 8 seeds") and parent.data.tags["verdict/reference"] == "fedavg"
    assert parent.data.metrics["fedprox/test_accuracy_adj_high"] < 0 < parent.data.metrics["fedprox/rounds_to_target_adj_low"]
    assert parent.data.tags["verdict/fedcm/rounds"] == "equivalent +0.0 [+0.0, +0.0] · 8 seeds"
    # the sweep's counts, every trial's: 6 tuning (3 methods x 2 lr, seed 0) and 24 confirm runs
    assert (parent.data.tags["sweep.trials"], parent.data.tags["sweep.seeds"]) == ("30", "[0]")
    assert parent.data.tags["sweep.confirm_seeds"] == str(confirm)
    note = parent.data.tags["mlflow.note.content"]
    assert note.startswith("## Verdicts against fedavg") and "\\[" in note
    assert not re.search(r"(?<!\\)[\[\]]", note)          # every bracket escaped: no `[a, b] (x)` reads as a link
    assert sorted({int(r.data.params["seed"]) for r in runs}) == confirm

