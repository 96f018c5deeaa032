"""SCAFFOLD (Karimireddy et al. 2020, Alg. 1) by hand on the quadratic problem, in both engines;
its state through state_dict and a checkpoint resume; engine agreement and accounting on real data."""
import pytest
import torch

from conftest import engine_runs, resumed_run, tiny_raw
from fedsweep.config.schema import build_config
from fedsweep.sim.heterogeneity import RoundPlan
from fedsweep.runs.run import train
from quadratic import ENGINES, POINTS, close, make_algorithm, one_round, t

# Client means m_0 = (2, 0), m_1 = (0, 4), m_2 = (−2, −1); the gradient of client i is w − m_i.


# With corr = c − c_i fixed, a step is y ← y − η(y − m' ) for m' = m − corr, so after k steps from w
# y = m' + (1 − η)^k (w − m'); η_l = 0.5 throughout: y = m' + 0.5^k (w − m').

@pytest.mark.parametrize("engine", ENGINES)
def test_two_rounds_option2_by_hand(engine):
    algo = make_algorithm("scaffold", 3, 2, [2, 1, 3], option=2)
    # Round 1: w = 0, c = c_i = 0 (plain local SGD), clients {0, 2} of N = 3 with E_i = 2, 1.
    #   y_0 = (2,0)(1 − 0.25) = (1.5, 0)   Δ_0 = (1.5, 0)
    #   y_2 = (−2,−1)(1 − 0.5) = (−1, −0.5) Δ_2 = (−1, −0.5)       u = mean = (0.25, −0.25)
    #   c_0⁺ = 0 − 0 − Δ_0/(2·0.5) = (−1.5, 0);  c_2⁺ = −Δ_2/(1·0.5) = (2, 1);  c_1 = 0 (not sampled)
    #   c = 0 + (1/3)((−1.5, 0) + (2, 1)) = (1/6, 1/3)            (1/N = 1/3, not 1/|S| = 1/2)
    u, up = one_round(algo, POINTS, t(0.0, 0.0), steps=[2, 1], lr=0.5, engine=engine, clients=[0, 2])
    close(up["delta"], torch.stack([t(1.5, 0.0), t(-1.0, -0.5)]))
    close(u, t(0.25, -0.25))
    close(algo.c, t(1 / 6, 1 / 3))
    close(algo.c_i.dense(), torch.stack([t(-1.5, 0.0), t(0.0, 0.0), t(2.0, 1.0)]))

    # Round 2: w = (0.25, −0.25) (η_g = 1), all clients, E_i = 1, 2, 2.
    #   client 0: corr = c − c_0 = (5/3, 1/3), m' = (1/3, −1/3); 1 step: y = (m' + w)/2 = (7/24, −7/24)
    #             Δ_0 = (1/24, −1/24)
    #   client 1: corr = (1/6, 1/3), m' = (−1/6, 11/3); w − m' = (5/12, −47/12);
    #             y = m' + (w − m')/4 = (−1/16, 43/16), Δ_1 = (−5/16, 47/16)
    #   client 2: corr = (1/6 − 2, 1/3 − 1) = (−11/6, −2/3), m' = (−1/6, −1/3); w − m' = (5/12, 1/12)
    #             y = (−1/16, −5/16), Δ_2 = (−5/16, −1/16)
    #   u = mean Δ = ((1/24 − 10/16)/3, (−1/24 + 46/16)/3) = (−7/36, 17/18)
    #   c_0⁺ = (−1.5, 0) − (1/6, 1/3) − Δ_0/(1·0.5) = (−7/4, −1/4)
    #   c_1⁺ = 0 − (1/6, 1/3) − Δ_1/(2·0.5) = (7/48, −157/48)
    #   c_2⁺ = (2, 1) − (1/6, 1/3) − Δ_2/(2·0.5) = (103/48, 35/48)
    #   c = (1/6, 1/3) + (1/3) Σ (c_i⁺ − c_i) = mean_i c_i⁺ = (13/72, −67/72)
    u, up = one_round(algo, POINTS, t(0.25, -0.25), steps=[1, 2, 2], lr=0.5, engine=engine, round=1)
    close(up["delta"], torch.stack([t(1 / 24, -1 / 24), t(-5 / 16, 47 / 16), t(-5 / 16, -1 / 16)]))
    close(u, t(-7 / 36, 17 / 18))
    close(algo.c_i.dense(), torch.stack([t(-7 / 4, -1 / 4), t(7 / 48, -157 / 48), t(103 / 48, 35 / 48)]))
    close(algo.c, t(13 / 72, -67 / 72))
    close(algo.c, algo.c_i.dense().mean(0))          # c stays the mean of all N c_i


@pytest.mark.parametrize("engine", ENGINES)
def test_option1_uses_full_gradient_at_server_model(engine):
    algo = make_algorithm("scaffold", 3, 2, [2, 1, 3], option=1)
    assert algo.probe == "full"
    # Round 1 as above (c = c_i = 0): Δ and u unchanged; c_i⁺ = ∇f_i(w^t = 0) = 0 − m_i.
    #   c_0 = (−2, 0), c_2 = (2, 1); c = (1/3)((−2, 0) + (2, 1)) = (0, 1/3)
    u, _ = one_round(algo, POINTS, t(0.0, 0.0), steps=[2, 1], lr=0.5, engine=engine, clients=[0, 2])
    close(u, t(0.25, -0.25))
    close(algo.c_i.dense(), torch.stack([t(-2.0, 0.0), t(0.0, 0.0), t(2.0, 1.0)]))
    close(algo.c, t(0.0, 1 / 3))
    # Round 2 from w = (1, 1), client 1 alone, 1 step: corr = c − 0 = (0, 1/3), m' = (0, 11/3)
    #   y = (w + m')/2 = (1/2, 7/3), Δ_1 = (−1/2, 4/3); c_1⁺ = w − m_1 = (1, −3)
    #   c = (0, 1/3) + (1/3)((1, −3) − 0) = (1/3, −2/3)
    u, _ = one_round(algo, POINTS, t(1.0, 1.0), steps=[1], lr=0.5, engine=engine, clients=[1], round=1)
    close(u, t(-0.5, 4 / 3))
    close(algo.c_i.dense()[1], t(1.0, -3.0))
    close(algo.c, t(1 / 3, -2 / 3))


@pytest.mark.parametrize("engine", ENGINES)
def test_dropped_client_keeps_its_control_variate(engine):
    algo = make_algorithm("scaffold", 3, 2, [2, 1, 3])
    algo.c_i.set(torch.tensor([1]), t(5.0, 5.0).view(1, -1))   # something to keep
    algo.c = algo.c_i.dense().mean(0)                    # = (5/3, 5/3)
    # client 1 drops out (E_1 = 0); clients 0 and 2 from w = 0 with E = 1, corr_0 = corr_2 = c:
    #   m'_0 = (2 − 5/3, −5/3) = (1/3, −5/3) → Δ_0 = m'_0/2 = (1/6, −5/6)
    #   m'_2 = (−2 − 5/3, −1 − 5/3) = (−11/3, −8/3) → Δ_2 = (−11/6, −4/3)
    #   u = mean over the two that returned = (−5/6, −13/12)
    #   c_0⁺ = −c − Δ_0/0.5 = (−5/3 − 1/3, −5/3 + 5/3) = (−2, 0); c_2⁺ = (−5/3 + 11/3, −5/3 + 8/3) = (2, 1)
    #   c = (5/3, 5/3) + (1/3)((−2, 0) + (2, 1)) = (5/3, 2)
    u, _ = one_round(algo, POINTS, t(0.0, 0.0), steps=[1, 0, 1], lr=0.5, engine=engine,
                     dropped=[False, True, False], expected=1)
    close(u, t(-5 / 6, -13 / 12))
    close(algo.c_i.dense(), torch.stack([t(-2.0, 0.0), t(5.0, 5.0), t(2.0, 1.0)]))
    close(algo.c, t(5 / 3, 2.0))
    assert torch.isfinite(algo.c_i.dense()).all()


def test_state_dict_round_trip():
    a = make_algorithm("scaffold", 3, 2, [2, 1, 3])
    one_round(a, POINTS, t(0.0, 0.0), steps=[2, 1], lr=0.5, clients=[0, 2])
    b = make_algorithm("scaffold", 3, 2, [2, 1, 3])
    b.load_state_dict(a.state_dict())
    close(b.c, a.c)
    close(b.c_i.dense(), a.c_i.dense())
    ua, _ = one_round(a, POINTS, t(0.25, -0.25), steps=[1, 2, 2], lr=0.5, round=1)
    ub, _ = one_round(b, POINTS, t(0.25, -0.25), steps=[1, 2, 2], lr=0.5, round=1)
    assert torch.equal(ua, ub) and torch.equal(a.c_i.dense(), b.c_i.dense()) and torch.equal(a.c, b.c)
    with pytest.raises(ValueError):
        make_algorithm("scaffold", 4, 2, [1, 1, 1, 1]).load_state_dict(a.state_dict())


def test_communication_and_compute():
    work = torch.tensor([3, 0, 1])
    plan = RoundPlan(0, torch.tensor([0, 1, 2]), work, work.clone(), torch.tensor([2, 1, 3]),
                     work == 0, 3, 0.1)
    two = make_algorithm("scaffold", 3, 2, [2, 1, 3], option=2)
    one = make_algorithm("scaffold", 3, 2, [2, 1, 3], option=1)
    assert two.communication(plan) == (4, 6)       # 2 up per returning client, 2 down per sampled
    assert one.communication(plan) == (4, 6)
    assert two.compute(plan) == 4.0                # steps
    assert one.compute(plan) == 6.0                # + one full-batch gradient per returning client


def test_resume_from_checkpoint_is_exact(tmp_path):
    raw = tiny_raw(rounds=4, algorithm={"name": "scaffold"}, eval={"every": 2})
    full, resumed, saved = resumed_run(raw, tmp_path, stop=2)
    assert saved["algorithm"]["c_i"].abs().sum() > 0                  # the state is in the checkpoint
    assert torch.equal(resumed.algorithm.c_i.dense(), full.algorithm.c_i.dense())


@pytest.mark.parametrize("option", [1, 2])
def test_engines_agree_on_real_data(option):
    loop, vec = engine_runs({"algorithm": {"name": "scaffold", "option": option}},
                            ("test/accuracy", "train/loss", "comm/up_models", "comm/down_models", "compute/grad_evals"))
    torch.testing.assert_close(vec.algorithm.c, loop.algorithm.c, rtol=1e-4, atol=1e-5)
    if option == 2:
        fedavg = train(build_config(tiny_raw()), progress=False)
        assert not torch.allclose(loop.w, fedavg.w)        # the correction changes training
    h = loop.history[0]
    assert h["comm/up_models"] == 8 and h["comm/down_models"] == 8      # K = 4 clients × 2 models
