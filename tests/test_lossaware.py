"""Loss-aware aggregation (FedSoftMax paper): weights computed by hand on quadratic clients, both engines.

The harness's three clients (quadratic.POINTS); every batch is a full batch, so F_i(w) = ½ mean_j ‖w − x_ij‖²,
which at w = 0 is F = (2.5, 8, 29/6), and Δ_i = (c_i − w)(1 − (1 − η)^{E_i}).
"""
import math

import pytest
import torch

from quadratic import C, DTYPE, ENGINES, POINTS, SIZES, make_algorithm, one_round

W = torch.zeros(2, dtype=DTYPE)
F = torch.tensor([2.5, 8.0, 29 / 6], dtype=DTYPE)                                  # F_i(0) by hand
STEPS, LR = [2, 1, 2], 0.5
DELTA = C * torch.tensor([[1 - 0.5 ** 2], [1 - 0.5], [1 - 0.5 ** 2]], dtype=DTYPE)


def run(name, engine="loop", weighting="uniform", dropped=None, **params):
    algo = make_algorithm(name, 3, 2, SIZES, weighting=weighting, **params)
    u, uploads = one_round(algo, POINTS, W, STEPS, LR, engine=engine, dropped=dropped)
    return algo, u, uploads


def softmax_weights(p, gap, T):
    a = p * torch.exp(gap / T)
    return a / a.sum()


@pytest.mark.parametrize("engine", ENGINES)
def test_clients_report_their_loss_at_the_global_model(engine):
    _, _, uploads = run("fedsoftmax", engine)
    torch.testing.assert_close(uploads["loss"], F, rtol=0, atol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("weighting", ["uniform", "data"])
def test_fedsoftmax_update(engine, weighting):
    p = torch.full((3,), 1 / 3, dtype=DTYPE) if weighting == "uniform" else torch.tensor(SIZES, dtype=DTYPE) / 6
    algo, u, _ = run("fedsoftmax", engine, weighting=weighting, temperature=2.0)
    alpha = softmax_weights(p, F, 2.0)                        # α_i ∝ p_i exp((F_i − 0)/T)
    torch.testing.assert_close(u, alpha @ DELTA, rtol=0, atol=1e-12)
    rec = algo.client_record(None)
    torch.testing.assert_close(rec["alpha"], alpha, rtol=0, atol=1e-12)
    torch.testing.assert_close(rec["abs_dev"], (alpha - p).abs(), rtol=0, atol=1e-12)


def test_code_convention_is_the_reciprocal_temperature():
    _, u_paper, _ = run("fedsoftmax", temperature=4.0)
    _, u_code, _ = run("fedsoftmax", temperature=0.25, temperature_scale="multiply")
    torch.testing.assert_close(u_code, u_paper, rtol=0, atol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_temperature_limits(engine):
    fedavg = DELTA.mean(0)
    _, hot, _ = run("fedsoftmax", engine, temperature=1e9)             # T → ∞: gen_fedavg
    torch.testing.assert_close(hot, fedavg, rtol=0, atol=1e-8)
    _, gen, _ = run("gen_fedavg", engine)
    torch.testing.assert_close(gen, fedavg, rtol=0, atol=1e-12)
    _, cold, _ = run("fedsoftmax", engine, temperature=1e-4)           # T → 0: fedmax (client 1, F = 8)
    torch.testing.assert_close(cold, DELTA[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_fedmax_and_fedmax_k(engine):
    _, u, _ = run("fedmax", engine)
    torch.testing.assert_close(u, DELTA[1], rtol=0, atol=1e-12)       # eq. (22): the worst-fit client only
    _, u, _ = run("fedmax_k", engine, k=2)                            # top two: F_1 = 8, F_2 = 4.83
    torch.testing.assert_close(u, (DELTA[1] + DELTA[2]) / 2, rtol=0, atol=1e-12)
    _, frac, _ = run("fedmax_k", engine, k=0.5)                       # ⌈0.5 · 3⌉ = 2
    torch.testing.assert_close(frac, u, rtol=0, atol=1e-12)
    _, every, _ = run("fedmax_k", engine, k=3)                        # k = K: uniform averaging
    torch.testing.assert_close(every, DELTA.mean(0), rtol=0, atol=1e-12)


def test_dropped_clients_get_no_weight():
    dropped = [False, True, False]                                    # the worst-fit client returns nothing
    _, u, _ = run("fedmax", dropped=dropped)
    torch.testing.assert_close(u, DELTA[2], rtol=0, atol=1e-12)
    algo, u, _ = run("fedsoftmax", dropped=dropped, temperature=2.0)
    alpha = softmax_weights(torch.tensor([0.5, 0.0, 0.5], dtype=DTYPE), F, 2.0)
    torch.testing.assert_close(algo.client_record(None)["alpha"], alpha, rtol=0, atol=1e-12)
    torch.testing.assert_close(u, alpha @ DELTA, rtol=0, atol=1e-12)
    _, u, _ = run("fedmax_k", dropped=dropped, k=3)                   # k above the returned count: all of them
    torch.testing.assert_close(u, (DELTA[0] + DELTA[2]) / 2, rtol=0, atol=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_running_min_optimal_loss(engine):
    # F_i^* = min(F_i(w^t), F_i(w_i^{t+1})); with w_i = c_i (1 − 0.5^{E_i}):
    # F_i(w_i) = F_i(0) − ½‖c_i‖²(1 − 0.25^{E_i}), so gap_i = ½‖c_i‖²(1 − 0.25^{E_i}).
    shrink = torch.tensor([1 - 0.25 ** 2, 1 - 0.25, 1 - 0.25 ** 2], dtype=DTYPE)
    gap = 0.5 * (C ** 2).sum(1) * shrink
    algo, u, uploads = run("fedsoftmax", engine, temperature=2.0, optimal_loss="running_min")
    torch.testing.assert_close(algo.fstar, F - gap, rtol=0, atol=1e-12)
    torch.testing.assert_close(algo.client_record(None)["gap"], gap, rtol=0, atol=1e-12)
    torch.testing.assert_close(u, softmax_weights(torch.full((3,), 1 / 3, dtype=DTYPE), gap, 2.0) @ DELTA,
                               rtol=0, atol=1e-12)
    state = algo.state_dict()
    other = make_algorithm("fedsoftmax", 3, 2, SIZES, temperature=2.0, optimal_loss="running_min")
    other.load_state_dict(state)
    torch.testing.assert_close(other.fstar, algo.fstar, rtol=0, atol=0)


def test_huge_losses_neither_overflow_nor_nan():
    algo = make_algorithm("fedsoftmax", 4, 2, [1, 1, 1, 1], temperature=1e-3)
    p = torch.full((4,), 0.25, dtype=DTYPE)
    returned = torch.tensor([True, True, True, False])
    for gap in ([1e6, 1e308, 5.0, 0.0], [1e300, 1e300, 1e300, 1e300], [0.0, 1e-12, 2e-12, 7.0]):
        alpha = algo.alpha(p, torch.tensor(gap, dtype=DTYPE), returned)
        assert torch.isfinite(alpha).all() and alpha.sum().item() == pytest.approx(1.0)
        assert alpha[3] == 0
    alpha = algo.alpha(p, torch.tensor([1e6, 1e308, 5.0, 0.0], dtype=DTYPE), returned)
    assert alpha.tolist() == [0.0, 1.0, 0.0, 0.0]
    equal = algo.alpha(p, torch.tensor([1e300] * 4, dtype=DTYPE), returned)
    torch.testing.assert_close(equal, torch.tensor([1 / 3, 1 / 3, 1 / 3, 0], dtype=DTYPE))
    hot = make_algorithm("fedsoftmax", 4, 2, [1, 1, 1, 1], temperature=1e300)
    torch.testing.assert_close(hot.alpha(p, torch.tensor([1e6, 2e6, 5.0, 0.0], dtype=DTYPE), returned),
                               torch.tensor([1 / 3, 1 / 3, 1 / 3, 0], dtype=DTYPE))
    inf = algo.alpha(p, torch.tensor([math.inf, 1.0, 0.0, 0.0], dtype=DTYPE), returned)   # a diverged client
    assert inf.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_params_are_validated():
    from fedsweep.config.schema import ConfigError, build_config
    from conftest import tiny_raw
    with pytest.raises(ConfigError, match="temperature"):
        build_config(tiny_raw(algorithm={"name": "fedsoftmax", "temperature": 0}))
    with pytest.raises(ConfigError, match="optimal_loss"):
        build_config(tiny_raw(algorithm={"name": "fedmax", "optimal_loss": "min"}))
    with pytest.raises(ConfigError, match="algorithm.k.*whole number"):
        build_config(tiny_raw(algorithm={"name": "fedmax_k", "k": 2.5}))
    with pytest.raises(ConfigError, match="algorithm.k: unknown key"):
        build_config(tiny_raw(algorithm={"name": "fedsoftmax", "k": 3}))


# ----- on real data, through Lightning ----------------------------------------------------------

from conftest import engine_runs, resumed_run, tiny_raw  # noqa: E402

from fedsweep.config.schema import build_config  # noqa: E402
from fedsweep.runs.run import stability, train  # noqa: E402

SOFTMAX = {"name": "fedsoftmax", "temperature": 0.5, "weighting": "data", "optimal_loss": "running_min"}


@pytest.mark.parametrize("name,params", [("fedsoftmax", SOFTMAX), ("fedmax_k", {"k": 2}),
                                         ("fedmax", {"loss_batch": "minibatch"})])
def test_engines_agree_and_records_are_kept(name, params):
    loop, vec = engine_runs({"algorithm": {"name": name, **params}})
    log = loop.client_log
    assert [r["round"] for r in log] == [1, 2, 3]
    for r_loop, r_vec in zip(log, vec.client_log):
        assert r_loop["client"] == r_vec["client"] and len(r_loop["alpha"]) == 4
        assert sum(r_loop["alpha"]) == pytest.approx(1.0)
        assert r_loop["alpha"] == pytest.approx(r_vec["alpha"], rel=1e-4, abs=1e-6)
    h = loop.history[-1]
    assert 1.0 <= h["weights/effective_clients"] <= 4.0 and 0 <= h["weights/mean_abs_dev"] <= h["weights/max_abs_dev"]
    fedavg = train(build_config(tiny_raw()), progress=False)
    assert not torch.allclose(loop.w, fedavg.w)                  # the losses change the aggregation


def test_gen_fedavg_is_fedavg():
    for weighting in ("uniform", "data"):
        a = train(build_config(tiny_raw(algorithm={"name": "gen_fedavg", "weighting": weighting})), progress=False)
        b = train(build_config(tiny_raw(algorithm={"name": "fedavg", "weighting": weighting})), progress=False)
        torch.testing.assert_close(a.w, b.w, rtol=0, atol=1e-6)


def test_resume_keeps_running_min_and_client_log(tmp_path):
    raw = tiny_raw(rounds=4, algorithm=SOFTMAX)
    full, resumed, _ = resumed_run(raw, tmp_path, stop=2)
    assert resumed.client_log == full.client_log
    torch.testing.assert_close(resumed.algorithm.fstar, full.algorithm.fstar, rtol=0, atol=0)


def test_clients_csv_artifact(tmp_path, tmp_mlflow):
    import csv

    from fedsweep.runs.run import write_artifacts
    m = train(build_config(tiny_raw(algorithm=SOFTMAX)), progress=False)
    write_artifacts(build_config(tiny_raw(algorithm=SOFTMAX)), m, {}, tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "clients.csv")))
    assert len(rows) == 3 * 4 and set(rows[0]) == {"round", "client", "p", "alpha", "abs_dev", "loss_global", "gap"}
    assert [int(r["round"]) for r in rows[:5]] == [1, 1, 1, 1, 2]
    plain = train(build_config(tiny_raw()), progress=False)
    write_artifacts(build_config(tiny_raw()), plain, {}, tmp_path / "fedavg")
    assert not (tmp_path / "fedavg" / "clients.csv").exists()


def test_stability_measure():
    smooth = [0.1, 0.2, 0.35, 0.55, 0.8, 1.1]                 # changes 0.1, 0.15, 0.2, 0.25, 0.3: one trend
    zigzag = [0.5, 0.7, 0.5, 0.7, 0.5, 0.7, 0.5]              # changes alternate ±0.2
    d = torch.tensor(smooth).diff().double()
    z = (d - d.mean()) / d.std(unbiased=False)
    assert stability(smooth) == pytest.approx(float((z[:-1] * z[1:]).sum() / (z * z).sum()))
    assert stability(smooth) > 0 > stability(zigzag)
    assert stability(zigzag) == pytest.approx(-5 / 6)          # Σ z z' = −5 over Σ z² = 6
    assert stability([0.5, 0.6, 0.7]) is None and stability([0.5] * 6) is None
