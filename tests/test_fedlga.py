"""FedLGA's server-side compensation (eq. 5–7) against values computed by hand."""
import pytest
import torch

from fedsweep.algorithms import get_algorithm_class
from fedsweep.algorithms.base import SetupContext
from fedsweep.sim.heterogeneity import RoundPlan
from quadratic import ENGINES, POINTS, SIZES, close, make_algorithm, one_round, t


def make(name="fedlga", weighting="uniform", **params):
    """The algorithm on a 3-client, 2-d problem; fedlga's tests below compute the `projection`
    reading unless they name another."""
    if name == "fedlga":
        params.setdefault("reading", "projection")
    cls = get_algorithm_class(name)
    ctx = SetupContext(num_clients=3, dim=2, client_sizes=torch.tensor([1, 1, 3]), weighting=weighting,
                       local_steps=4, device=torch.device("cpu"), dtype=torch.float64)
    return cls(cls.Params(**params), ctx)


def plan(work, lr=0.5, sizes=(1, 1, 3)):
    work = torch.tensor(work)
    return RoundPlan(0, torch.arange(len(work)), work, work.clone(), torch.tensor(sizes),
                     work == 0, 4, lr)


W = torch.tensor([1.0, -1.0], dtype=torch.float64)
DELTA = torch.tensor([[-0.4, 0.2],     # client 0: full E = 4 steps
                      [-0.2, 0.6],     # client 1: full
                      [0.5, 0.5]],     # client 2: straggler, E_2 = 1
                     dtype=torch.float64)


def test_mean_grad_source_by_hand():
    algo = make(damping=0.0)
    u = algo.aggregate(W, {"delta": DELTA}, plan([4, 4, 1]))
    # ŵ = w + mean(Δ0, Δ1) = (1 − 0.3, −1 + 0.4) = (0.7, −0.6); w_2 = w + Δ2 = (1.5, −0.5)
    # v = ŵ − w_2 = (−0.8, −0.1); g_2 = −Δ2/(η_l E_2) = (−1, −1); gᵀv = 0.9
    # Δ̂_2 = Δ2 + 0.9 g = (0.5 − 0.9, 0.5 − 0.9) = (−0.4, −0.4)
    expect = (DELTA[0] + DELTA[1] + torch.tensor([-0.4, -0.4], dtype=torch.float64)) / 3
    torch.testing.assert_close(u, expect, rtol=0, atol=1e-12)


def test_damping_scales_the_correction():
    algo = make(damping=0.5)
    u = algo.aggregate(W, {"delta": DELTA}, plan([4, 4, 1]))
    coef = 0.9 / (1 + 0.5 * 2.0)                                   # gᵀv / (1 + λ‖g‖²), ‖g‖² = 2
    d2 = DELTA[2] + coef * torch.tensor([-1.0, -1.0], dtype=torch.float64)
    torch.testing.assert_close(u, (DELTA[0] + DELTA[1] + d2) / 3, rtol=0, atol=1e-12)


def test_uploaded_gradient_and_data_weights():
    algo = make(grad_source="last", damping=0.0, weighting="data")
    g = torch.tensor([[9.0, 9.0], [9.0, 9.0], [2.0, 0.0]], dtype=torch.float64)
    u = algo.aggregate(W, {"delta": DELTA, "grad": g}, plan([4, 4, 1]))
    d2 = DELTA[2] + (2.0 * -0.8) * torch.tensor([2.0, 0.0], dtype=torch.float64)   # g (gᵀv), gᵀv = −1.6
    torch.testing.assert_close(u, (DELTA[0] + DELTA[1] + 3 * d2) / 5, rtol=0, atol=1e-12)


def test_no_stragglers_is_fedavg():
    u = make().aggregate(W, {"delta": DELTA}, plan([4, 4, 4]))
    torch.testing.assert_close(u, make("fedavg").aggregate(W, {"delta": DELTA}, plan([4, 4, 4])))


def test_all_stragglers_fallbacks():
    p = plan([2, 1, 1])
    u = make(fallback="fedavg").aggregate(W, {"delta": DELTA}, p)
    torch.testing.assert_close(u, DELTA.mean(0))
    algo = make(fallback="extrapolate", damping=0.0)
    u = algo.aggregate(W, {"delta": DELTA}, p)
    w_hat = W + (DELTA * torch.tensor([[2.0], [4.0], [4.0]], dtype=torch.float64)).mean(0)
    g = -DELTA / (0.5 * torch.tensor([[2.0], [1.0], [1.0]], dtype=torch.float64))
    v = w_hat - (W + DELTA)
    torch.testing.assert_close(u, (DELTA + (g * v).sum(1, keepdim=True) * g).mean(0))


def test_dropped_clients_count_for_nothing():
    algo = make(damping=0.0)
    u = algo.aggregate(W, {"delta": DELTA}, plan([4, 0, 1]))       # client 1 dropped out
    w_hat = W + DELTA[0]
    g = -DELTA[2] / 0.5
    d2 = DELTA[2] + torch.dot(g, w_hat - W - DELTA[2]) * g
    torch.testing.assert_close(u, (DELTA[0] + d2) / 2)


@pytest.mark.parametrize("source,up", [("mean", 3), ("last", 4), ("exact", 4)])
def test_communication_counts_extra_uploads(source, up):
    assert make(grad_source=source).communication(plan([4, 4, 1])) == (up, 3)


# ----- readings of eq. (4)–(5) (docs/algorithms.md) -------------------------------------------------
# Same straggler as above: g_2 = (−1, −1), v = ŵ − w_2 = (−0.8, −0.1), gᵀv = 0.9, and it missed
# m_2 = E − E_2 = 3 steps of η_l = 0.5: η_l m_2 = 1.5.

@pytest.mark.parametrize("reading,damping,d2", [
    ("projection", 0.0, (-0.4, -0.4)),                 # Δ2 + 0.9 g
    ("continuation", 0.0, (3.35, 3.35)),               # Δ2 − 1.5 (g + 0.9 g) = 0.5 + 1.5 · 1.9
    ("continuation", 0.5, (2.675, 2.675)),             # coef 0.9 / (1 + 0.5 · 2) = 0.45: 0.5 + 1.5 · 1.45
    ("continuation", "step", (2.3375, 2.3375)),        # λ_2 = η_l m_2 = 1.5: coef 0.9 / (1 + 1.5 · 2) = 0.225
    ("projection", "step", (0.275, 0.275)),            # Δ2 + 0.225 g
    ("extrapolation", 0.0, (2.0, 2.0)),                # Δ2 − 1.5 g = Δ2 · E/E_2 = 4 Δ2
    ("extrapolation", 7.0, (2.0, 2.0)),                # no Hessian term: λ plays no part
])
def test_readings_by_hand(reading, damping, d2):
    u = make(reading=reading, damping=damping).aggregate(W, {"delta": DELTA}, plan([4, 4, 1]))
    torch.testing.assert_close(u, (DELTA[0] + DELTA[1] + torch.tensor(d2, dtype=torch.float64)) / 3,
                               rtol=0, atol=1e-12)


def test_step_damping_bounds_the_hessian_term_by_the_distance_to_w_hat():
    """`damping: step` (λ_i = η_l m_i): the Hessian term moves the straggler by at most the projection
    of ŵ − w_i on g_i, however large ‖g_i‖; undamped it grows with ‖g_i‖² (what diverged on MNIST)."""
    for scale in (1.0, 10.0, 1e3):
        delta = DELTA.clone()
        delta[2] *= scale                                        # ‖g_2‖ = scale·√2
        parts = {}
        for damping in (0.0, "step"):
            with_h = make(reading="continuation", damping=damping).aggregate(W, {"delta": delta}, plan([4, 4, 1]))
            without = make(reading="extrapolation").aggregate(W, {"delta": delta}, plan([4, 4, 1]))
            parts[damping] = ((with_h - without) * 3).norm().item()   # the Hessian term's displacement of client 2
        g = -delta[2] / 0.5
        v = W + (delta[0] + delta[1]) / 2 - (W + delta[2])
        bound = ((g @ v).abs() / g.norm()).item()
        assert parts["step"] <= bound + 1e-9
        assert parts[0.0] == pytest.approx(1.5 * (g @ g).item() * bound, rel=1e-9)


@pytest.mark.parametrize("reading", ["projection", "continuation", "extrapolation"])
def test_every_reading_is_fedavg_without_stragglers(reading):
    p = plan([4, 4, 4])
    u = make(reading=reading).aggregate(W, {"delta": DELTA}, p)
    torch.testing.assert_close(u, make("fedavg").aggregate(W, {"delta": DELTA}, p), rtol=0, atol=0)


def test_extrapolation_needs_no_full_client():
    """All stragglers: extrapolation still continues each one (ŵ plays no part)."""
    u = make(reading="extrapolation", fallback="fedavg").aggregate(W, {"delta": DELTA}, plan([2, 1, 1]))
    torch.testing.assert_close(u, (DELTA * torch.tensor([[2.0], [4.0], [4.0]], dtype=torch.float64)).mean(0))


def test_missing_steps_count_sgd_steps_in_either_unit():
    work, sizes = torch.tensor([4, 1, 3, 0]), torch.tensor([25, 25, 7, 9])
    by_steps = RoundPlan(0, torch.arange(4), work, work.clone(), sizes, work == 0, 4, 0.1)
    assert by_steps.missing_steps.tolist() == [0, 3, 1, 0]               # E − E_i; dropped: 0
    per_epoch = (sizes + 9) // 10                                         # B = 10: 3, 3, 1, 1 batches
    by_epochs = RoundPlan(0, torch.arange(4), work, work * per_epoch, sizes, work == 0, 4, 0.1)
    assert by_epochs.missing_steps.tolist() == [0, 9, 1, 0]              # (E − E_i) · ceil(n_i/B)


# Through the real engines on the quadratic problem (tests/quadratic.py): w = 0, η_l = 0.5, E = 3,
# full-batch steps w ← w − η_l (w − c_i). Clients 0 and 1 do 3 steps: Δ0 = 0.875 c_0 = (1.75, 0),
# Δ1 = 0.875 c_1 = (0, 3.5). Client 2 does 1: Δ2 = 0.5 c_2 = (−1, −0.5), and misses m = 2 steps.
# ŵ = (Δ0 + Δ1)/2 = (0.875, 1.75); v = ŵ − w_2 = (1.875, 2.25).
# `mean` and `last` (one step from w = 0) both give g = w − c_2 = (2, 1): gᵀv = 6, G v = (12, 6).
# `exact` is the gradient at w_2: (1, 0.5): gᵀv = 3, G v = (3, 1.5).
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("reading,source,d2", [
    ("projection", "mean", (11.0, 5.5)),               # Δ2 + G v
    ("continuation", "mean", (-15.0, -7.5)),           # Δ2 − 0.5 · 2 · (g + G v) = Δ2 − (14, 7)
    ("continuation", "last", (-15.0, -7.5)),
    ("continuation", "exact", (-5.0, -2.5)),           # Δ2 − ((1, 0.5) + (3, 1.5))
    ("extrapolation", "mean", (-3.0, -1.5)),           # Δ2 − (2, 1) = 3 Δ2
    ("extrapolation", "exact", (-2.0, -1.0)),          # Δ2 − (1, 0.5)
])
def test_readings_in_both_engines_by_hand(engine, reading, source, d2):
    algo = make_algorithm("fedlga", 3, 2, SIZES, reading=reading, grad_source=source, damping=0.0)
    u, _ = one_round(algo, POINTS, t(0.0, 0.0), [3, 3, 1], 0.5, engine=engine, expected=3)
    close(u, (t(1.75, 0.0) + t(0.0, 3.5) + t(*d2)) / 3)


@pytest.mark.parametrize("value", ["-1", "big", "inf"])
def test_damping_is_a_number_or_step_in_one_line(value):
    from fedsweep.config.schema import ConfigError, build_config
    from conftest import tiny_raw
    with pytest.raises(ConfigError) as e:
        build_config(tiny_raw(algorithm={"name": "fedlga"}), [f"algorithm.damping={value}"])
    want = "Input should be a finite number" if value == "inf" else "allowed: a number ≥ 0, or 'step'"
    assert str(e.value).startswith(f"algorithm.damping: {want}") and "\n" not in str(e.value)
    assert build_config(tiny_raw(algorithm={"name": "fedlga"}), ["algorithm.damping=step"]).algorithm.damping == "step"
