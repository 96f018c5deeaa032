"""Unseen clients (eval.unseen_clients): a share held out of training, never sampled, scored apart as
unseen/* on their own test data; the federation's 1/N is the training clients'; errors in one line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_raw

SHARDS = {"name": "digits", "num_clients": 10, "partition": {"kind": "classes", "classes_per_client": 2}}


def _raw(**over):
    return tiny_raw(**{"data": SHARDS, "clients_per_round": 4, "rounds": 4,
                       "eval": {"every": 2, "clients": "all", "unseen_clients": 0.2, "finetune_steps": 2,
                                "client_test_size": 30}, **over})


def test_the_held_out_share_is_drawn_once_and_never_sampled():
    from fedsweep.config.schema import build_config
    from fedsweep.sim.heterogeneity import Planner, training_clients, unseen_clients
    held = unseen_clients(0.2, 10, seed=3)
    assert len(held) == 2 and held.tolist() == unseen_clients(0.2, 10, seed=3).tolist()
    assert sorted(held.tolist() + training_clients(0.2, 10, 3).tolist()) == list(range(10))
    assert len(unseen_clients(0.01, 10, 3)) == 1 and len(unseen_clients(0.0, 10, 3)) == 0
    assert len({tuple(unseen_clients(0.2, 10, s)) for s in range(20)}) > 5      # the seed draws them
    cfg = build_config(_raw(seed=3))
    planner = Planner(cfg, torch.full((10,), 5))
    sampled = {int(c) for t in range(200) for c in planner.plan(t).clients}
    assert sampled == set(training_clients(0.2, 10, 3).tolist())             # every training client, no other
    # off: the plan is the one without the key
    plain = Planner(build_config(_raw(seed=3, eval={"every": 2})), torch.full((10,), 5))
    off = Planner(build_config(_raw(seed=3, eval={"every": 2, "clients": "all", "unseen_clients": 0.0})),
                  torch.full((10,), 5))
    assert all(plain.plan(t).clients.tolist() == off.plan(t).clients.tolist() for t in range(20))


@pytest.mark.parametrize("engine", ["loop", "vectorized"])
def test_unseen_clients_are_scored_apart_on_their_own_test_data(engine):
    import fedsweep
    from fedsweep.data import load_federated
    from fedsweep.data.client_test import matched_sets
    from fedsweep.sim.heterogeneity import training_clients, unseen_clients
    raw = {**_raw(), "engine": engine}
    result = fedsweep.run(raw, mlflow=False)
    cfg = result.config
    data = load_federated(cfg.data, cfg.seed)
    labels = data.y_train.numpy()
    with torch.no_grad():
        right = (result.model(data.x_test).argmax(1) == data.y_test).double().numpy()
    last = result.history.iloc[-1]
    for prefix, ids in (("unseen", unseen_clients(0.2, 10, cfg.seed)), ("clients", training_clients(0.2, 10, cfg.seed))):
        sets = matched_sets([labels[data.client_indices[int(i)].numpy()] for i in ids], ids.tolist(),
                            data.y_test.numpy(), 30, 10, cfg.seed)
        acc = np.array([right[s].mean() for s in sets])
        assert last[f"{prefix}/accuracy_mean"] == pytest.approx(acc.mean(), abs=1e-12)
        assert last[f"{prefix}/accuracy_min"] == pytest.approx(acc.min(), abs=1e-12)
    assert 0 <= last["unseen_finetuned/accuracy_mean"] <= 1
    assert not any(k.startswith(("personal/", "served/unseen")) for k in last.index)
    assert result.summary["final_unseen_accuracy_mean"] == last["unseen/accuracy_mean"]
    assert "best_unseen_finetuned_accuracy_p10" in result.summary


def test_client_eval_csv_marks_the_unseen_rows(tmp_path):
    import pandas as pd
    from fedsweep.config.schema import build_config
    from fedsweep.runs.run import train, write_artifacts
    from fedsweep.runs.summary import summarize
    from fedsweep.sim.heterogeneity import unseen_clients
    cfg = build_config(_raw(algorithm={"name": "ditto"}))
    module = train(cfg, progress=False)
    out = write_artifacts(cfg, module, summarize(cfg, module.history), tmp_path / "art", log_model=False)
    table = pd.read_csv(out / "client_eval.csv")
    assert list(table.columns) == ["client", "n_test", "accuracy", "finetuned_accuracy", "personal_accuracy", "unseen"]
    held = set(unseen_clients(0.2, 10, cfg.seed).tolist())
    assert set(table.loc[table["unseen"], "client"]) == held and len(table) == 10
    assert table.loc[table["unseen"], "personal_accuracy"].isna().all()          # they never trained
    assert table.loc[~table["unseen"], "personal_accuracy"].notna().all()
    assert table.loc[table["unseen"], "accuracy"].mean() == pytest.approx(module.history[-1]["unseen/accuracy_mean"])
    assert "personal/accuracy_mean" in module.history[-1] and "unseen/accuracy_mean" in module.history[-1]


def test_the_federations_one_over_n_is_the_training_clients():
    """SCAFFOLD's c stays the mean of the training clients' c_i (the unseen ones' stay zero and do not
    count); with N all clients it would be 8/10 of that."""
    from fedsweep.config.schema import build_config
    from fedsweep.runs.run import train
    cfg = build_config(_raw(algorithm={"name": "scaffold"}, eval={"every": 4, "clients": 3, "unseen_clients": 0.2}))
    module = train(cfg, progress=False)
    algo = module.algorithm
    assert algo.ctx.training_clients == 8 and algo.ctx.num_clients == 10
    torch.testing.assert_close(algo.c, algo.c_i.dense().sum(0) / 8)
    assert algo.c.abs().sum() > 0


@pytest.mark.parametrize("eval_over, error", [
    ({"unseen_clients": 0.2}, "eval.unseen_clients: unseen clients are scored per client; set eval.clients"),
    ({"clients": "all", "unseen_clients": 0.7}, "eval.unseen_clients: 0.7 of data.num_clients N=10 holds 7 clients "
     "out of training, leaving 3, fewer than clients_per_round K=4; allowed: a share leaving at least K"),
    ({"clients": "all", "unseen_clients": 1.0}, "eval.unseen_clients"),
])
def test_unseen_settings_that_cannot_work_are_one_line(eval_over, error):
    from fedsweep.config.schema import ConfigError, build_config
    with pytest.raises(ConfigError, match=error.replace("(", r"\(").replace(")", r"\)")):
        build_config(_raw(eval={"every": 1, **eval_over}))
