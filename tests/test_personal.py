"""Ditto, FedPer, FedRep, FedBN (algorithms/personal.py) and q-FedAvg (algorithms/fairness.py) by hand on the
quadratic problem, in both engines; their personal models; state through a resume; on real data."""
import pytest
import torch

from conftest import resumed_run, tiny_raw
from quadratic import ENGINES, POINTS, close, make_algorithm, one_round, t

# Client means c_0 = (2, 0), c_1 = (0, 4), c_2 = (−2, −1); a full-batch gradient at w is w − c_i, and a
# client's loss F_i(w) is the mean of ½‖w − x‖² over its points. η_l = 0.5 throughout.
LAYOUT = (("body.weight", 0, 1), ("head.weight", 1, 2))   # w = (body, head)


@pytest.mark.parametrize("engine", ENGINES)
def test_ditto_two_rounds_by_hand(engine):
    algo = make_algorithm("ditto", 3, 2, [2, 1, 3], lam=1.0)
    # Round 1, w = 0, clients {0, 2}, E_i = 2, 1. Global: FedAvg's local SGD, Δ_0 = (1.5, 0), Δ_2 = (−1, −0.5).
    # Personal, v from w^t = 0: v ← v − ½((v − c) + λ(v − 0)):
    #   client 0: v = (1, 0), then (1, 0) − ½((−1, 0) + (1, 0)) = (1, 0)     (the fixed point c/(1 + λ))
    #   client 2: v = −½(0 − c_2) = (−1, −0.5)
    u, up = one_round(algo, POINTS, t(0.0, 0.0), steps=[2, 1], lr=0.5, engine=engine, clients=[0, 2])
    close(u, t(0.25, -0.25))
    w = t(0.25, -0.25)
    close(algo.personal_models(w, torch.tensor([0, 1, 2])), torch.stack([t(1.0, 0.0), w, t(-1.0, -0.5)]))
    # Round 2 from w = (0.25, −0.25), client 0, one step, v_0 = (1, 0):
    #   v = (1, 0) − ½(((1, 0) − (2, 0)) + ((1, 0) − (0.25, −0.25))) = (1.125, −0.125)
    one_round(algo, POINTS, w, steps=[1], lr=0.5, engine=engine, clients=[0], round=1)
    close(algo.personal_models(w, torch.tensor([0])), t(1.125, -0.125).unsqueeze(0))


@pytest.mark.parametrize("engine", ENGINES)
def test_dittos_global_model_is_fedavgs_and_a_dropped_client_keeps_no_personal_model(engine):
    ditto = make_algorithm("ditto", 3, 2, [2, 1, 3], lam=0.5)
    fedavg = make_algorithm("fedavg", 3, 2, [2, 1, 3])
    args = dict(steps=[2, 1, 3], lr=0.5, engine=engine, dropped=[False, True, False])
    u, _ = one_round(ditto, POINTS, t(0.3, -0.2), **args)
    u_avg, _ = one_round(fedavg, POINTS, t(0.3, -0.2), **args)
    close(u, u_avg)
    assert ditto.v.held(torch.tensor([0, 1, 2])).tolist() == [True, False, True]


# FedBN with w = (body, bn), bn a BatchNorm layer's parameter, is FedPer with that layer as the head
KEPT_LAST = {"fedper": {"layout": LAYOUT},
             "fedbn": {"layout": (("body.weight", 0, 1), ("bn.weight", 1, 2)), "batchnorm": ("bn",)}}


@pytest.mark.parametrize("name", KEPT_LAST)
@pytest.mark.parametrize("engine", ENGINES)
def test_fedper_and_fedbn_two_rounds_by_hand(engine, name):
    algo = make_algorithm(name, 3, 2, [2, 1, 3], **KEPT_LAST[name])
    # Round 1, w = 0 (no head yet: the global one), clients {0, 2}, E_i = 2, 1: every entry trains.
    #   client 0 ends at (1.5, 0): head 0;  client 2 at (−1, −0.5): head −0.5.  u = mean Δ on the body.
    u, _ = one_round(algo, POINTS, t(0.0, 0.0), steps=[2, 1], lr=0.5, engine=engine, clients=[0, 2])
    close(u, t(0.25, 0.0))
    w = t(0.25, 0.0)
    close(algo.personal_models(w, torch.tensor([0, 1, 2])), torch.stack([t(0.25, 0.0), w, t(0.25, -0.5)]))
    # Round 2, client 2, one step from (0.25, −0.5): gradient (2.25, 0.5) -> (−0.875, −0.75):
    #   Δ = (−1.125, −0.75) from w^t, u = (−1.125, 0), head_2 = −0.75
    u, _ = one_round(algo, POINTS, w, steps=[1], lr=0.5, engine=engine, clients=[2], round=1)
    close(u, t(-1.125, 0.0))
    close(algo.personal_models(w, torch.tensor([2])), t(0.25, -0.75).unsqueeze(0))


@pytest.mark.parametrize("engine", ENGINES)
def test_fedrep_trains_the_head_then_the_body_by_hand(engine):
    algo = make_algorithm("fedrep", 3, 2, [2, 1, 3], layout=LAYOUT, head_steps=1)
    # Client 2, 3 steps from w = 0: head step, gradient (2, 1) -> (0, −0.5); body steps, gradients
    #   (2, 0.5) -> (−1, −0.5), (1, 0.5) -> (−1.5, −0.5).  u = (−1.5, 0), head_2 = −0.5.
    u, _ = one_round(algo, POINTS, t(0.0, 0.0), steps=[3], lr=0.5, engine=engine, clients=[2])
    close(u, t(-1.5, 0.0))
    close(algo.personal_models(t(0.0, 0.0), torch.tensor([2])), t(0.0, -0.5).unsqueeze(0))
    # a straggler of one step trains its head only: the body does not move
    again = make_algorithm("fedrep", 3, 2, [2, 1, 3], layout=LAYOUT, head_steps=1)
    u, _ = one_round(again, POINTS, t(0.0, 0.0), steps=[1], lr=0.5, engine=engine, clients=[2], expected=3)
    close(u, t(0.0, 0.0))
    close(again.personal_models(t(0.0, 0.0), torch.tensor([2])), t(0.0, -0.5).unsqueeze(0))


def test_a_head_of_every_layer_is_refused_in_one_line():
    from fedsweep.util.errors import ConfigError
    with pytest.raises(ConfigError, match=r"algorithm.head_layers: the last 2 layer\(s\) leave none before them; the "
                                          r"model has 2 layer\(s\) with parameters \(body, head\); allowed 1..1"):
        make_algorithm("fedper", 3, 2, [2, 1, 3], layout=LAYOUT, head_layers=2)


@pytest.mark.parametrize("engine", ENGINES)
def test_qffl_one_round_by_hand(engine):
    algo = make_algorithm("qffl", 3, 2, [2, 1, 3], q=1.0)
    # F_0(0) = mean(½·1, ½·9) = 5/2;  F_2(0) = mean(½·2, ½·10, ½·17) = 29/6;  L = 1/η_l = 2.
    # Δ_0 = (1.5, 0), Δ_2 = (−1, −0.5);  h_k = q F^0 L²‖Δ_k‖² + L F_k:  h_0 = 9 + 5,  h_2 = 5 + 29/3
    # u = L Σ F_k Δ_k / Σ h_k
    u, up = one_round(algo, POINTS, t(0.0, 0.0), steps=[2, 1], lr=0.5, engine=engine, clients=[0, 2])
    close(up["loss"], t(5 / 2, 29 / 6))
    want = 2 * (5 / 2 * t(1.5, 0.0) + 29 / 6 * t(-1.0, -0.5)) / (14 + 5 + 29 / 3)
    close(u, want)
    assert algo.round_metrics(None)["qffl/mean_Fq"] == pytest.approx((5 / 2 + 29 / 6) / 2)


@pytest.mark.parametrize("engine", ENGINES)
def test_qffl_with_q_zero_is_fedavg_with_uniform_weights(engine):
    qffl = make_algorithm("qffl", 3, 2, [2, 1, 3], weighting="data", q=0.0)
    fedavg = make_algorithm("fedavg", 3, 2, [2, 1, 3])
    args = dict(steps=[2, 1, 3], lr=0.5, engine=engine, dropped=[False, True, False])
    close(one_round(qffl, POINTS, t(0.3, -0.2), **args)[0], one_round(fedavg, POINTS, t(0.3, -0.2), **args)[0])


@pytest.mark.parametrize("name", ["ditto", "fedper", "fedrep"])
def test_personal_state_resumes_exactly_and_personal_models_are_scored(name, tmp_path):
    raw = tiny_raw(algorithm={"name": name}, rounds=4, eval={"every": 2, "clients": "all"})
    full, _, saved = resumed_run({**raw, "engine": "vectorized"}, tmp_path, stop=2)
    assert saved["algorithm"]                                           # the personal rows are in it
    last = full.history[-1]
    assert 0 <= last["personal/accuracy_p10"] <= last["personal/accuracy_mean"] <= 1


def test_an_algorithms_own_metrics_reach_the_summary():
    import fedsweep
    result = fedsweep.run(tiny_raw(algorithm={"name": "qffl", "q": 2.0}, rounds=2), mlflow=False)
    last = result.rounds.iloc[-1]
    assert result.summary["final_qffl_mean_Fq"] == pytest.approx(last["qffl/mean_Fq"])
    assert result.summary["final_qffl_max_loss"] == pytest.approx(last["qffl/max_loss"])
    assert not any(k.startswith(("final_train", "final_round", "final_comm")) for k in result.summary)


BN_MLP = {"name": "mlp", "options": {"hidden": 16, "batchnorm": True}}


def test_fedbn_keeps_each_clients_statistics_scores_with_them_and_resumes_exactly(tmp_path):
    """Each client that took part has BatchNorm statistics of its own (the global ones never move); its
    personal accuracy equals an independent eval-mode count of the model with its BN layers and its
    statistics; a resume from a checkpoint continues exactly (the statistics are in it)."""
    import copy
    raw = tiny_raw(algorithm={"name": "fedbn"}, model=BN_MLP, rounds=4, engine="auto",
                   eval={"every": 2, "clients": "all"})
    full, _, saved = resumed_run(raw, tmp_path, stop=2)
    assert full.engine_name == "loop" and "client_buffers" in saved
    store, fm = full.client_buffers, full.fmodel
    assert torch.equal(fm.buffers["net.2.running_mean"], torch.zeros(16))          # the global ones: as built
    means = [store.own[c]["net.2.running_mean"] for c in sorted(store.own)]
    assert len(means) >= 2 and not torch.equal(means[0], means[1])
    ev, data = full.client_eval.groups[0], full.data
    W = full.algorithm.personal_models(full.w.detach(), ev.ids)
    for row, i in zip(full.client_eval_rows, range(len(ev.ids))):
        client = int(ev.ids[i])
        model = fm.load_into(W[i], copy.deepcopy(fm.module)).eval()
        for name, b in (store.own.get(client) or fm.buffers).items():
            model.get_buffer(name).copy_(b)
        rows = ev.test[i]
        with torch.no_grad():
            right = (model(data.x_test[rows]).argmax(1) == data.y_test[rows]).double().mean()
        assert row["personal_accuracy"] == pytest.approx(float(right))


def test_fedbn_without_batchnorm_is_one_line(tmp_path, capsys):
    import yaml
    from fedsweep.cli import main
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_raw(algorithm={"name": "fedbn"}, rounds=1)))
    assert main(["run", str(path)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "model.options.batchnorm: true" in errors[0], errors


def test_fedavg_ft_is_fedavg_whose_personal_models_are_its_fine_tuned_ones():
    """fedavg_ft trains FedAvg's global model; its personal/* are FedAvg's finetuned/* with the same steps
    and lr, exactly (the same fine-tuning batches)."""
    import fedsweep
    ev = {"every": 2, "clients": "all"}
    ft = fedsweep.run(tiny_raw(algorithm={"name": "fedavg_ft", "finetune_steps": 3, "finetune_lr": 0.05},
                               rounds=4, eval=ev), mlflow=False).rounds
    avg = fedsweep.run(tiny_raw(rounds=4, eval={**ev, "finetune_steps": 3, "finetune_lr": 0.05}), mlflow=False).rounds
    evals = avg["test/accuracy"].notna()
    assert evals.sum() == 2
    for stat in ("mean", "p10", "min", "weighted", "std"):
        assert ft.loc[evals, f"personal/accuracy_{stat}"].tolist() == avg.loc[evals, f"finetuned/accuracy_{stat}"].tolist()
        assert ft.loc[evals, f"served/accuracy_{stat}"].tolist() == ft.loc[evals, f"personal/accuracy_{stat}"].tolist()
        assert ft.loc[evals, f"clients/accuracy_{stat}"].tolist() == avg.loc[evals, f"clients/accuracy_{stat}"].tolist()
