"""Hybrid FL (FedCLG paper): one round computed by hand on quadratic clients, in both engines.

Clients' means c_i and the server's mean c_s; every batch is a full batch, so a client's gradient
at w is w − c_i and the server's is w − c_s. η_l = 0.5, steps E_i = (2, 1, 2), γ = 0.25, E_s = 2, η_g = 1.
"""
import pytest
import torch

from quadratic import C, DTYPE, POINTS, hybrid_round, make_algorithm

SERVER = torch.tensor([[1.0, 1.0], [3.0, 1.0]], dtype=DTYPE)                      # c_s = (2, 1)
C_S = torch.tensor([2.0, 1.0], dtype=DTYPE)
W = torch.tensor([0.0, 0.0], dtype=DTYPE)
STEPS, LR, GAMMA, E_S = [2, 1, 2], 0.5, 0.25, 2
SHRINK = torch.tensor([[1 - 0.5 ** 2], [1 - 0.5], [1 - 0.5 ** 2]], dtype=DTYPE)   # 1 − (1 − η)^{E_i}


def server_train_by_hand(w):
    return C_S + (w - C_S) * (1 - GAMMA) ** E_S            # eq. (5) twice: w ← w − γ (w − c_s)


def run(name, engine, **params):
    algo = make_algorithm(name, 3, 2, [2, 1, 3], **params)
    return hybrid_round(algo, POINTS, W, STEPS, LR, SERVER, E_S, GAMMA, engine=engine)


@pytest.mark.parametrize("engine", ["loop", "vectorized"])
def test_clg_sgd(engine):
    fedavg = ((C - W) * SHRINK).mean(0)                     # eq. (4): Δ_i = (c_i − w)(1 − (1−η)^{E_i})
    w, _ = run("clg_sgd", engine)
    torch.testing.assert_close(w, server_train_by_hand(W + fedavg), rtol=0, atol=1e-12)


@pytest.mark.parametrize("engine", ["loop", "vectorized"])
def test_fedclg_c_clients_follow_the_server_gradient(engine):
    # eq. (10): w ← w − η((w − c_i) + (g_s − g_i)), g_s − g_i = (w^t − c_s) − (w^t − c_i) = c_i − c_s,
    # so every step is w ← w − η (w − c_s): Δ_i = (c_s − w^t)(1 − (1−η)^{E_i}).
    w, uploads = run("fedclg_c", engine)
    torch.testing.assert_close(uploads["delta"], (C_S - W) * SHRINK, rtol=0, atol=1e-12)
    torch.testing.assert_close(w, server_train_by_hand(W + ((C_S - W) * SHRINK).mean(0)), rtol=0, atol=1e-12)


@pytest.mark.parametrize("engine", ["loop", "vectorized"])
def test_fedclg_s_corrects_at_aggregation(engine):
    # clients as FedAvg; eq. (11): mean(Δ_i − E_i η (g_s − g_i)), g_s − g_i = c_i − c_s
    delta = (C - W) * SHRINK
    e = torch.tensor([[2.0], [1.0], [2.0]], dtype=DTYPE)
    w, uploads = run("fedclg_s", engine)
    torch.testing.assert_close(uploads["g_i"], W - C, rtol=0, atol=1e-12)            # ∇f_i(x_t), full batch
    torch.testing.assert_close(w, server_train_by_hand(W + (delta - e * LR * (C - C_S)).mean(0)),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("engine", ["loop", "vectorized"])
def test_server_only_and_scaffold_plus(engine):
    w, _ = run("server_only", engine)
    torch.testing.assert_close(w, server_train_by_hand(W), rtol=0, atol=1e-12)
    w, _ = run("scaffold_plus", engine)                     # round 1: c = c_i = 0, so SCAFFOLD = FedAvg
    torch.testing.assert_close(w, server_train_by_hand(W + ((C - W) * SHRINK).mean(0)), rtol=0, atol=1e-12)


def test_communication_accounting():
    from fedsweep.sim.heterogeneity import RoundPlan
    k = torch.tensor([2, 1, 2])
    plan = RoundPlan(0, torch.arange(3), k, k, torch.tensor([2, 1, 3]), torch.zeros(3, dtype=torch.bool), 2, 0.5)
    assert make_algorithm("fedclg_c", 3, 2, [2, 1, 3]).communication(plan) == (3, 6)    # + g_s down
    assert make_algorithm("fedclg_s", 3, 2, [2, 1, 3]).communication(plan) == (6, 3)    # + g_i up
    assert make_algorithm("server_only", 3, 2, [2, 1, 3]).communication(plan) == (0, 0)


# ----- on real data, through Lightning ----------------------------------------------------------

from conftest import engine_runs, resumed_run, tiny_raw  # noqa: E402

from fedsweep.config.schema import ConfigError, build_config  # noqa: E402
from fedsweep.runs.run import train  # noqa: E402

SERVER_DATA = {"fraction": 0.05, "steps": 2, "lr": 0.1, "batch_size": 16}


def test_clg_sgd_without_server_data_or_steps_is_fedavg():
    fedavg = train(build_config(tiny_raw(rounds=2)), progress=False).w
    for server_data in ({"fraction": 0.0}, {**SERVER_DATA, "steps": 0}):
        # with a pool the clients lose its samples, so compare with FedAvg on the same split
        ref = fedavg if server_data["fraction"] == 0 else train(
            build_config(tiny_raw(rounds=2, server_data=server_data)), progress=False).w
        w = train(build_config(tiny_raw(rounds=2, algorithm={"name": "clg_sgd"}, server_data=server_data)),
                  progress=False).w
        assert torch.equal(w, ref)


@pytest.mark.parametrize("name,params", [("clg_sgd", {}), ("fedclg_c", {}), ("fedclg_s", {"gradient_batch": "full"}),
                                         ("scaffold_plus", {}), ("server_only", {})])
def test_engines_agree_with_server_data(name, params):
    loop, _ = engine_runs({"algorithm": {"name": name, **params}, "server_data": SERVER_DATA})
    h = loop.history[-1]
    assert "server/loss" in h and h["test/accuracy"] >= 0
    fedavg = train(build_config(tiny_raw(server_data=SERVER_DATA)), progress=False)
    assert not torch.allclose(loop.w, fedavg.w)           # the server's data changes the result


def test_server_and_client_data_never_overlap():
    m = train(build_config(tiny_raw(rounds=1, algorithm={"name": "fedclg_c"}, server_data=SERVER_DATA)), progress=False)
    pool = set(m.data.server_pool.tolist())
    assert pool and not pool & {int(i) for ix in m.data.client_indices for i in ix}
    for t in range(3):
        served = m.server_round(t)
        assert served.full[0].shape[0] == m.data.server_size and len(served.batches) == 2


def test_hybrid_algorithms_need_server_data():
    with pytest.raises(ConfigError, match="server_data.fraction: algorithm 'fedclg_c' trains on server data"):
        build_config(tiny_raw(algorithm={"name": "fedclg_c"}))


def test_resume_with_server_data_is_exact(tmp_path):
    raw = tiny_raw(rounds=4, algorithm={"name": "scaffold_plus"}, server_data=SERVER_DATA,
                   local={"steps": 4, "batch_size": 5, "lr": 0.1, "lr_decay": 0.9, "lr_min": 0.01})
    resumed_run(raw, tmp_path, stop=2)


def test_lr_decay_applies_to_local_and_server_rates():
    """FedCLG §VI-A: η_l and γ both decay by local.lr_decay per round, floored at local.lr_min."""
    cfg = build_config(tiny_raw(rounds=4, algorithm={"name": "clg_sgd"}, server_data={**SERVER_DATA, "lr": 0.4},
                                local={"steps": 2, "batch_size": 5, "lr": 0.1, "lr_decay": 0.5, "lr_min": 0.03}))
    h = train(cfg, progress=False).history
    assert [r["round/lr"] for r in h] == pytest.approx([0.1, 0.05, 0.03, 0.03])
    assert [r["server/lr"] for r in h] == pytest.approx([0.4, 0.2, 0.1, 0.05])
