"""Models with dropout and BatchNorm: seeded masks (same seed, same numbers, on both engines), and
evaluation in eval mode (the reported test accuracy is that of the model the run returns)."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import vmap

from conftest import resumed_run, tiny_raw

MODELS = '''
import torch
from torch import nn
import fedsweep

@fedsweep.register_model("drop_mlp", input_shape=(1, 8, 8))
class DropMLP(nn.Module):
    def __init__(self, input_shape, num_classes, p: float = 0.5):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(p), nn.Linear(32, num_classes))
    def forward(self, x):
        return self.net(x)

@fedsweep.register_model("drop_cnn", input_shape=(1, 8, 8))
class DropCNN(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Dropout2d(0.25), nn.ReLU(), nn.Flatten(),
                                 nn.Dropout(0.5), nn.Linear(4 * 64, num_classes))
    def forward(self, x):
        return self.net(x)

@fedsweep.register_model("bn_mlp", input_shape=(1, 8, 8))
class BNMLP(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, num_classes))
    def forward(self, x):
        return self.net(x)

@fedsweep.register_model("noisy_mlp", input_shape=(1, 8, 8))
class NoisyMLP(nn.Module):
    """Noise from torch's global generator, which no seeded layer replaces."""
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.a = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU())
        self.b = nn.Linear(32, num_classes)
    def forward(self, x):
        h = self.a(x)
        return self.b(h + 0.5 * torch.randn_like(h) if self.training else h)
'''


@pytest.fixture
def models(plugin_dir):
    return str(plugin_dir("evalmodels.py", MODELS))


def _raw(models, name, **over):
    return {**tiny_raw(**{"model": {"name": name}, **over}), "plugins": [models]}


def _run(raw, engine="loop"):
    import fedsweep
    return fedsweep.run({**raw, "engine": engine}, mlflow=False)


def _eval_accuracy(result) -> float:
    """The returned model's accuracy on the run's test split, in its own (eval) mode, one batch."""
    from fedsweep.data import load_federated
    data = load_federated(result.config.data, result.config.seed)
    with torch.no_grad():
        return float((result.model(data.x_test).argmax(1) == data.y_test).double().mean())


def _same_model(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))


def _same_run(a, b) -> bool:
    """Same model and the same metric history (wall times aside)."""
    timeless = [c for c in a.history.columns if c != "round/seconds"]
    return _same_model(a, b) and a.history[timeless].equals(b.history[timeless])


@pytest.mark.parametrize("name", ["drop_mlp", "drop_cnn"])
def test_a_dropout_model_repeats_exactly_on_both_engines_and_they_agree(models, name):
    raw = _raw(models, name, local__lr=0.3)
    loop, loop2, vec, vec2 = _run(raw), _run(raw), _run(raw, "vectorized"), _run(raw, "vectorized")
    assert _same_run(loop, loop2)
    assert _same_run(vec, vec2)
    # one mask per (client, step) on both engines: the same training to float tolerance
    for a, b in zip(loop.model.parameters(), vec.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # the masks matter: without dropout (p = 0) the run ends elsewhere
    if name == "drop_mlp":
        plain = _run(_raw(models, name, local__lr=0.3, model={"name": name, "options": {"p": 0.0}}))
        assert not _same_model(loop, plain)


@pytest.mark.parametrize("name", ["drop_mlp", "bn_mlp"])
def test_the_reported_test_accuracy_is_the_returned_models_in_eval_mode(models, name):
    result = _run(_raw(models, name, rounds=4, eval={"every": 2, "batch_size": 7}))
    assert not result.model.training
    assert result.history["test/accuracy"].iloc[-1] == pytest.approx(_eval_accuracy(result), abs=1e-12)
    if name == "drop_mlp":   # the user's own classes come back
        assert any(type(m) is nn.Dropout for m in result.model.modules())


def test_a_batchnorm_models_evaluation_does_not_depend_on_the_batch_size(models):
    a = _run(_raw(models, "bn_mlp", eval={"every": 1, "batch_size": 5}))
    b = _run(_raw(models, "bn_mlp", eval={"every": 1, "batch_size": 1000}))
    assert a.history["test/accuracy"].tolist() == pytest.approx(b.history["test/accuracy"].tolist(), abs=1e-12)
    assert a.history["test/loss"].tolist() == pytest.approx(b.history["test/loss"].tolist(), rel=1e-5)


def test_a_model_drawing_from_the_global_rng_repeats_on_the_loop_engine(models):
    raw = _raw(models, "noisy_mlp")
    first = _run(raw, "auto")
    torch.manual_seed(12345)   # whatever the caller's global RNG holds
    again = _run(raw, "auto")
    assert _same_run(first, again)


def test_a_dropout_run_resumes_exactly(models, tmp_path):
    resumed_run({**_raw(models, "drop_mlp", rounds=4), "engine": "vectorized"}, tmp_path, stop=2)


def test_seeded_dropout_masks():
    from fedsweep.engine.dropout import SeededDropout
    from fedsweep.sim.rng import batch_keys
    layer = SeededDropout(0.3, False, 0, nn.Dropout)
    x = torch.ones(64, 100)
    keys = batch_keys(3, 0, "batches", torch.arange(4), 2).flatten()
    assert len(set(keys.tolist())) == 8           # clients and steps draw apart

    def masked(key):
        layer.key = key
        return layer(x)
    outs = [masked(k) for k in keys]
    for out in outs:   # kept at 1/(1-p), dropped at 0, about 1-p kept
        assert bool(((out == 0) | torch.isclose(out, torch.tensor(1 / 0.7))).all())
        assert abs(float((out > 0).double().mean()) - 0.7) < 0.02
    assert not torch.equal(outs[0], outs[1])
    assert torch.equal(masked(keys[0]), outs[0])   # a key, a mask
    # under vmap, one key a row: the same masks as one at a time
    from torch.func import functional_call
    stacked = vmap(lambda k: functional_call(layer, {"key": k}, (x,)))(keys)
    assert torch.equal(stacked, torch.stack(outs))
    # per channel: whole feature maps dropped
    channels = SeededDropout(0.5, True, 1, nn.Dropout2d)
    channels.key = keys[0]
    maps = channels(torch.ones(8, 16, 3, 3))
    assert bool(((maps == 0).all(dim=(2, 3)) | (maps > 0).all(dim=(2, 3))).all())
    layer.eval()
    assert torch.equal(layer(x), x)


def test_a_copy_of_a_seeded_model_keeps_its_masks():
    """FunctionalModel of a copy of an already-seeded module (the vmap check's, the global-RNG check's)
    knows its seeded layers: the same keys, the same masks."""
    import copy

    from fedsweep.engine.functional import FunctionalModel
    net = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.5), nn.Linear(16, 3))
    fm = FunctionalModel(net)
    again = FunctionalModel(copy.deepcopy(fm.module))
    assert again.dropout_keys == fm.dropout_keys == ["1.key"] and again.random and "1.key" not in again.buffers
    x, key = torch.randn(5, 4), torch.tensor(12345)
    w = fm.flatten()
    assert torch.equal(fm.logits(w, x, key), again.logits(w, x, key))
    assert not torch.equal(fm.logits(w, x, key), fm.logits(w, x, torch.tensor(7)))
