"""The model as pure functions of one flat parameter vector (docs/design.md §1.4: algorithms see flat vectors).

``FunctionalModel`` keeps the ``nn.Module`` only as a recipe for ``torch.func.functional_call``;
parameters live in a flat vector ``w ∈ R^n`` and are reached through views, so the same code runs
for one client (``w`` of shape (n,)) or under ``vmap`` for K clients at once.

A model that lists its layers with ``chain()`` (the MLP, LeNet-5 and the CNN), all of them plain
Linear/Conv2d/ReLU/MaxPool2d/Flatten, is run by a small interpreter over ``torch.nn.functional``
instead: ``functional_call`` swaps every parameter into the module on each call, which costs more
than the forward pass of such small models. Both paths compute the same function (tested).

A batch is ``(x, y, weight)``: ``weight`` holds per-sample weights that sum to 1 over the real
samples and are 0 on padding, so the loss is one weighted sum (the masked mean cross-entropy). A
model with dropout gets batches ``(x, y, weight, key)``: ``key`` (int64, one a client) seeds its
masks (:mod:`fedsweep.engine.dropout`). Training forward passes run in training mode, evaluation
(:meth:`FunctionalModel.evaluate`, :meth:`FunctionalModel.evaluating`) in eval mode: dropout off,
BatchNorm on its running statistics.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedsweep.engine.dropout import seed_dropouts

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

_LAYERS = {
    nn.Linear: lambda m, p, x: F.linear(x, p["weight"], p.get("bias")),
    nn.Conv2d: lambda m, p, x: F.conv2d(x, p["weight"], p.get("bias"), m.stride, m.padding, m.dilation, m.groups),
    nn.ReLU: lambda m, p, x: F.relu(x),
    nn.MaxPool2d: lambda m, p, x: F.max_pool2d(x, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode),
    nn.Flatten: lambda m, p, x: x.flatten(m.start_dim, m.end_dim),
}


def _layer_chain(module: nn.Module):
    """[(param prefix, leaf)] if the module declares a chain of layers the interpreter knows, else None."""
    chain = module.chain() if hasattr(module, "chain") else None
    if not chain or any(type(m) not in _LAYERS for _, m in chain):
        return None
    return chain


def masked_weights(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per-sample weights of a batch from its validity mask: 1/n on the n real samples, 0 on padding."""
    m = mask.to(dtype)
    return m / m.sum(-1, keepdim=True).clamp(min=1.0)


def mean_scores(loss: torch.Tensor, right: torch.Tensor) -> tuple[float, float]:
    """(mean loss, accuracy) from per-sample scores; (0, 0) for none."""
    n = max(int(loss.numel()), 1)
    return float(loss.sum()) / n, float(right.sum()) / n


@contextlib.contextmanager
def _global_rng_from(key: torch.Tensor, device: torch.device):
    """torch's global RNG (and ``device``'s, on CUDA) seeded from ``key`` inside, as it was after."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(int(key))
        yield


class FunctionalModel:
    """``module``'s dropout layers are swapped for seeded ones (in place). ``global_rng``: set when the
    model still draws from torch's global generator in its forward pass (a random op other than a
    dropout layer, :meth:`draws_global_rng`): each keyed forward pass then runs in a fork of it seeded
    from the batch's key, so it repeats exactly (one client at a time: ``vmap`` refuses such a model)."""

    def __init__(self, module: nn.Module):
        self.dropout_keys = seed_dropouts(module)
        self.global_rng = False
        self.keyed = False   # the algorithm's client hooks draw from the batches' keys (Algorithm.random)
        self.module = module
        self.names = [n for n, _ in module.named_parameters()]
        self.shapes = [p.shape for _, p in module.named_parameters()]
        self.numels = [math.prod(s) for s in self.shapes]
        self.buffers = {n: b for n, b in module.named_buffers() if n not in self.dropout_keys}
        self.dim = sum(self.numels)
        self.chain = _layer_chain(module)
        if self.chain is not None:   # parameters of each leaf, by the leaf's local names
            self.leaf_params = [[(local, f"{prefix}.{local}") for local, _ in m.named_parameters()]
                                for prefix, m in self.chain]

    def layout(self) -> tuple[tuple[str, int, int], ...]:
        """(parameter name, start, stop) of each parameter's entries in w, in order."""
        ends = [sum(self.numels[:i + 1]) for i in range(len(self.numels))]
        return tuple((n, e - k, e) for n, k, e in zip(self.names, self.numels, ends))

    def flatten(self, module: nn.Module | None = None) -> torch.Tensor:
        """The module's parameters as one flat vector (detached copy)."""
        module = module or self.module
        return torch.cat([p.detach().reshape(-1) for p in module.parameters()])

    def unflatten(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of ``w`` shaped like the module's parameters (no copy)."""
        views = torch.split(w, self.numels)
        return {n: v.view(s) for n, v, s in zip(self.names, views, self.shapes)}

    def load_into(self, w: torch.Tensor, module: nn.Module | None = None) -> nn.Module:
        module = module or self.module
        with torch.no_grad():
            for p, v in zip(module.parameters(), torch.split(w, self.numels)):
                p.copy_(v.view_as(p))
        return module

    def logits(self, w: torch.Tensor, x: torch.Tensor, key: torch.Tensor | None = None) -> torch.Tensor:
        """The model's outputs at ``w`` for inputs ``x``; ``key`` seeds its random layers (training)."""
        params = self.unflatten(w)
        if self.chain is None:
            keys = dict.fromkeys(self.dropout_keys, key) if key is not None else {}
            seeded = self.global_rng and key is not None and self.module.training
            with _global_rng_from(key, x.device) if seeded else contextlib.nullcontext():
                return functional_call(self.module, {**params, **self.buffers, **keys}, (x,))
        for (_, leaf), names in zip(self.chain, self.leaf_params):
            x = _LAYERS[type(leaf)](leaf, {local: params[full] for local, full in names}, x)
        return x

    def batch_logits(self, w: torch.Tensor, batch: Batch) -> torch.Tensor:
        """:meth:`logits` on a batch ``(x, y, weight[, key])``: what ``ops.logits`` gives client code."""
        return self.logits(w, batch[0], *batch[3:])

    def loss(self, w: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Weighted cross-entropy Σ_j weight_j · CE_j (the mean over the batch's real samples)."""
        x, y, weight, *key = batch
        return (F.cross_entropy(self.logits(w, x, *key), y, reduction="none") * weight).sum()

    def loss_vmappable(self, w: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The same loss written as log_softmax + gather: under ``vmap`` the batching rule of
        ``nll_loss`` costs far more than these ops on small batches, while in plain autograd the
        fused ``cross_entropy`` above is the faster one."""
        x, y, weight, *key = batch
        logp = torch.log_softmax(self.logits(w, x, *key), dim=-1)
        return -(logp.gather(-1, y.unsqueeze(-1)).squeeze(-1) * weight).sum()

    @property
    def random(self) -> bool:
        """Whether training batches need a key: the model has dropout or draws from the global RNG, or the
        algorithm's client hooks draw random numbers (``keyed``)."""
        return bool(self.dropout_keys) or self.global_rng or self.keyed

    def draws_global_rng(self, input_shape: tuple[int, ...]) -> bool:
        """Whether a training-mode forward pass (on a copy, the CPU, seeded layers keyed alike) gives
        other outputs from another global RNG state: a random op fedsweep's keys do not reach."""
        import copy
        fm = FunctionalModel(copy.deepcopy(self.module).cpu().train())
        w = fm.flatten()
        x = torch.rand(2, *input_shape, generator=torch.Generator().manual_seed(0), dtype=w.dtype)
        key = torch.zeros((), dtype=torch.int64)
        outs = []
        for seed in (1, 2):
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(seed)
                outs.append(fm.logits(w, x, key))
        return not torch.equal(*outs)

    @contextlib.contextmanager
    def evaluating(self):
        """Eval mode inside (dropout off, BatchNorm on its running statistics), the mode before after."""
        was = self.module.training
        self.module.eval()
        try:
            yield
        finally:
            self.module.train(was)

    @torch.no_grad()
    def sample_scores(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                      batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cross-entropy, 1.0 if right else 0.0) of every sample of (x, y), float64, in eval mode."""
        losses, right = [], []
        with self.evaluating():
            for i in range(0, x.shape[0], batch_size):
                logits = self.logits(w, x[i:i + batch_size])
                yb = y[i:i + batch_size]
                losses.append(F.cross_entropy(logits, yb, reduction="none").double())
                right.append((logits.argmax(1) == yb).double())
        empty = torch.zeros(0, dtype=torch.float64, device=x.device)
        return (torch.cat(losses), torch.cat(right)) if losses else (empty, empty)

    def evaluate(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> tuple[float, float]:
        """(mean loss, accuracy) of the flat model ``w`` on (x, y), in eval mode: the numbers the model
        the run returns gives (``model.eval()``), whatever the batch size."""
        return mean_scores(*self.sample_scores(w, x, y, batch_size))
