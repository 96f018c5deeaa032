"""Model zoo: shapes, sizes, and the torch.func contract the vectorized engine relies on."""
import pytest
import torch
from torch.func import functional_call, grad, stack_module_state, vmap

from fedsweep.config.registry import MODELS as REGISTRY
from fedsweep.config.schema import ConfigError, ModelConfig
from fedsweep.sim.models import build_model, param_count

IMAGES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]
MODELS = [e.name for e in REGISTRY.entries() if e.builtin]     # fedsweep's own
CONV = [m for m in MODELS if m != "mlp"]


def make(name, shape, classes=10, seed=0, **kw):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return build_model(ModelConfig(name=name, **kw), shape, classes)


@pytest.mark.parametrize("shape", IMAGES + [(60,)])
def test_mlp_shapes(shape):
    out = make("mlp", shape, classes=7)(torch.randn(2, *shape))
    assert out.shape == (2, 7)


@pytest.mark.parametrize("name", CONV)
@pytest.mark.parametrize("shape", IMAGES)
def test_conv_shapes(name, shape):
    model = make(name, shape, classes=7)
    assert list(model.buffers()) == []  # nothing changes in forward: no BatchNorm statistics
    assert model(torch.randn(2, *shape)).shape == (2, 7)


def test_mlp_param_count():
    assert param_count(make("mlp", (1, 8, 8))) == 64 * 400 + 400 + 400 * 10 + 10


def test_cnn_matches_paper_on_mnist():
    """FedSoftMax: 28x28 -> 64·5·5 = 1600 features -> FC 1600 -> classes; no dropout."""
    model = make("cnn", (1, 28, 28))
    fc1, fc2 = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert (fc1.in_features, fc1.out_features, fc2.out_features) == (1600, 1600, 10)
    assert not any(isinstance(m, torch.nn.Dropout) for m in model.modules())


@pytest.mark.parametrize("name", MODELS)
def test_init_uses_only_the_global_rng(name):
    a, b, c = make(name, (1, 8, 8), seed=1), make(name, (1, 8, 8), seed=1), make(name, (1, 8, 8), seed=2)
    for (k, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), k
    assert not all(torch.equal(p, r) for p, r in zip(a.parameters(), c.parameters()))


@pytest.mark.parametrize("name", MODELS)
def test_vmap_functional_call_matches_per_copy(name):
    """In float64: the check is of vmap's batching rules (the same function), and float32 cannot tell
    them from rounding for the deep models. MobileNetV2 on 8x8 inputs amplifies the last-bit
    differences of its batched and per-copy kernels into 1e-2 relative gradient differences for 2 of
    100 random inputs (float64: 1e-14 on those same inputs); in float32 this test failed on CI."""
    K, shape = 3, (1, 8, 8)
    model = make(name, shape).double()
    params, _ = stack_module_state([make(name, shape, seed=s).double() for s in range(K)])
    x = torch.randn(K, 2, *shape, dtype=torch.float64)
    y = torch.randint(0, 10, (K, 2))

    def f(p, xb):
        return functional_call(model, p, (xb,))

    out = vmap(f)(params, x)
    for k in range(K):
        ref = f({n: v[k] for n, v in params.items()}, x[k])
        torch.testing.assert_close(out[k], ref, rtol=1e-10, atol=1e-12)

    def loss(p, xb, yb):
        return torch.nn.functional.cross_entropy(f(p, xb), yb)

    grads = vmap(grad(loss))(params, x, y)
    assert grads.keys() == params.keys()
    for n, g in grads.items():
        assert g.shape == params[n].shape and torch.isfinite(g).all(), n
    g0 = grad(loss)({n: v[0] for n, v in params.items()}, x[0], y[0])
    for n in params:
        torch.testing.assert_close(grads[n][0], g0[n], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", CONV)
def test_conv_model_on_flat_input_is_a_config_error(name):
    with pytest.raises(ConfigError, match=r"^model\.name: .*size 60.*use model\.name: mlp$"):
        build_model(ModelConfig(name=name), (60,), 10)


@pytest.mark.parametrize("name,shape", [("mlp", (1, 8, 8)), ("cnn", (1, 8, 8)), ("lenet5", (1, 28, 28))])
def test_layer_interpreter_matches_functional_call(name, shape):
    """The engine runs chain()-models through its own interpreter; it must be the same function."""
    from torch.func import functional_call

    from fedsweep.engine.functional import FunctionalModel
    fm = FunctionalModel(build_model(ModelConfig(name=name), shape, 10))
    assert fm.chain is not None
    w = torch.randn(fm.dim) * 0.1
    x = torch.rand(3, *shape)
    torch.testing.assert_close(fm.logits(w, x), functional_call(fm.module, fm.unflatten(w), (x,)))
