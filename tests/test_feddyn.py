"""FedDyn (Acar et al. 2021, Alg. 1) by hand on the quadratic problem, in both engines; its state
through state_dict and a checkpoint resume; engine agreement and accounting on real data."""
import pytest
import torch

from conftest import engine_runs, resumed_run, tiny_raw
from fedsweep.config.schema import build_config
from fedsweep.sim.heterogeneity import RoundPlan
from fedsweep.runs.run import train
from quadratic import ENGINES, POINTS, close, make_algorithm, one_round, t

# Client means m_0 = (2, 0), m_1 = (0, 4), m_2 = (−2, −1); the gradient of client i is w − m_i.


# α = 1, η_l = 1/4. The local gradient (y − m) − ℓ + α(y − w) = (1+α) y − (m + α w + ℓ), ℓ = ∇L_i^{prev},
# so a step is y ← y − η(1+α)(y − y*), y* = (m + w + ℓ)/2, and with η(1+α) = 1/2:
# after k steps from w, y = y* + 0.5^k (w − y*).

@pytest.mark.parametrize("engine", ENGINES)
def test_two_rounds_by_hand(engine):
    algo = make_algorithm("feddyn", 3, 2, [2, 1, 3], alpha=1.0)
    # Round 1: w = 0, ℓ = 0, h = 0; clients {0, 2} of N = 3 with E_i = 2, 1.
    #   client 0: y* = (1, 0), y = 0.75 y* = (0.75, 0)          Δ_0 = (0.75, 0)
    #   client 2: y* = (−1, −0.5), y = 0.5 y* = (−0.5, −0.25)    Δ_2 = (−0.5, −0.25)
    #   ℓ_0 = 0 − αΔ_0 = (−0.75, 0); ℓ_2 = (0.5, 0.25); ℓ_1 = 0 (not sampled)
    #   h = 0 − α (1/3)(Δ_0 + Δ_2) = −(1/3)(0.25, −0.25) = (−1/12, 1/12)        (1/N, not 1/|S|)
    #   u = mean Δ − h/α = (0.125, −0.125) + (1/12, −1/12) = (5/24, −5/24)
    u, up = one_round(algo, POINTS, t(0.0, 0.0), steps=[2, 1], lr=0.25, engine=engine, clients=[0, 2])
    close(up["delta"], torch.stack([t(0.75, 0.0), t(-0.5, -0.25)]))
    close(algo.h, t(-1 / 12, 1 / 12))
    close(algo.grad_prev.dense(), torch.stack([t(-0.75, 0.0), t(0.0, 0.0), t(0.5, 0.25)]))
    close(u, t(5 / 24, -5 / 24))

    # Round 2: w = (5/24, −5/24) (η_g = 1), all clients, E_i = 1, 2, 2.
    #   client 0: m + w + ℓ_0 = (35/24, −5/24), y* = (35/48, −5/48); 1 step: y = (y* + w)/2 = (15/32, −5/32)
    #             Δ_0 = (25/96, 5/96)
    #   client 1: m + w = (5/24, 91/24), y* = (5/48, 91/48); w − y* = (5/48, −101/48)
    #             y = y* + (w − y*)/4 = (25/192, 263/192), Δ_1 = (−5/64, 101/64)
    #   client 2: m + w + ℓ_2 = (−31/24, −23/24), y* = (−31/48, −23/48); w − y* = (41/48, 13/48)
    #             y = (−83/192, −79/192), Δ_2 = (−41/64, −13/64)
    #   Σ Δ = (−11/24, 137/96); mean Δ = (−11/72, 137/288)
    #   h = (−1/12, 1/12) − (1/3)(−11/24, 137/96) = (5/72, −113/288)
    #   u = mean Δ − h = (−16/72, 250/288) = (−2/9, 125/144)
    #   ℓ_0 = (−0.75, 0) − Δ_0 = (−97/96, −5/96); ℓ_1 = (5/64, −101/64); ℓ_2 = (73/64, 29/64)
    u, up = one_round(algo, POINTS, t(5 / 24, -5 / 24), steps=[1, 2, 2], lr=0.25, engine=engine, round=1)
    close(up["delta"], torch.stack([t(25 / 96, 5 / 96), t(-5 / 64, 101 / 64), t(-41 / 64, -13 / 64)]))
    close(algo.h, t(5 / 72, -113 / 288))
    close(u, t(-2 / 9, 125 / 144))
    close(algo.grad_prev.dense(), torch.stack([t(-97 / 96, -5 / 96), t(5 / 64, -101 / 64), t(73 / 64, 29 / 64)]))
    close(algo.h, algo.grad_prev.dense().mean(0))      # h = (1/N) Σ_all ∇L_i, since both start at 0


@pytest.mark.parametrize("engine", ENGINES)
def test_dropped_client_keeps_its_state(engine):
    algo = make_algorithm("feddyn", 3, 2, [2, 1, 3], alpha=1.0)
    algo.grad_prev.set(torch.tensor([1]), t(3.0, 3.0).view(1, -1))
    algo.h = algo.grad_prev.dense().mean(0)             # (1, 1)
    # client 1 drops out; clients 0 and 2, E = 1 from w = 0: y = y*/2 = (m + ℓ)/4 with ℓ = 0
    #   Δ_0 = (0.5, 0), Δ_2 = (−0.5, −0.25); h = (1, 1) − (1/3)(0, −0.25) = (1, 13/12)
    #   u = mean over the two = (0, −0.125) − h = (−1, −29/24)
    u, _ = one_round(algo, POINTS, t(0.0, 0.0), steps=[1, 0, 1], lr=0.25, engine=engine,
                     dropped=[False, True, False], expected=1)
    close(u, t(-1.0, -29 / 24))
    close(algo.grad_prev.dense(), torch.stack([t(-0.5, 0.0), t(3.0, 3.0), t(0.5, 0.25)]))
    close(algo.h, t(1.0, 13 / 12))
    # nobody returns: u = 0, nothing changes
    u, _ = one_round(algo, POINTS, t(0.0, 0.0), steps=[0], lr=0.25, engine=engine, clients=[1],
                     dropped=[True], expected=1)
    close(u, t(0.0, 0.0))
    close(algo.h, t(1.0, 13 / 12))


def test_data_weighting_changes_only_the_average():
    algo = make_algorithm("feddyn", 3, 2, [2, 1, 3], weighting="data", alpha=1.0)
    # round 1 above with q = (2/5, 3/5) over clients 0, 2: h as before (unweighted 1/N)
    #   u = 0.4 (0.75, 0) + 0.6 (−0.5, −0.25) − h = (0, −0.15) + (1/12, −1/12) = (1/12, −7/30)
    u, _ = one_round(algo, POINTS, t(0.0, 0.0), steps=[2, 1], lr=0.25, clients=[0, 2])
    close(algo.h, t(-1 / 12, 1 / 12))
    close(u, t(1 / 12, -7 / 30))


def test_state_dict_round_trip():
    a = make_algorithm("feddyn", 3, 2, [2, 1, 3], alpha=1.0)
    one_round(a, POINTS, t(0.0, 0.0), steps=[2, 1], lr=0.25, clients=[0, 2])
    b = make_algorithm("feddyn", 3, 2, [2, 1, 3], alpha=1.0)
    b.load_state_dict(a.state_dict())
    close(b.h, a.h)
    close(b.grad_prev.dense(), a.grad_prev.dense())
    ua, _ = one_round(a, POINTS, t(5 / 24, -5 / 24), steps=[1, 2, 2], lr=0.25, round=1)
    ub, _ = one_round(b, POINTS, t(5 / 24, -5 / 24), steps=[1, 2, 2], lr=0.25, round=1)
    assert torch.equal(ua, ub) and torch.equal(a.h, b.h) and torch.equal(a.grad_prev.dense(), b.grad_prev.dense())
    with pytest.raises(ValueError):
        make_algorithm("feddyn", 4, 2, [1, 1, 1, 1]).load_state_dict(a.state_dict())


def test_communication_and_compute_match_fedavg():
    work = torch.tensor([3, 0, 1])
    plan = RoundPlan(0, torch.tensor([0, 1, 2]), work, work.clone(), torch.tensor([2, 1, 3]),
                     work == 0, 3, 0.1)
    algo = make_algorithm("feddyn", 3, 2, [2, 1, 3])
    assert algo.communication(plan) == (2, 3)       # 1 up per returning client, 1 down per sampled
    assert algo.compute(plan) == 4.0


def test_resume_from_checkpoint_is_exact(tmp_path):
    raw = tiny_raw(rounds=4, algorithm={"name": "feddyn", "alpha": 0.1}, eval={"every": 2},
                   server={"optimizer": "momentum", "lr": 0.5})
    full, resumed, saved = resumed_run(raw, tmp_path, stop=2)
    assert saved["algorithm"]["h"].abs().sum() > 0                       # the state is in the checkpoint
    assert torch.equal(resumed.algorithm.grad_prev.dense(), full.algorithm.grad_prev.dense())


@pytest.mark.parametrize("over", [{}, {"heterogeneity": {"kind": "profiles", "speeds": 1.0, "dropout": 0.3}}],
                         ids=["stragglers", "profiles-dropout"])
def test_engines_agree_on_real_data(over):
    loop, vec = engine_runs({"algorithm": {"name": "feddyn", "alpha": 0.1}, **over},
                            ("test/accuracy", "train/loss", "comm/up_models", "comm/down_models", "compute/grad_evals"))
    torch.testing.assert_close(vec.algorithm.h, loop.algorithm.h, rtol=1e-4, atol=1e-6)
    if not over:
        fedavg = train(build_config(tiny_raw()), progress=False)
        assert not torch.allclose(loop.w, fedavg.w)
        assert loop.history[0]["comm/up_models"] == 4 == loop.history[0]["comm/down_models"]
