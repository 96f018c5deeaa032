"""``ops.logits`` and ``ops.accuracy`` in client code: the same numbers on the loop engine, under vmap
and row-wise on the stacked clients, and `fedsweep check` passes an algorithm that uses them."""
from __future__ import annotations

import pytest
import torch

import fedsweep
from conftest import tiny_raw
from fedsweep.config.registry import ALGORITHMS, MODELS


def drop_mlp(input_shape, num_classes):
    """An MLP with a dropout layer (seeded by fedsweep, keyed per batch)."""
    from torch import nn
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, num_classes))


class ProbeAccuracy(fedsweep.Algorithm):
    """FedAvg that uploads each client's accuracy on a fresh minibatch after its local steps and logs
    their mean: what an accuracy-weighted method would read."""
    name = "probe_accuracy"
    probe = "minibatch"
    rowwise = True
    metrics = ("probe_accuracy/mean",)

    def client_final(self, state, w0, ops, probe):
        return {"delta": state["w"] - w0, "acc": ops.accuracy(state["w"], probe)}

    def aggregate(self, w, uploads, plan):
        q = self.weights(plan)
        self._acc = float((q * uploads["acc"]).sum() / q.sum().clamp(min=1e-12))
        return q @ uploads["delta"]

    def round_metrics(self, plan):
        return {"probe_accuracy/mean": self._acc}


@pytest.fixture
def registered():
    fedsweep.register_algorithm(ProbeAccuracy)
    twin = type("ProbeAccuracyVmapped", (ProbeAccuracy,), {"name": "probe_accuracy_vmapped", "rowwise": False})
    fedsweep.register_algorithm(twin)
    fedsweep.register_model("ops_drop_mlp", input_shape=(1, 8, 8))(drop_mlp)
    yield
    for name in ("probe_accuracy", "probe_accuracy_vmapped"):
        ALGORITHMS.remove(name)
    MODELS.remove("ops_drop_mlp")


@pytest.mark.parametrize("model", [{"name": "mlp", "options": {"hidden": 16}},
                                   {"name": "ops_drop_mlp"}])   # seeded dropout: the probe's key reaches its masks
def test_accuracy_in_client_code_is_the_same_on_every_engine(registered, model):
    runs = {}
    for engine, name in (("loop", "probe_accuracy"), ("vectorized", "probe_accuracy"),
                         ("vectorized", "probe_accuracy_vmapped")):
        result = fedsweep.run(tiny_raw(algorithm={"name": name}, model=model, rounds=3, engine=engine), mlflow=False)
        runs[(engine, name)] = result.rounds["probe_accuracy/mean"].tolist()
    first, *others = runs.values()
    assert all(0.0 <= a <= 1.0 for a in first) and len(set(first)) > 1
    for other in others:
        assert other == pytest.approx(first, abs=1e-6)


def test_ops_accuracy_is_the_weighted_share_right():
    from fedsweep.algorithms.base import ModelOps
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0], [0.0, 0.0]])
    ops = ModelOps(grad=None, loss=None, logits=lambda w, batch: logits)
    batch = (None, torch.tensor([0, 0, 0, 1]), torch.tensor([0.25, 0.25, 0.5, 0.0]))   # the last is padding
    assert float(ops.accuracy(None, batch)) == pytest.approx(0.75)


def test_check_passes_an_algorithm_using_ops_accuracy(registered):
    from fedsweep.testing import check_algorithm
    checks = check_algorithm("probe_accuracy", raise_on_failure=False)
    assert all(c.ok for c in checks), [c.line() for c in checks if not c.ok]
