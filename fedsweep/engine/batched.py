"""Hand-written gradients of K clients at once for MLP-shaped models (Linear / ReLU / Flatten chains).

Why: ``vmap(grad(loss))`` re-runs torch.func's transforms and autograd's graph machinery on every
local step, and for the small models of FL simulation that overhead is most of the step (the
FedLGA MLP, K = 10, B = 10 on 2 CPU cores: 2.5 ms per step through torch.func, 0.6 ms here).
Backpropagation through a chain of linear layers and ReLUs is a handful of batched matmuls, so it
is written out:

    forward   z_l = a_{l−1} W_lᵀ + b_l,  a_l = relu(z_l)                 (bmm over the K clients)
    loss      L_k = Σ_j weight_kj (logsumexp(z_kj) − z_kj[y_kj])          (masked mean cross-entropy)
    backward  δ = (softmax(z) − onehot(y)) · weight,  ∂W_l = δ_lᵀ a_{l−1},  ∂b_l = Σ_j δ_l,
              δ_{l−1} = (δ_l W_l) ⊙ [z_{l−1} > 0]

Algorithms never see this: :func:`chain_grad_op` returns an ``ops.grad`` whose per-client call is an
``autograd.Function`` with a vmap rule, so the vectorized engine's ``vmap`` over the algorithm's
per-client code lands here with all K clients stacked. The loop engine keeps plain autograd, and
the tests check this gradient against autograd and both engines against each other.
"""
from __future__ import annotations

import itertools

import torch
from torch import nn

SUPPORTED = (nn.Linear, nn.ReLU, nn.Flatten)


def supports(fmodel) -> bool:
    """True if ``fmodel`` is a chain of Linear / ReLU / Flatten (flattening all but the batch dim)."""
    if getattr(fmodel, "chain", None) is None:
        return False
    for _, m in fmodel.chain:
        if type(m) not in SUPPORTED:
            return False
        if isinstance(m, nn.Flatten) and (m.start_dim, m.end_dim) != (1, -1):
            return False
    return True


class ChainGrad:
    """Loss and gradient of K flat parameter vectors (K, n) on K batches (K, B, ...).

    The chain is compiled once into a program of (kind, where its parameters lie in the flat
    vector), so a call does no name lookups, and each parameter's (K, ...) view of ``w`` and of the
    gradient is one ``as_strided`` (FedLGA MLP, K = 8, 1 thread: 370 -> 300 µs a call, bit for bit
    the same; the five matmuls themselves take ~110 µs of it)."""

    def __init__(self, fmodel):
        self.fmodel = fmodel
        offsets = dict(zip(fmodel.names, itertools.accumulate([0, *fmodel.numels])))
        shapes = dict(zip(fmodel.names, fmodel.shapes))
        self.program = []   # ("linear", weight offset, (out, in), bias offset or None) | ("relu",) | ("flatten",)
        for (_, leaf), names in zip(fmodel.chain, fmodel.leaf_params):
            names = dict(names)
            if isinstance(leaf, nn.Linear):
                bias = names.get("bias")
                self.program.append(("linear", offsets[names["weight"]], tuple(shapes[names["weight"]]),
                                     None if bias is None else offsets[bias]))
            else:
                self.program.append(("relu",) if isinstance(leaf, nn.ReLU) else ("flatten",))
        self.first_linear = next((i for i, op in enumerate(self.program) if op[0] == "linear"), None)

    @staticmethod
    def _matrix(flat, at, shape, transposed=False):
        """Rows ``flat[:, at : at + out·in]`` as (K, out, in) matrices, or (K, in, out) transposed:
        one view of ``flat`` (whose last dim has stride 1)."""
        out_f, in_f = shape
        if transposed:
            return flat.as_strided((flat.shape[0], in_f, out_f), (flat.stride(0), 1, in_f), flat.storage_offset() + at)
        return flat.as_strided((flat.shape[0], out_f, in_f), (flat.stride(0), in_f, 1), flat.storage_offset() + at)

    def _forward(self, w, x, tape):
        """The logits (K, B, classes); ``tape`` gets what backward needs of each op, in order."""
        K, a = w.shape[0], x
        for op in self.program:
            if op[0] == "linear":
                _, at, shape, bias_at = op
                tape.append(a)
                Wt = self._matrix(w, at, shape, transposed=True)
                if bias_at is None:
                    a = torch.bmm(a, Wt)
                else:   # the bias as (K, 1, out), broadcast over the batch
                    b = w.as_strided((K, 1, shape[0]), (w.stride(0), shape[0], 1), w.storage_offset() + bias_at)
                    a = torch.baddbmm(b, a, Wt)
            elif op[0] == "relu":
                a = a.clamp_min(0)
                tape.append(a)                       # relu's output: its backward passes δ where it is > 0
            else:                                    # Flatten
                tape.append(a.shape)
                a = a.reshape(K, a.shape[1], -1)
        return a

    def loss(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The (K,) losses alone (a forward pass)."""
        w = w if w.stride(-1) == 1 else w.contiguous()
        logp = torch.log_softmax(self._forward(w, x, []), dim=-1)
        return -(logp.gather(-1, y.unsqueeze(-1)).squeeze(-1) * weight).sum(-1)

    def __call__(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor):
        w = w if w.stride(-1) == 1 else w.contiguous()
        K = w.shape[0]
        tape = []
        logp = torch.log_softmax(self._forward(w, x, tape), dim=-1)
        y1 = y.unsqueeze(-1)
        loss = -(logp.gather(-1, y1).squeeze(-1) * weight).sum(-1)
        delta = logp.exp_()                          # ∂L/∂z = (softmax − onehot(y)) · weight
        delta.scatter_add_(-1, y1, torch.full_like(y1, -1, dtype=delta.dtype))
        delta.mul_(weight.unsqueeze(-1))

        # Each layer's gradient is written straight into its part of the flat gradient (no
        # concatenation after: 140 -> 100 µs a backward pass of the FedLGA MLP, K = 10, on 2 CPU cores).
        g = torch.empty(K, self.fmodel.dim, dtype=w.dtype, device=w.device)
        for i in range(len(self.program) - 1, -1, -1):   # backward
            op = self.program[i]
            if op[0] == "linear":
                _, at, shape, bias_at = op
                torch.bmm(delta.transpose(1, 2), tape[i], out=self._matrix(g, at, shape))
                if bias_at is not None:
                    torch.sum(delta, 1, out=g.narrow(1, bias_at, shape[0]))
                if i == self.first_linear:
                    break                            # nothing to learn below the first layer
                delta = torch.bmm(delta, self._matrix(w, at, shape))
            elif op[0] == "relu":
                delta = torch.ops.aten.threshold_backward(delta, tape[i], 0)   # δ ⊙ [relu output > 0]
            else:
                delta = delta.reshape(tape[i])
        return loss, g


class _ChainGradFn(torch.autograd.Function):
    """One client's (loss, gradient); under ``vmap`` its rule computes all K in one :class:`ChainGrad`.
    Not differentiable itself (no algorithm differentiates through a gradient)."""
    generate_vmap_rule = False

    @staticmethod
    def forward(chain, w, x, y, weight):
        loss, g = chain(w.unsqueeze(0), x.unsqueeze(0), y.unsqueeze(0), weight.unsqueeze(0))
        return loss[0], g[0]

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def vmap(info, in_dims, chain, w, x, y, weight):
        def stacked(t, d):
            return t.movedim(d, 0) if d is not None else t.expand(info.batch_size, *t.shape)
        args = [stacked(t, d) for t, d in zip((w, x, y, weight), in_dims[1:])]
        return chain(*args), (0, 0)


def chain_grad_op(chain: ChainGrad):
    """``ops.grad`` for the vectorized engine: (w, (x, y, weight)) -> (loss, g), per client."""

    def grad(w, batch):
        x, y, weight, *_ = batch    # a key (an algorithm's random numbers) changes nothing of a chain's
        return _ChainGradFn.apply(chain, w, x, y, weight)
    return grad


def stacked_ops(chain: ChainGrad, K: int):
    """``ModelOps`` on all K clients at once, for algorithms whose client code is row-wise
    (``Algorithm.rowwise``): w is (K, n), or (n,) shared by all; batches are (K, B, ...)."""
    from fedsweep.algorithms.base import ModelOps

    def rows(w):
        return w.expand(K, -1) if w.dim() == 1 else w
    return ModelOps(grad=lambda w, batch: chain(rows(w), *batch[:3]),   # (x, y, weight[, key])
                    loss=lambda w, batch: chain.loss(rows(w), *batch[:3]))
