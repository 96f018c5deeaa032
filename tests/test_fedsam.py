"""FedSAM (local SAM steps) on the quadratic harness by hand, in both engines; r = 0, ‖g‖ = 0,
accounting and engine agreement on real data."""
import pytest
import torch

from fedsweep.config.schema import build_config
from fedsweep.sim.heterogeneity import RoundPlan
from fedsweep.runs.run import train
from conftest import engine_runs, tiny_raw
from quadratic import DTYPE, ENGINES, make_algorithm, one_round, t

POINTS = [torch.tensor([[1.0, 0.0], [3.0, 0.0]], dtype=DTYPE),      # c_0 = (2, 0),   ‖c_0‖ = 2
          torch.tensor([[0.0, 4.0]], dtype=DTYPE),                   # c_1 = (0, 4),   ‖c_1‖ = 4
          torch.tensor([[-2.0, -4.0], [-4.0, -4.0]], dtype=DTYPE),   # c_2 = (−3, −4), ‖c_2‖ = 5
          torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=DTYPE)]     # c_3 = (0, 0): g = 0 at w = 0
SIZES = [2, 1, 2, 2]


@pytest.mark.parametrize("engine", ENGINES)
def test_round_by_hand(engine):
    algo = make_algorithm("fedsam", 4, 2, SIZES, radius=0.5)
    u, up = one_round(algo, POINTS, t(0.0, 0.0), steps=[2, 1, 2, 2], lr=0.5, engine=engine)
    # v = w − c = g; the gradient at w + r g/‖g‖ is g + r g/‖g‖, so
    # w⁺ − c = v (1 − η − η r/‖v‖): v keeps its direction and s = ‖v‖ goes s ← 0.5 s − 0.25;
    # Δ = c (1 − s_k/s_0) from w = 0:
    #   c_0: s 2 → 0.75 → 0.125      Δ = (2, 0)(1 − 0.0625)   = (1.875, 0)
    #   c_1: s 4 → 1.75              Δ = (0, 4)(1 − 0.4375)   = (0, 2.25)
    #   c_2: s 5 → 2.25 → 0.875      Δ = (−3, −4)(1 − 0.175)  = (−2.475, −3.3)
    #   c_3: g = 0 → ε = 0 (guard), gradient at w is 0: Δ = 0 (no NaN)
    expect = torch.stack([t(1.875, 0.0), t(0.0, 2.25), t(-2.475, -3.3), t(0.0, 0.0)])
    torch.testing.assert_close(up["delta"], expect, rtol=0, atol=1e-9)
    torch.testing.assert_close(u, t(-0.15, -0.2625), rtol=0, atol=1e-9)   # (−0.6, −1.05)/4


@pytest.mark.parametrize("engine", ENGINES)
def test_radius_zero_is_fedavg(engine):
    sam = make_algorithm("fedsam", 4, 2, SIZES, radius=0.0)
    avg = make_algorithm("fedavg", 4, 2, SIZES)
    w = t(0.5, -0.25)
    u_sam, _ = one_round(sam, POINTS, w, steps=[2, 1, 3, 2], lr=0.3, engine=engine)
    u_avg, _ = one_round(avg, POINTS, w, steps=[2, 1, 3, 2], lr=0.3, engine=engine)
    assert torch.equal(u_sam, u_avg)
    assert sam.state_dict() == {}                                   # nothing persists across rounds


def test_accounting():
    algo = make_algorithm("fedsam", 3, 2, [2, 1, 3], radius=0.5)
    work = torch.tensor([3, 0, 1])
    p = RoundPlan(0, torch.arange(3), work, work.clone(), torch.tensor([2, 1, 3]), work == 0, 3, 0.5)
    assert algo.communication(p) == (2, 3)                          # as FedAvg
    assert algo.compute(p) == 2 * 4                                 # two passes per local step


def test_engines_agree_on_real_data():
    loop, _ = engine_runs({"rounds": 2, "algorithm": {"name": "fedsam", "radius": 0.5}},
                          ("test/accuracy", "test/loss", "train/loss", "compute/grad_evals"))
    avg = train(build_config(tiny_raw(rounds=2)), progress=False)
    assert not torch.allclose(avg.w, loop.w)
    assert [h["compute/grad_evals"] for h in loop.history] == [2 * h["compute/grad_evals"] for h in avg.history]
