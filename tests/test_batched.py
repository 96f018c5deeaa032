"""Hand-written batched gradients (engine/batched.py) against autograd, and the vectorized engine
with them against the same engine on torch.func."""
import pytest
import torch
from torch import nn
from torch.func import vmap

from fedsweep.engine import batched
from fedsweep.engine.functional import FunctionalModel
from fedsweep.engine.loop import autograd_ops
from fedsweep.sim.models import MLP


class Deep(nn.Module):
    """Two hidden layers, one Linear without bias: every branch of the backward pass."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(12, 7), nn.ReLU(), nn.Linear(7, 5, bias=False), nn.ReLU(),
                                 nn.Linear(5, 4))

    def forward(self, x):
        return self.net(x)

    def chain(self):
        return [(f"net.{n}", m) for n, m in self.net.named_children()]


def batches(K, B, shape, classes, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(K, B, *shape, generator=g, dtype=torch.float64)
    y = torch.randint(0, classes, (K, B), generator=g)
    mask = torch.rand(K, B, generator=g) > 0.3
    mask[:, 0] = True
    weight = mask.double() / mask.double().sum(1, keepdim=True)      # 0 on padding, sum 1
    return x, y, weight


@pytest.mark.parametrize("net,shape,classes", [(MLP(64, 16, 10), (1, 8, 8), 10), (Deep(), (3, 4), 4)])
def test_chain_gradient_equals_autograd(net, shape, classes):
    fm = FunctionalModel(net.double())
    assert batched.supports(fm)
    K = 4
    w = fm.flatten().expand(K, -1) + 0.1 * torch.randn(K, fm.dim, dtype=torch.float64)
    x, y, weight = batches(K, 6, shape, classes)
    loss, g = batched.ChainGrad(fm)(w, x, y, weight)
    for k in range(K):
        ref_loss, ref_g = autograd_ops(fm).grad(w[k], (x[k], y[k], weight[k]))
        torch.testing.assert_close(loss[k], ref_loss, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g[k], ref_g, rtol=1e-10, atol=1e-12)
    # as ops.grad: per client, under vmap with a batched or a shared w (a probe at w^t)
    op = batched.chain_grad_op(batched.ChainGrad(fm))
    v_loss, v_g = vmap(op)(w, (x, y, weight))
    torch.testing.assert_close(v_g, g, rtol=0, atol=0)
    s_loss, s_g = vmap(lambda b: op(w[0], b))((x, y, weight))
    torch.testing.assert_close(s_g[2], autograd_ops(fm).grad(w[0], (x[2], y[2], weight[2]))[1],
                               rtol=1e-10, atol=1e-12)
    one_loss, one_g = op(w[1], (x[1], y[1], weight[1]))                    # outside vmap: one client
    torch.testing.assert_close(one_g, g[1], rtol=1e-12, atol=1e-12)



def test_chain_gradient_reads_any_layout_of_w():
    """ChainGrad views each parameter of w with ``as_strided``: rows that start inside a larger
    buffer (a storage offset, as the engine's w[:k] and sliced states), one row shared by all
    (stride 0) and a non-unit last stride must give the contiguous copy's numbers exactly."""
    fm = FunctionalModel(Deep().double())
    chain, K = batched.ChainGrad(fm), 3
    x, y, weight = batches(K, 5, (3, 4), 4, seed=1)
    base = torch.randn(K + 2, fm.dim + 3, dtype=torch.float64)
    layouts = {
        "offset rows": base[1:K + 1, 2:fm.dim + 2],
        "shared row": base[0, :fm.dim].expand(K, -1),
        "strided": torch.randn(K, 2 * fm.dim, dtype=torch.float64)[:, ::2],
        "transposed": torch.randn(fm.dim, K, dtype=torch.float64).t(),
    }
    for name, w in layouts.items():
        loss, g = chain(w, x, y, weight)
        ref_loss, ref_g = chain(w.contiguous(), x, y, weight)
        assert torch.equal(g, ref_g) and torch.equal(loss, ref_loss), name
        assert torch.equal(chain.loss(w, x, y, weight), ref_loss), name
        torch.testing.assert_close(g[1], autograd_ops(fm).grad(w[1], (x[1], y[1], weight[1]))[1],
                                   rtol=1e-10, atol=1e-12)

def test_only_linear_relu_flatten_chains_take_the_fast_path():
    from fedsweep.sim.models import CNN, LeNet5
    assert not batched.supports(FunctionalModel(CNN((1, 8, 8), 10)))
    assert not batched.supports(FunctionalModel(LeNet5((1, 8, 8), 10)))
    assert not batched.supports(FunctionalModel(nn.Sequential(nn.Linear(3, 2))))   # no chain()


@pytest.mark.parametrize("algorithm", [{"name": "fedavg"}, {"name": "fedsam", "radius": 0.1},
                                       {"name": "mimelite"}, {"name": "scaffold"}])
def test_vectorized_engine_same_with_and_without_fast_gradients(algorithm, monkeypatch):
    from conftest import tiny_raw

    from fedsweep.config.schema import build_config
    from fedsweep.runs.run import train
    cfg = build_config({**tiny_raw(algorithm=algorithm), "engine": "vectorized"})
    fast = train(cfg, progress=False)
    assert fast.engine.fast
    monkeypatch.setattr(batched, "supports", lambda fm: False)
    slow = train(cfg, progress=False)
    assert not slow.engine.fast
    torch.testing.assert_close(fast.w, slow.w, rtol=1e-5, atol=1e-6)


ALGORITHM_PARAMS = {"fedclg_c": {}, "fedclg_s": {}, "clg_sgd": {}, "scaffold_plus": {}, "server_only": {},
                    "fedlga": {"grad_source": "last"}, "fednova": {"momentum": 0.5, "mu": 0.1},
                    "fedprox": {"mu": 0.1}, "fedsam": {"radius": 0.1}, "fedsoftmax": {"temperature": 0.5}}


def _rowwise_algorithms():
    from fedsweep.algorithms import available, get_algorithm_class
    return [n for n in available() if get_algorithm_class(n).rowwise   # FedBN's model runs on the loop engine
            and not get_algorithm_class(n).local_buffers]


@pytest.mark.parametrize("name", _rowwise_algorithms())
def test_rowwise_steps_equal_vmapped_steps(name, monkeypatch):
    """Every algorithm that declares its client code row-wise gives the same model stepped and ended
    (client_final) on the stacked clients as under vmap (with stragglers, so step masks are
    exercised too)."""
    from conftest import tiny_raw

    from fedsweep.algorithms import get_algorithm_class
    from fedsweep.config.schema import build_config
    from fedsweep.engine import vectorized
    from fedsweep.runs.run import train
    cls = get_algorithm_class(name)
    raw = tiny_raw(algorithm={"name": name, **ALGORITHM_PARAMS.get(name, {})})
    if cls.needs_server_data:
        raw["server_data"] = {"fraction": 0.05, "steps": 2, "lr": 0.1, "batch_size": 16}
    cfg = build_config({**raw, "engine": "vectorized"})
    rows = train(cfg, progress=False)
    assert rows.engine.rowwise
    original = vectorized.VectorizedEngine.__init__

    def no_rowwise(self, *a, **k):
        original(self, *a, **k)
        self.rowwise = False
    monkeypatch.setattr(vectorized.VectorizedEngine, "__init__", no_rowwise)
    vmapped = train(cfg, progress=False)
    assert not vmapped.engine.rowwise
    torch.testing.assert_close(rows.w, vmapped.w, rtol=1e-5, atol=1e-6)


def test_overriding_client_code_without_declaring_it_is_not_rowwise():
    from fedsweep.algorithms.base import Algorithm
    from fedsweep.algorithms.fedprox import FedProx

    class Mine(Algorithm):
        def client_step(self, state, batch, ops, lr, shared):
            return state

    class MyFinal(Algorithm):
        def client_final(self, state, w0, ops, probe):
            return {"delta": state["w"] - w0}

    class Declared(Mine):
        rowwise = True

    class Inherits(FedProx):        # same client code as FedProx: stays row-wise
        pass

    assert Algorithm.rowwise and not Mine.rowwise and not MyFinal.rowwise
    assert Declared.rowwise and Inherits.rowwise


def test_a_rowwise_client_final_that_returns_no_row_per_client_is_named():
    """client_final runs on the stacked clients for an algorithm declared row-wise; an upload that is
    not one row per client (vmap would have stacked it) stops the run with the key and the fix."""
    from conftest import tiny_raw

    from fedsweep.algorithms import register
    from fedsweep.algorithms.base import Algorithm
    from fedsweep.config.schema import build_config
    from fedsweep.runs.run import train

    @register
    class ShapeCheckAlgo(Algorithm):
        name = "shape_check_algo"
        rowwise = True

        def client_final(self, state, w0, ops, probe):
            return {"delta": state["w"] - w0, "scale": w0.norm()}   # one number for all clients

    try:
        cfg = build_config({**tiny_raw(algorithm={"name": "shape_check_algo"}), "engine": "vectorized"})
        with pytest.raises(ValueError, match=r"ShapeCheckAlgo declares rowwise = True.*'scale' of shape \(\)"):
            train(cfg, progress=False)
        ShapeCheckAlgo.rowwise = False            # under vmap the same code runs
        assert train(cfg, progress=False).rounds_done == cfg.rounds
    finally:
        from fedsweep.config.registry import ALGORITHMS
        ALGORITHMS.remove("shape_check_algo")
