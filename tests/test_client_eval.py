"""Per-client evaluation (eval.clients): each client's own test data, the global, fine-tuned and
personal models, the distribution's summaries, engines agreeing, resumes, artifacts and errors."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from conftest import resumed_run, tiny_raw

SHARDS = {"name": "digits", "num_clients": 10, "partition": {"kind": "classes", "classes_per_client": 2}}


def _raw(**over):
    return tiny_raw(**{"data": SHARDS, "eval": {"every": 2, "clients": "all"}, "rounds": 4, **over})


def _run(raw, engine="loop", **kw):
    import fedsweep
    return fedsweep.run({**raw, "engine": engine}, mlflow=False, **kw)


def test_distribution_summaries_by_hand():
    from fedsweep.runs.client_eval import distribution
    right = np.array([9.0, 1.0, 5.0, 0.0, 10.0, 4.0, 7.0, 8.0, 6.0, 3.0, 2.0])
    n = np.array([10.0, 10.0, 10.0, 0.0, 10.0, 5.0, 10.0, 10.0, 10.0, 10.0, 20.0])   # client 3 has no data
    acc = np.array([0.9, 0.1, 0.5, 1.0, 0.8, 0.7, 0.8, 0.6, 0.3, 0.1])
    got = distribution(right, n, "clients/accuracy")
    assert got["clients/accuracy_mean"] == pytest.approx(acc.mean())
    assert got["clients/accuracy_weighted"] == pytest.approx(55 / 105)
    assert got["clients/accuracy_p10"] == pytest.approx(0.1)          # the worst ⌈10% of 10⌉ = 1 client
    assert got["clients/accuracy_std"] == pytest.approx(acc.std())
    assert got["clients/accuracy_min"] == pytest.approx(0.1)
    many = distribution(np.arange(20.0), np.full(20, 20.0), "x")
    assert many["x_p10"] == pytest.approx((0 + 1) / 2 / 20)             # the worst 2 of 20
    assert distribution(np.zeros(2), np.zeros(2), "x") == {}


def test_matched_test_sets_follow_each_clients_labels():
    from fedsweep.data.client_test import evaluated_clients, matched_sets
    pool = np.repeat(np.arange(4), [30, 30, 5, 30])
    client_labels = [np.array([0, 0, 0, 1]), np.array([2, 2, 3, 3]), np.array([1])]
    sets = matched_sets(client_labels, [4, 7, 9], pool, 20, 4, seed=0)
    assert np.bincount(pool[sets[0]], minlength=4).tolist() == [15, 5, 0, 0]
    assert np.bincount(pool[sets[1]], minlength=4).tolist() == [0, 0, 5, 10]   # class 2 has only 5
    assert np.bincount(pool[sets[2]], minlength=4).tolist() == [0, 20, 0, 0]
    assert all(len(np.unique(s)) == len(s) for s in sets)
    # a client's set is its own: the same whoever else is evaluated, other at another seed
    assert np.array_equal(matched_sets(client_labels[1:2], [7], pool, 20, 4, seed=0)[0], sets[1])
    assert not np.array_equal(matched_sets(client_labels[:1], [4], pool, 20, 4, seed=1)[0], sets[0])
    drawn = evaluated_clients(3, np.arange(10), seed=0)
    assert len(drawn) == 3 and list(drawn) == sorted(set(drawn.tolist()))
    assert evaluated_clients("all", np.arange(4), seed=0).tolist() == [0, 1, 2, 3]


def test_each_clients_accuracy_is_its_own_data_scored_by_the_returned_model():
    from fedsweep.data import load_federated
    from fedsweep.data.client_test import matched_sets
    result = _run(_raw(eval={"every": 2, "clients": "all", "client_test_size": 30}))
    cfg = result.config
    data = load_federated(cfg.data, cfg.seed)
    labels = data.y_train.numpy()
    sets = matched_sets([labels[p.numpy()] for p in data.client_indices], list(range(10)), data.y_test.numpy(),
                        30, 10, cfg.seed)
    with torch.no_grad():
        right = (result.model(data.x_test).argmax(1) == data.y_test).double().numpy()
    acc = np.array([right[s].mean() for s in sets])
    last = result.history.iloc[-1]
    assert last["clients/accuracy_mean"] == pytest.approx(acc.mean(), abs=1e-12)
    assert last["clients/accuracy_min"] == pytest.approx(acc.min(), abs=1e-12)
    assert last["clients/accuracy_p10"] == pytest.approx(acc.min(), abs=1e-12)   # 1 of 10 clients
    assert result.summary["final_clients_accuracy_mean"] == pytest.approx(acc.mean(), abs=1e-12)
    # two classes a client: its set holds those two only
    for p, s in zip(data.client_indices, sets):
        assert set(data.y_test.numpy()[s]) == set(labels[p.numpy()])


@pytest.mark.parametrize("validation", ["federated", "central"])
def test_both_engines_agree_and_fine_tuning_serves_the_clients(validation):
    raw = _raw(eval={"every": 2, "clients": 6, "finetune_steps": 8},
               data={**SHARDS, "validation_fraction": 0.2, "validation": validation})
    loop, vec = _run(raw), _run(raw, "vectorized")
    keys = [k for k in loop.history if k.startswith(("clients/", "finetuned/"))]
    assert {f"{kind}/{s}_{stat}" for kind in ("clients", "finetuned") for s in ("accuracy", "val_accuracy")
            for stat in ("mean", "weighted", "p10", "std", "min")} == set(keys)
    for key in keys:
        np.testing.assert_allclose(loop.history[key], vec.history[key], atol=1e-9, err_msg=key)
    # on two-class shards the fine-tuned model serves its client far better than the global one
    last = loop.history.iloc[-1]
    assert last["finetuned/accuracy_mean"] > last["clients/accuracy_mean"] + 0.2
    assert last["finetuned/val_accuracy_mean"] > last["clients/val_accuracy_mean"] + 0.2


PERSONAL = '''
import torch
import fedsweep
from fedsweep import Algorithm

@fedsweep.register_algorithm
class Echo(Algorithm):
    """FedAvg whose 'personal' model of client k is w^t moved by k·scale: a known set of models."""
    name = "echo"
    scale = 0.0

    def personal_models(self, w, clients):
        return w + self.scale * clients.to(w.dtype).unsqueeze(1)

@fedsweep.register_algorithm
class Shifted(Echo):
    name = "shifted"
    scale = 0.05
'''


def test_personal_models_are_scored_per_client_on_both_engines(plugin_dir):
    path = str(plugin_dir("personal.py", PERSONAL))
    same = _run({**_raw(algorithm={"name": "echo"}), "plugins": [path]})
    last = same.history.iloc[-1]
    for stat in ("mean", "weighted", "p10", "std", "min"):   # the global model as every personal one
        assert last[f"personal/accuracy_{stat}"] == pytest.approx(last[f"clients/accuracy_{stat}"], abs=1e-12)
    raw = {**_raw(algorithm={"name": "shifted"}), "plugins": [path]}
    loop, vec = _run(raw), _run(raw, "vectorized")
    np.testing.assert_allclose(loop.history["personal/accuracy_mean"], vec.history["personal/accuracy_mean"], atol=1e-9)
    assert loop.history["personal/accuracy_mean"].iloc[-1] != pytest.approx(loop.history["clients/accuracy_mean"].iloc[-1])


def test_per_client_evaluation_resumes_exactly_and_writes_its_artifact(tmp_path):
    from fedsweep.config.schema import build_config
    from fedsweep.runs.run import write_artifacts
    from fedsweep.runs.summary import summarize
    raw = _raw(eval={"every": 1, "clients": 5, "finetune_steps": 3})
    full, _, saved = resumed_run({**raw, "engine": "vectorized"}, tmp_path / "ckpt", stop=2)
    assert len(saved["client_eval"]) == 5
    cfg = build_config(raw)
    out = write_artifacts(cfg, full, summarize(cfg, full.history), tmp_path / "art", log_model=False)
    import pandas as pd
    table = pd.read_csv(out / "client_eval.csv")
    assert list(table.columns) == ["client", "n_test", "accuracy", "finetuned_accuracy"]
    assert len(table) == 5 and table["n_test"].gt(0).all()
    assert table["accuracy"].mean() == pytest.approx(full.history[-1]["clients/accuracy_mean"], abs=1e-12)


def test_a_natural_split_scores_each_user_on_its_own_test_samples(tmp_path):
    from fedsweep.data import split_federated
    from test_leaf import SORTED, USERS, leaf, write_leaf   # tiny LEAF files in LEAF's format
    root = write_leaf(tmp_path / "toy")
    src = split_federated(leaf(root), seed=0).source
    for user, rows in zip(SORTED, src.client_test_indices):   # x[:, 0] is the user's number
        assert len(rows) == USERS[user][1] and (src.x_test[rows, 0] == int(user[1:])).all()
    raw = tiny_raw(data={"name": "leaf", "root": root, "num_clients": len(USERS)}, clients_per_round=2,
                   rounds=2, eval={"every": 1, "clients": "all"})
    module = _train(raw)
    rows = {r["client"]: r for r in module.client_eval_rows}
    assert [rows[i]["n_test"] for i in range(len(USERS))] == [USERS[u][1] for u in SORTED]
    empty = SORTED.index("w11")                                 # no test sample: not scored
    assert math.isnan(rows[empty]["accuracy"])
    scored = [r["accuracy"] for i, r in rows.items() if i != empty]
    assert module.history[-1]["clients/accuracy_mean"] == pytest.approx(np.mean(scored), abs=1e-12)


def _train(raw):
    from fedsweep.config.schema import build_config
    from fedsweep.runs.run import train
    return train(build_config(raw), progress=False)


@pytest.mark.parametrize("eval_over, error", [
    ({"clients": 0}, "eval.clients: 0 clients cannot be drawn from data.num_clients N=10; allowed 1..10 or all"),
    ({"clients": 11}, "eval.clients: 11 clients cannot be drawn"),
    ({"finetune_steps": 3}, "eval.finetune_steps: fine-tuned models are scored per client; set eval.clients"),
])
def test_per_client_settings_that_cannot_work_are_one_line(eval_over, error):
    from fedsweep.config.schema import ConfigError, build_config
    with pytest.raises(ConfigError, match=error.replace("(", r"\(").replace(")", r"\)")):
        build_config(_raw(eval={"every": 1, **eval_over}))


def test_natural_test_data_on_a_partitioned_dataset_is_refused():
    from fedsweep.config.schema import ConfigError
    with pytest.raises(ConfigError, match="eval.client_test: natural: dataset 'digits' has no per-client test"):
        _run(_raw(eval={"every": 1, "clients": "all", "client_test": "natural"}))


@pytest.mark.parametrize("sizes", [[3, 0, 2, 0], [0, 0], [2, 5, 1]])
def test_own_models_on_both_paths_with_clients_without_data(sizes):
    """One model a client, vmapped in chunks or one at a time: the same counts, clients without data
    (an empty last one too) count nothing."""
    from fedsweep.engine.evaluate import own_models
    from fedsweep.engine.functional import FunctionalModel
    from fedsweep.sim.client_index import ClientIndex
    from fedsweep.sim.models import MLP
    fm = FunctionalModel(MLP(4, 8, 3))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 4, generator=g), torch.randint(0, 3, (12,), generator=g)
    parts, at = [], 0
    for n in sizes:
        parts.append(torch.arange(at, at + n) % 12)
        at += n
    index = ClientIndex.from_parts(parts)
    W = fm.flatten() + 0.5 * torch.randn(len(sizes), fm.dim, generator=g)
    by_hand = torch.tensor([float((fm.logits(W[i], x[p]).argmax(1) == y[p]).sum()) if len(p) else 0.0
                            for i, p in enumerate(parts)], dtype=torch.float64)
    for vectorized, batch in ((False, 4), (True, 4), (True, 1000)):
        torch.testing.assert_close(own_models(fm, W, x, y, index, batch, vectorized), by_hand)


CLIENT_SWEEP = {"grid": {}, "methods": {"fedavg": {}, "fedper": {}}, "max_concurrent": 1,
                "base": {"rounds": 8, "clients_per_round": 4, "device": "cpu",
                         "data": {"name": "digits", "num_clients": 8, "partition": {"kind": "classes"},
                                  "validation_fraction": 0.2, "validation": "federated"},
                         "model": {"name": "mlp", "options": {"hidden": 16}}, "local": {"steps": 4, "batch_size": 5},
                         "eval": {"every": 2, "clients": "all"}}}


@pytest.mark.parametrize("over, needle", [
    ({"scheduler": {"metric": "clients/accuracy_p10"}},
     "scheduler.metric: 'clients/accuracy_p10' reads the test split, which only scores runs; with a validation split "
     "selection reads 'clients/val_accuracy_p10'"),
    ({"scheduler": {"metric": "finetuned/val_accuracy_mean"}},
     "scheduler.metric: 'finetuned/val_accuracy_mean' is measured per client, and trial fedavg"),
    ({"scheduler": {"metric": "personal/val_accuracy_p10"}}, "runs fedavg, which has no personal models"),
    ({"scheduler": {"metric": "clients/accuracy_p1"}}, "scheduler.metric: 'clients/accuracy_p1' is not a metric trials "
     "report; allowed: test/accuracy, test/loss, best/test_accuracy, rounds_to_target, "
     "<clients|finetuned|personal|served|unseen|unseen_finetuned>/accuracy_<mean|weighted|p10|min|std> (eval.clients)"),
    ({"scheduler": {"metric": "unseen/val_accuracy_mean"}}, "sets no eval.unseen_clients, so it would never report it"),
])
def test_a_per_client_metric_that_trials_would_not_report_is_refused(tmp_path, capsys, fresh_home, over, needle):
    from fedsweep.cli import main
    from test_tune import write_sweep
    path = write_sweep(tmp_path / "c.yaml", "c", **{**CLIENT_SWEEP, **over})
    assert main(["tune", path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_asha_and_optuna_select_on_a_per_client_validation_metric(tmp_path, monkeypatch, fresh_home):
    """ASHA's rungs and optuna's studies read clients/val_accuracy_p10, which every trial reports."""
    from fedsweep.cli import main
    from test_tune import trial_runs, write_sweep
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    search = {"searcher": "optuna", "num_samples": 2, "random_first": 1, "metric": "clients/val_accuracy_p10",
              "space": {"local.lr": {"loguniform": [0.02, 0.5]}}}
    path = write_sweep(tmp_path / "c.yaml", "c", **{**CLIENT_SWEEP, "search": search, "seeds": [0],
                       "scheduler": {"metric": "clients/val_accuracy_p10", "grace_period": 2}})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)
    assert main(["tune", path]) == 0
    _, runs = trial_runs(uri, "c")
    assert len(runs) == 4 and {r.data.tags["fedsweep.status"] for r in runs} <= {"finished", "stopped"}
    assert all("summary/final_clients_val_accuracy_p10" in r.data.metrics for r in runs)


def test_report_metric_selects_on_validation_scores_confirm_runs_and_calls_verdicts(tmp_path, monkeypatch,
                                                                                     fresh_home, capsys):
    """report.metric: served/accuracy_p10 — configs ranked by their best served/val_accuracy_p10, confirm
    runs scored by served/accuracy_p10 at that round, FedPer (personal heads) against FedAvg (global);
    each trial's line on the terminal gives those two numbers."""
    import fedsweep
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.chdir(tmp_path)
    sweep = {**CLIENT_SWEEP, "name": "served", "grid": {"local.lr": [0.05, 0.2]}, "seeds": [0, 1],
             "confirm": {"seeds": [10, 11, 12]}, "report": {"settings": [], "metric": "served/accuracy_p10"}}
    sweep["base"] = {**CLIENT_SWEEP["base"], "rounds": 10, "local": {"steps": 5, "batch_size": 5}}
    trials = fedsweep.tune(sweep, report=False, progress=True)
    assert len(trials) == 2 * 2 * 2 + 2 * 3
    result = fedsweep.report(sweep)
    configs, best, comparisons = result.configs, result.best, result.comparisons
    assert configs.attrs["rule"] == "metric" and configs.attrs["selected_on"] == "validation"
    by_run = result.trials.set_index("run_id")
    err = capsys.readouterr().err
    said = re.findall(r"^\[finished\] .*: best served/val_accuracy_p10 (\S+), served/accuracy_p10 there (\S+) "
                      r"after 10 rounds$", err, re.M)
    assert sorted(said) == sorted((f"{a:.4f}", f"{b:.4f}") for a, b in zip(
        by_run["summary/best_served_val_accuracy_p10"], by_run["summary/served_accuracy_p10_at_best_val"])), err
    for _, c in configs.iterrows():     # selection read validation only
        assert c["sel_acc_mean"] == pytest.approx(by_run.loc[c["run_ids"], "summary/best_served_val_accuracy_p10"].mean())
        chosen = configs[(configs["method"] == c["method"]) & (configs["rank"] == 1)].iloc[0]
        assert chosen["sel_acc_mean"] >= c["sel_acc_mean"]
    for _, b in best.iterrows():        # scored on the confirm runs, at each run's best validation round
        assert b["scored_on"] == "confirm" and len(b["run_ids"]) == 3
        runs = by_run.loc[b["run_ids"]]
        assert set(runs["seed"]) == {10, 11, 12}
        assert b["acc_mean"] == pytest.approx(runs["summary/served_accuracy_p10_at_best_val"].mean())
    (row,) = comparisons.to_dict("records")
    assert row["metric"] == "summary/served_accuracy_p10_at_best_val" and row["method"] == "fedper"
    assert row["verdict"] in ("better", "worse", "equivalent", "inconclusive") and row["n_seeds"] == 3
    text = result.path.read_text()
    assert "best mean over seeds of `served/accuracy_p10`" in text and "served/accuracy_p10 at best val" in text


def test_synthetic_clients_are_scored_on_their_own_held_out_samples():
    """FedProx's synthetic data: each client's test samples come from its own model (W_k, b_k); auto picks them."""
    from fedsweep.data import load_federated
    raw = tiny_raw(data={"name": "synthetic", "num_clients": 6}, model={"name": "mlp", "options": {"hidden": 8}},
                   rounds=2, eval={"every": 2, "clients": "all"})
    module = _train(raw)
    data = load_federated(module.cfg.data, module.cfg.seed)
    assert [r["n_test"] for r in module.client_eval_rows] == data.client_test.sizes.tolist()
    assert data.client_test.values.tolist() == list(range(len(data.y_test)))   # every test sample, its client's
    matched = _train({**raw, "eval": {"every": 2, "clients": "all", "client_test": "matched", "client_test_size": 7}})
    assert {r["n_test"] for r in matched.client_eval_rows} <= set(range(8))
