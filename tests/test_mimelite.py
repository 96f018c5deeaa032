"""MimeLite (SGDm base) on the quadratic harness by hand, in both engines; reductions, state,
resume and engine agreement on real data."""
import pytest
import torch

from fedsweep.config.schema import build_config
from fedsweep.sim.heterogeneity import RoundPlan
from fedsweep.runs.run import train
from conftest import engine_runs, resumed_run, tiny_raw
from quadratic import ENGINES, POINTS, close, make_algorithm, one_round, t


@pytest.mark.parametrize("engine", ENGINES)
def test_two_rounds_by_hand(engine):
    algo = make_algorithm("mimelite", 3, 2, [2, 1, 3], beta=0.5)
    # Round 1, m = 0: w ← w − 0.5 (0.5 (w − c) + 0.5·0) = 0.75 w + 0.25 c, from 0: Δ = (1 − 0.75^k) c;
    # steps (2, 1, 2): Δ = 0.4375 (2, 0), 0.25 (0, 4), 0.4375 (−2, −1)
    w0 = t(0.0, 0.0)
    u, up = one_round(algo, POINTS, w0, steps=[2, 1, 2], lr=0.5, engine=engine)
    close(up["delta"], torch.stack([t(0.875, 0.0), t(0.0, 1.0), t(-0.875, -0.4375)]))
    close(u, t(0.0, 0.1875))                                     # (0, 0.5625)/3
    # full-batch gradients at w^t = 0: w − c_i = (−2, 0), (0, −4), (2, 1); mean (0, −1)
    close(up["grad"], torch.stack([t(-2.0, 0.0), t(0.0, -4.0), t(2.0, 1.0)]))
    close(algo.m, t(0.0, -0.5))                                  # m = 0.5·0 + 0.5 (0, −1)
    # Round 2 from w1 = (0, 0.1875), steps (1, 2, 2): w ← 0.75 w + 0.25 (c − m), fixed point
    # c − m = c + (0, 0.5), so Δ = (1 − 0.75^k)(c + (0, 0.5) − w1) = (1 − 0.75^k)(c + (0, 0.3125)):
    #   c_0, k=1: 0.25   (2, 0.3125)    = (0.5, 0.078125)
    #   c_1, k=2: 0.4375 (0, 4.3125)    = (0, 1.88671875)
    #   c_2, k=2: 0.4375 (−2, −0.6875)  = (−0.875, −0.30078125)
    w1 = w0 + u
    u, up = one_round(algo, POINTS, w1, steps=[1, 2, 2], lr=0.5, engine=engine, round=1)
    close(up["delta"], torch.stack([t(0.5, 0.078125), t(0.0, 1.88671875), t(-0.875, -0.30078125)]))
    close(u, t(-0.125, 0.5546875))                               # (−0.375, 1.6640625)/3
    # gradients at w1 (not at the trained models): w1 − c_i = (−2, 0.1875), (0, −3.8125), (2, 1.1875)
    close(up["grad"], torch.stack([t(-2.0, 0.1875), t(0.0, -3.8125), t(2.0, 1.1875)]))
    close(algo.m, t(0.0, -0.65625))                              # 0.5 (0, −0.5) + 0.5 (0, −2.4375/3)


@pytest.mark.parametrize("engine", ENGINES)
def test_data_weights_and_dropped_client(engine):
    algo = make_algorithm("mimelite", 3, 2, [2, 1, 3], weighting="data", beta=0.5)
    one_round(algo, POINTS, t(0.0, 0.0), steps=[2, 1, 2], lr=0.5, engine=engine)
    # q = (2, 1, 3)/6: mean ∇f_i(0) = (−4/6 + 1, −4/6 + 0.5) = (1/3, −1/6); m = 0.5 of it
    close(algo.m, t(1 / 6, -1 / 12))
    algo = make_algorithm("mimelite", 3, 2, [2, 1, 3], beta=0.5)
    u, _ = one_round(algo, POINTS, t(0.0, 0.0), steps=[2, 0, 2], lr=0.5, engine=engine,
                     dropped=[False, True, False])
    close(u, t(0.0, -0.4375 / 2))                                # mean of (0.875, 0), (−0.875, −0.4375)
    close(algo.m, t(0.0, 0.25))                                  # 0.5 mean((−2, 0), (2, 1))


@pytest.mark.parametrize("engine", ENGINES)
def test_beta_zero_is_fedavg(engine):
    mime = make_algorithm("mimelite", 3, 2, [2, 1, 3], beta=0.0)
    avg = make_algorithm("fedavg", 3, 2, [2, 1, 3])
    w_m = w_a = t(0.5, -0.25)
    for r, steps in enumerate([[2, 1, 2], [1, 2, 2], [3, 3, 1]]):
        w_m = w_m + one_round(mime, POINTS, w_m, steps=steps, lr=0.3, engine=engine, round=r)[0]
        w_a = w_a + one_round(avg, POINTS, w_a, steps=steps, lr=0.3, engine=engine, round=r)[0]
    torch.testing.assert_close(w_m, w_a, rtol=0, atol=1e-15)


def test_state_round_trip():
    a = make_algorithm("mimelite", 3, 2, [2, 1, 3], beta=0.3)
    one_round(a, POINTS, t(0.0, 0.0), steps=[2, 1, 2], lr=0.5)
    b = make_algorithm("mimelite", 3, 2, [2, 1, 3], beta=0.3)
    assert torch.equal(b.m, t(0.0, 0.0)) and not torch.equal(a.m, b.m)
    b.load_state_dict(a.state_dict())
    w = t(0.2, 0.1)
    ua, _ = one_round(a, POINTS, w, steps=[1, 2, 2], lr=0.5, round=1)
    ub, _ = one_round(b, POINTS, w, steps=[1, 2, 2], lr=0.5, round=1)
    assert torch.equal(ua, ub) and torch.equal(a.m, b.m)


def test_accounting():
    algo = make_algorithm("mimelite", 3, 2, [2, 1, 3], beta=0.5)
    work = torch.tensor([3, 0, 1])                                 # one dropped
    p = RoundPlan(0, torch.arange(3), work, work.clone(), torch.tensor([2, 1, 3]), work == 0, 3, 0.5)
    assert algo.communication(p) == (4, 6)     # up Δ_i + ∇f_i(w^t) from 2 returned; down w^t + m to 3
    assert algo.compute(p) == 4 + 2            # local steps + one full-data gradient per returned client


def test_resume_from_checkpoint_is_exact(tmp_path):
    raw = tiny_raw(rounds=4, algorithm={"name": "mimelite", "beta": 0.5},
                   server={"optimizer": "momentum", "lr": 0.5}, eval={"every": 2})
    _, _, saved = resumed_run(raw, tmp_path, stop=2)
    assert saved["algorithm"]["m"].abs().sum() > 0


def test_engines_agree_on_real_data():
    loop, _ = engine_runs({"rounds": 2, "algorithm": {"name": "mimelite", "beta": 0.5}},
                          ("test/accuracy", "test/loss", "train/loss", "comm/up_models", "comm/down_models",
                           "compute/grad_evals"))
    assert [(h["comm/up_models"], h["comm/down_models"]) for h in loop.history] == [(8, 8)] * 2
    avg = train(build_config(tiny_raw(rounds=2)), progress=False)
    assert not torch.allclose(avg.w, loop.w)
