"""FedNova (Wang et al. 2020, Sec. 4–5) on the quadratic harness, by hand, in both engines."""
import pytest
import torch

from conftest import assert_engines_agree, final
from fedsweep.algorithms.fednova import normalizer_recursion
from fedsweep.sim.heterogeneity import RoundPlan
from quadratic import DTYPE, ENGINES, POINTS, SIZES, make_algorithm, one_round

W0 = torch.tensor([1.0, 1.0], dtype=DTYPE)                           # w^t
D = torch.stack([p.mean(0) for p in POINTS]) - W0                   # d_i = c_i − w^t
Q = {"uniform": torch.tensor([1 / 3] * 3, dtype=DTYPE), "data": torch.tensor([2 / 6, 1 / 6, 3 / 6], dtype=DTYPE)}
STEPS = [3, 1, 2]                                                    # clients 1 and 2 are stragglers (E = 3)
# In x = w − w^t the full-batch gradient is ∇F_i = x − d_i; η_l = 0.5 throughout.


def nova(weighting="uniform", **params):
    return make_algorithm("fednova", 3, 2, SIZES, weighting=weighting, **params)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("weighting", ["uniform", "data"])
def test_plain_round_by_hand(engine, weighting):
    u, up = one_round(nova(weighting), POINTS, W0, STEPS, lr=0.5, engine=engine)
    # plain SGD: x ← 0.5 x + 0.5 d → x_1 = 0.5 d, x_2 = 0.75 d, x_3 = 0.875 d;  a_i = τ_i = (3, 1, 2)
    delta = torch.stack([0.875 * D[0], 0.5 * D[1], 0.75 * D[2]])
    a = torch.tensor([3.0, 1.0, 2.0], dtype=DTYPE)
    q = Q[weighting]
    tau_eff = q @ a                               # uniform: 6/3 = 2;  data: (6 + 1 + 6)/6 = 13/6
    assert float(tau_eff) == pytest.approx(2.0 if weighting == "uniform" else 13 / 6)
    torch.testing.assert_close(up["delta"], delta, rtol=0, atol=1e-9)
    torch.testing.assert_close(u, tau_eff * (q / a) @ delta, rtol=0, atol=1e-9)


@pytest.mark.parametrize("engine", ENGINES)
def test_momentum_round_by_hand(engine):
    u, up = one_round(nova("data", momentum=0.5), POINTS, W0, STEPS, lr=0.5, engine=engine)
    # m ← 0.5 m + (x − d), x ← x − 0.5 m, from m = x = 0:
    #   step 1: g = −d,     m = −d,                 x = 0.5 d
    #   step 2: g = −0.5 d, m = −0.5 d − 0.5 d = −d, x = 0.5 d + 0.5 d = d
    #   step 3: g = 0,      m = −0.5 d,             x = d + 0.25 d = 1.25 d
    delta = torch.stack([1.25 * D[0], 0.5 * D[1], 1.0 * D[2]])
    # a(τ) = [τ − ρ(1 − ρ^τ)/(1 − ρ)]/(1 − ρ), ρ = 0.5: a(1) = (1 − 0.5)/0.5 = 1,
    # a(2) = (2 − 0.75)/0.5 = 2.5 (= 1 + 1.5), a(3) = (3 − 0.875)/0.5 = 4.25 (= 1 + 1.5 + 1.75)
    a = torch.tensor([4.25, 1.0, 2.5], dtype=DTYPE)
    tau_eff = (2 * 4.25 + 1 * 1.0 + 3 * 2.5) / 6                    # data weights (2, 1, 3)/6: 17/6
    expect = tau_eff * (Q["data"] / a) @ delta
    torch.testing.assert_close(up["delta"], delta, rtol=0, atol=1e-9)
    torch.testing.assert_close(u, expect, rtol=0, atol=1e-9)


@pytest.mark.parametrize("engine", ENGINES)
def test_proximal_round_by_hand(engine):
    u, up = one_round(nova(mu=0.5), POINTS, W0, STEPS, lr=0.5, engine=engine)
    # x ← x − 0.5[(x − d) + 0.5 x] = 0.25 x + 0.5 d → x_1 = 0.5 d, x_2 = 0.625 d, x_3 = 0.65625 d
    delta = torch.stack([0.65625 * D[0], 0.5 * D[1], 0.625 * D[2]])
    # ημ = 0.25, a(τ) = [1 − 0.75^τ]/0.25: a(1) = 1, a(2) = 0.4375/0.25 = 1.75, a(3) = 0.578125/0.25 = 2.3125
    a = torch.tensor([2.3125, 1.0, 1.75], dtype=DTYPE)
    tau_eff = (2.3125 + 1.0 + 1.75) / 3                             # 1.6875
    torch.testing.assert_close(up["delta"], delta, rtol=0, atol=1e-9)
    torch.testing.assert_close(u, tau_eff * (Q["uniform"] / a) @ delta, rtol=0, atol=1e-9)
    # the authors' code's τ_eff with prox: Σ q_i τ_i = (3 + 1 + 2)/3 = 2
    u_code, _ = one_round(nova(mu=0.5, tau_eff="code"), POINTS, W0, STEPS, lr=0.5, engine=engine)
    torch.testing.assert_close(u_code, 2.0 * (Q["uniform"] / a) @ delta, rtol=0, atol=1e-9)


@pytest.mark.parametrize("engine", ENGINES)
def test_momentum_and_proximal_round_by_hand(engine):
    u, up = one_round(nova(momentum=0.5, mu=0.5), POINTS, W0, STEPS, lr=0.5, engine=engine)
    # m ← 0.5 m + (x − d) + 0.5 x, x ← x − 0.5 m:
    #   step 1: g = −d,                       m = −d,                      x = 0.5 d
    #   step 2: g = 0.5d − d + 0.25d = −0.25d, m = −0.5d − 0.25d = −0.75 d, x = 0.5 d + 0.375 d = 0.875 d
    #   step 3: g = 0.875d − d + 0.4375d = 0.3125d, m = −0.375d + 0.3125d = −0.0625d, x = 0.90625 d
    delta = torch.stack([0.90625 * D[0], 0.5 * D[1], 0.875 * D[2]])
    # coefficients of ∇F_i (g_1, g_2, …) in x_τ/(−η): τ=1: [1]; τ=2: [1 + ρ − ημ, 1] = [1.25, 1];
    # τ=3: [1.0625, 1.25, 1] → a = (3.3125, 1, 2.25); check: −0.5(1.0625(−d) + 1.25(−0.5d) + (−0.125d)) = 0.90625 d
    a = torch.tensor([3.3125, 1.0, 2.25], dtype=DTYPE)
    tau_eff = (3.3125 + 1.0 + 2.25) / 3
    torch.testing.assert_close(up["delta"], delta, rtol=0, atol=1e-9)
    torch.testing.assert_close(u, tau_eff * (Q["uniform"] / a) @ delta, rtol=0, atol=1e-9)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("weighting", ["uniform", "data"])
def test_equal_steps_plain_is_fedavg(engine, weighting):
    args = (POINTS, W0, [3, 3, 3], 0.5, engine)
    u_nova, _ = one_round(nova(weighting), *args)
    u_avg, _ = one_round(make_algorithm("fedavg", 3, 2, SIZES, weighting=weighting), *args)
    torch.testing.assert_close(u_nova, u_avg, rtol=0, atol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_equal_steps_proximal_is_fedprox(engine):
    args = (POINTS, W0, [3, 3, 3], 0.5, engine)
    u_nova, _ = one_round(nova("data", mu=0.5), *args)
    u_prox, _ = one_round(make_algorithm("fedprox", 3, 2, SIZES, weighting="data", mu=0.5), *args)
    torch.testing.assert_close(u_nova, u_prox, rtol=0, atol=1e-12)
    # with the code's τ_eff = τ = 3 instead of a(3) = 2.3125 the update is scaled by 3/2.3125
    u_code, _ = one_round(nova("data", mu=0.5, tau_eff="code"), *args)
    torch.testing.assert_close(u_code, u_prox * (3 / 2.3125), rtol=0, atol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_unequal_steps_reweights_fedavg(engine):
    # Same local updates as FedAvg; FedAvg weighs client i by q_i, which (Sec. 4) amounts to q_i a_i
    # in the surrogate objective; FedNova divides by a_i = τ_i and rescales by τ_eff = Σ q_i τ_i = 2.
    args = (POINTS, W0, STEPS, 0.5, engine)
    u_nova, up_nova = one_round(nova(), *args)
    u_avg, up_avg = one_round(make_algorithm("fedavg", 3, 2, SIZES), *args)
    torch.testing.assert_close(up_nova["delta"], up_avg["delta"], rtol=0, atol=1e-12)
    tau = torch.tensor(STEPS, dtype=DTYPE)
    torch.testing.assert_close(u_nova, (2.0 / tau / 3) @ up_avg["delta"], rtol=0, atol=1e-12)
    assert (u_nova - u_avg).abs().max() > 0.1


@pytest.mark.parametrize("engine", ENGINES)
def test_dropped_client_counts_for_nothing(engine):
    u, _ = one_round(nova(momentum=0.5), POINTS, W0, [3, 0, 2], 0.5, engine, dropped=[False, True, False])
    # q = (1/2, 0, 1/2), a = (4.25, 0, 2.5), τ_eff = (4.25 + 2.5)/2 = 3.375; no 0/0 from the dropped client
    expect = 3.375 * (0.5 * 1.25 * D[0] / 4.25 + 0.5 * 1.0 * D[2] / 2.5)
    assert bool(torch.isfinite(u).all())
    torch.testing.assert_close(u, expect, rtol=0, atol=1e-9)


def test_normalizer_closed_forms_match_the_recursion():
    steps = torch.tensor([0, 1, 2, 5, 17])
    plan = RoundPlan(0, torch.arange(5), steps, steps.clone(), torch.ones(5, dtype=torch.long),
                     steps == 0, 17, 0.1)
    for rho, mu in [(0.0, 0.0), (0.9, 0.0), (0.0, 0.01), (0.3, 0.5)]:
        got = nova(momentum=rho, mu=mu).normalizer(plan)
        torch.testing.assert_close(got, normalizer_recursion(steps, rho, 0.1 * mu), rtol=1e-12, atol=1e-12)
        # the authors' code's per-step recursions (for one of ρ, μ nonzero)
        if mu == 0 or rho == 0:
            for k, tau in enumerate(steps.tolist()):
                vec, counter = 0.0, 0.0
                for _ in range(tau):
                    if rho:
                        counter = counter * rho + 1
                        vec += counter
                    if mu:
                        vec = vec * (1 - 0.1 * mu) + 1
                    if not rho and not mu:
                        vec += 1
                assert float(got[k]) == pytest.approx(vec, rel=1e-12, abs=1e-12)


def test_communication_and_compute():
    algo = nova(momentum=0.9, mu=0.01)
    work = torch.tensor([3, 0, 2])
    plan = RoundPlan(0, torch.arange(3), work, work.clone(), torch.tensor(SIZES), work == 0, 3, 0.5)
    assert algo.communication(plan) == (2, 3)          # Δ_i up per returning client (a_i from τ_i), w^t down
    assert algo.compute(plan) == 5.0                   # Σ τ_i: momentum and prox add no gradient pass


CASES = {
    "fednova-plain-uniform-steps": {"heterogeneity": {"kind": "uniform", "min_steps": 1},
                                    "algorithm": {"name": "fednova", "weighting": "data"}},
    "fednova-momentum-prox-stragglers": {"algorithm": {"name": "fednova", "momentum": 0.5, "mu": 0.01}},
    "fednova-prox-code-dropout": {"heterogeneity": {"kind": "profiles", "speeds": 1.0, "dropout": 0.3},
                                  "algorithm": {"name": "fednova", "mu": 0.1, "tau_eff": "code"}},
}


@pytest.mark.parametrize("case", list(CASES))
def test_engines_agree(case):
    assert_engines_agree(CASES[case], ("test/accuracy", "test/loss", "train/loss", "comm/up_models",
                                       "compute/grad_evals"))


def test_unequal_steps_change_training_on_real_data():
    over = {"heterogeneity": {"kind": "uniform", "min_steps": 1}}
    w_avg, _ = final("vectorized", over)
    w_nova, _ = final("vectorized", {**over, "algorithm": {"name": "fednova"}})
    assert not torch.allclose(w_avg, w_nova)
