"""FedProx (Li et al. 2020, eq. 2) on the quadratic harness, by hand, in both engines."""
import pytest
import torch

from conftest import assert_engines_agree, tiny_raw
from fedsweep.config.schema import build_config
from quadratic import DTYPE, ENGINES, POINTS, SIZES, make_algorithm, one_round

W0 = torch.tensor([1.0, 1.0], dtype=DTYPE)                           # w^t
D = torch.stack([p.mean(0) for p in POINTS]) - W0                   # d_i = c_i − w^t: (1,−1), (−1,3), (−3,−2)
Q = {"uniform": torch.tensor([1 / 3] * 3, dtype=DTYPE), "data": torch.tensor([2 / 6, 1 / 6, 3 / 6], dtype=DTYPE)}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("weighting", ["uniform", "data"])
def test_fedprox_round_by_hand(engine, weighting):
    algo = make_algorithm("fedprox", 3, 2, SIZES, weighting=weighting, mu=0.5)
    u, up = one_round(algo, POINTS, W0, steps=[3, 1, 2], lr=0.5, engine=engine)
    # x = w − w^t, gradient of the step = (w − c) + μ(w − w^t) = (x − d) + 0.5 x, η = 0.5:
    #   x ← x − 0.5(x − d) − 0.25 x = 0.25 x + 0.5 d
    #   x_1 = 0.5 d,  x_2 = 0.125 d + 0.5 d = 0.625 d,  x_3 = 0.15625 d + 0.5 d = 0.65625 d
    # client 0 takes 3 steps, client 1 one (straggler), client 2 two (straggler)
    delta = torch.stack([0.65625 * D[0], 0.5 * D[1], 0.625 * D[2]])
    torch.testing.assert_close(up["delta"], delta, rtol=0, atol=1e-9)
    torch.testing.assert_close(u, Q[weighting] @ delta, rtol=0, atol=1e-9)     # u = Σ q_i Δ_i


@pytest.mark.parametrize("engine", ENGINES)
def test_fedprox_differs_from_fedavg_by_the_prox_term(engine):
    # FedAvg on the same round: x ← 0.5 x + 0.5 d, so x_3 = 0.875 d; the prox term pulls it back
    u_avg, up = one_round(make_algorithm("fedavg", 3, 2, SIZES), POINTS, W0, [3, 1, 2], 0.5, engine)
    torch.testing.assert_close(up["delta"][0], 0.875 * D[0], rtol=0, atol=1e-9)
    u_prox, _ = one_round(make_algorithm("fedprox", 3, 2, SIZES, mu=0.5), POINTS, W0, [3, 1, 2], 0.5, engine)
    assert (u_avg - u_prox).abs().max() > 0.05


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("weighting", ["uniform", "data"])
def test_mu_zero_is_fedavg(engine, weighting):
    args = (POINTS, W0, [3, 1, 2], 0.5, engine)
    u_prox, up_prox = one_round(make_algorithm("fedprox", 3, 2, SIZES, weighting=weighting, mu=0.0), *args)
    u_avg, up_avg = one_round(make_algorithm("fedavg", 3, 2, SIZES, weighting=weighting), *args)
    torch.testing.assert_close(up_prox["delta"], up_avg["delta"], rtol=0, atol=1e-12)
    torch.testing.assert_close(u_prox, u_avg, rtol=0, atol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_dropped_client_counts_for_nothing(engine):
    algo = make_algorithm("fedprox", 3, 2, SIZES, mu=0.5)
    u, _ = one_round(algo, POINTS, W0, [3, 0, 2], 0.5, engine, dropped=[False, True, False])
    torch.testing.assert_close(u, (0.65625 * D[0] + 0.625 * D[2]) / 2, rtol=0, atol=1e-9)


def test_communication_and_compute():
    from fedsweep.sim.heterogeneity import RoundPlan
    algo = make_algorithm("fedprox", 3, 2, SIZES, mu=0.5)
    work = torch.tensor([3, 0, 2])
    plan = RoundPlan(0, torch.arange(3), work, work.clone(), torch.tensor(SIZES), work == 0, 3, 0.5)
    assert algo.communication(plan) == (2, 3)          # 1 model up per returning client, 1 down per sampled
    assert algo.compute(plan) == 5.0                   # Σ E_i gradient passes: the prox term costs none


def test_mu_is_validated():
    from fedsweep.config.schema import ConfigError
    with pytest.raises(ConfigError, match="mu"):
        build_config(tiny_raw(algorithm={"name": "fedprox", "mu": -1}))
    with pytest.raises(ConfigError, match="momentum"):
        build_config(tiny_raw(algorithm={"name": "fedprox", "momentum": 0.5}))


CASES = {
    "fedprox-stragglers-data-weights": {"algorithm": {"name": "fedprox", "mu": 0.5, "weighting": "data"}},
}


@pytest.mark.parametrize("case", list(CASES))
def test_engines_agree(case):
    assert_engines_agree(CASES[case], ("test/accuracy", "test/loss", "train/loss", "comm/up_models",
                                       "compute/grad_evals"))
