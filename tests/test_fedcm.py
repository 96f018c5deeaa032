"""FedCM (client-level momentum) on the quadratic harness by hand, in both engines; reductions,
state, resume and engine agreement on real data."""
import pytest
import torch

from fedsweep.config.schema import build_config
from fedsweep.sim.heterogeneity import RoundPlan
from fedsweep.runs.run import train
from conftest import engine_runs, resumed_run, tiny_raw
from quadratic import ENGINES, POINTS, close, make_algorithm, one_round, t


@pytest.mark.parametrize("engine", ENGINES)
def test_two_rounds_by_hand(engine):
    algo = make_algorithm("fedcm", 3, 2, [2, 1, 3], alpha=0.5)
    # Round 1: no d̄ yet -> plain steps w ← w − 0.5 (w − c), from 0 after k steps Δ = c (1 − 0.5^k);
    # steps (2, 1, 2): Δ = (1.5, 0), (0, 2), (−1.5, −0.75).
    w0 = t(0.0, 0.0)
    u, up = one_round(algo, POINTS, w0, steps=[2, 1, 2], lr=0.5, engine=engine)
    close(up["delta"], torch.stack([t(1.5, 0.0), t(0.0, 2.0), t(-1.5, -0.75)]))
    close(u, t(0.0, 1.25 / 3))                                      # mean Δ = (0, 5/12)
    # d̄ = −mean Δ_i/(E_i η_l) = −mean((1.5, 0)/1, (0, 2)/0.5, (−1.5, −0.75)/1) = −(0, 3.25)/3
    close(algo.d, t(0.0, -13 / 12))
    # Round 2 from w1 = w0 + u = (0, 5/12), α = 0.5, η_l = 0.5, steps (1, 2, 2):
    # w ← w − 0.5 (0.5 (w − c) + 0.5 d̄) = 0.75 w + 0.25 (c − d̄); fixed point c − d̄ = c + (0, 13/12),
    # so Δ = (1 − 0.75^k)(c + (0, 13/12) − w1) = (1 − 0.75^k)(c + (0, 2/3)):
    #   c_0, k=1: 0.25   (2, 2/3)    = (0.5, 1/6)
    #   c_1, k=2: 0.4375 (0, 14/3)   = (0, 49/24)
    #   c_2, k=2: 0.4375 (−2, −1/3)  = (−0.875, −7/48)
    w1 = w0 + u
    u, up = one_round(algo, POINTS, w1, steps=[1, 2, 2], lr=0.5, engine=engine, round=1)
    close(up["delta"], torch.stack([t(0.5, 1 / 6), t(0.0, 49 / 24), t(-0.875, -7 / 48)]))
    close(u, t(-0.125, 0.6875))                   # ((0.5 − 0.875)/3, (8 + 98 − 7)/48/3 = 11/16)
    # d̄ = −mean(Δ_0/0.5, Δ_1/1, Δ_2/1) = −((1 − 0.875)/3, (16 + 98 − 7)/48/3) = (−1/24, −107/144)
    close(algo.d, t(-1 / 24, -107 / 144))


@pytest.mark.parametrize("engine", ENGINES)
def test_zero_momentum_first_round(engine):
    algo = make_algorithm("fedcm", 3, 2, [2, 1, 3], alpha=0.5, first_round="zero_momentum")
    # d̄ = 0: w ← w − 0.5·0.5 (w − c), Δ = c (1 − 0.75^k): (0.875, 0), (0, 1), (−0.875, −0.4375)
    u, up = one_round(algo, POINTS, t(0.0, 0.0), steps=[2, 1, 2], lr=0.5, engine=engine)
    close(up["delta"], torch.stack([t(0.875, 0.0), t(0.0, 1.0), t(-0.875, -0.4375)]))
    close(u, t(0.0, 0.1875))


@pytest.mark.parametrize("engine", ENGINES)
def test_dropped_client_and_data_weights(engine):
    algo = make_algorithm("fedcm", 3, 2, [2, 1, 3], alpha=0.5)
    # client 1 dropped: Δ_0 = (1.5, 0) (E=2), Δ_2 = (−1.5, −0.75) (E=2), each /(2·0.5) = itself
    u, _ = one_round(algo, POINTS, t(0.0, 0.0), steps=[2, 0, 2], lr=0.5, engine=engine,
                     dropped=[False, True, False])
    close(u, t(0.0, -0.375))
    close(algo.d, t(0.0, 0.375))
    algo = make_algorithm("fedcm", 3, 2, [2, 1, 3], weighting="data", alpha=0.5)
    one_round(algo, POINTS, t(0.0, 0.0), steps=[2, 1, 2], lr=0.5, engine=engine)
    # q = (2, 1, 3)/6: d̄ = −(2/6 (1.5, 0) + 1/6 (0, 4) + 3/6 (−1.5, −0.75)) = (0.25, −7/24)
    close(algo.d, t(0.25, -7 / 24))


@pytest.mark.parametrize("engine", ENGINES)
def test_alpha_one_is_fedavg(engine):
    cm = make_algorithm("fedcm", 3, 2, [2, 1, 3], alpha=1.0)
    avg = make_algorithm("fedavg", 3, 2, [2, 1, 3])
    w_cm = w_avg = t(0.5, -0.25)
    for r, steps in enumerate([[2, 1, 2], [1, 2, 2], [3, 3, 1]]):
        w_cm = w_cm + one_round(cm, POINTS, w_cm, steps=steps, lr=0.3, engine=engine, round=r)[0]
        w_avg = w_avg + one_round(avg, POINTS, w_avg, steps=steps, lr=0.3, engine=engine, round=r)[0]
    assert torch.equal(w_cm, w_avg)


def test_state_round_trip():
    a = make_algorithm("fedcm", 3, 2, [2, 1, 3], alpha=0.3)
    assert a.state_dict() == {}
    one_round(a, POINTS, t(0.0, 0.0), steps=[2, 1, 2], lr=0.5)
    b = make_algorithm("fedcm", 3, 2, [2, 1, 3], alpha=0.3)
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.d, a.d)
    w = t(0.2, 0.1)
    ua, _ = one_round(a, POINTS, w, steps=[1, 2, 2], lr=0.5, round=1)
    ub, _ = one_round(b, POINTS, w, steps=[1, 2, 2], lr=0.5, round=1)
    assert torch.equal(ua, ub) and torch.equal(a.d, b.d)
    fresh = make_algorithm("fedcm", 3, 2, [2, 1, 3], alpha=0.3)
    fresh.load_state_dict({})
    assert fresh.d is None


def plan(work):
    work = torch.tensor(work)
    return RoundPlan(0, torch.arange(len(work)), work, work.clone(), torch.tensor([2, 1, 3]), work == 0, 3, 0.5)


def test_accounting():
    algo = make_algorithm("fedcm", 3, 2, [2, 1, 3], alpha=0.5)
    p = plan([3, 0, 1])                                    # one dropped
    algo.broadcast(t(0.0, 0.0), p)
    assert algo.communication(p) == (2, 3) and algo.compute(p) == 4   # first round: no d̄ to send
    algo.d = t(1.0, 1.0)
    algo.broadcast(t(0.0, 0.0), p)
    assert algo.communication(p) == (2, 6)                 # w^t and d̄ to each of the 3 sampled
    one = make_algorithm("fedcm", 3, 2, [2, 1, 3], alpha=1.0)
    one.d = t(1.0, 1.0)
    one.broadcast(t(0.0, 0.0), p)
    assert one.communication(p) == (2, 3)                  # α = 1: d̄ unused, not sent


def test_resume_from_checkpoint_is_exact(tmp_path):
    raw = tiny_raw(rounds=4, algorithm={"name": "fedcm", "alpha": 0.5},
                   server={"optimizer": "momentum", "lr": 0.5}, eval={"every": 2})
    full, _, saved = resumed_run(raw, tmp_path, stop=2)
    assert saved["algorithm"]["d"].shape == full.w.shape


def test_engines_agree_on_real_data():
    loop, _ = engine_runs({"rounds": 2, "algorithm": {"name": "fedcm", "alpha": 0.5}},
                          ("test/accuracy", "test/loss", "train/loss", "comm/up_models", "comm/down_models"))
    assert [h["comm/down_models"] for h in loop.history] == [4, 8]   # d̄ downloaded from round 2
    avg = train(build_config(tiny_raw(rounds=2)), progress=False)
    assert not torch.allclose(avg.w, loop.w)                           # momentum changes the run
    one = train(build_config(tiny_raw(rounds=2, algorithm={"name": "fedcm", "alpha": 1.0})), progress=False)
    assert torch.equal(one.w, avg.w)                                   # α = 1 is FedAvg on real data
