"""The model as pure functions of one flat parameter vector (docs/design.md §1.4: algorithms see flat vectors).

``FunctionalModel`` keeps the ``nn.Module`` only as a recipe for ``torch.func.functional_call``;
parameters live in a flat vector ``w ∈ R^n`` and are reached through views, so the same code runs
for one client (``w`` of shape (n,)) or under ``vmap`` for K clients at once.

A model that lists its layers with ``chain()`` (the MLP, LeNet-5 and the CNN), all of them plain
Linear/Conv2d/ReLU/MaxPool2d/Flatten, is run by a small interpreter over ``torch.nn.functional``
instead: ``functional_call`` swaps every parameter into the module on each call, which costs more
than the forward pass of such small models. Both paths compute the same function (tested).

A batch is ``(x, y, weight)``: ``weight`` holds per-sample weights that sum to 1 over the real
samples and are 0 on padding, so the loss is one weighted sum (the masked mean cross-entropy).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

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


class FunctionalModel:
    def __init__(self, module: nn.Module):
        self.module = module
        self.names = [n for n, _ in module.named_parameters()]
        self.shapes = [p.shape for _, p in module.named_parameters()]
        self.numels = [math.prod(s) for s in self.shapes]
        self.buffers = dict(module.named_buffers())
        self.dim = sum(self.numels)
        self.chain = _layer_chain(module)
        if self.chain is not None:   # parameters of each leaf, by the leaf's local names
            self.leaf_params = [[(local, f"{prefix}.{local}") for local, _ in m.named_parameters()]
                                for prefix, m in self.chain]

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

    def logits(self, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        params = self.unflatten(w)
        if self.chain is None:
            return functional_call(self.module, {**params, **self.buffers}, (x,))
        for (_, leaf), names in zip(self.chain, self.leaf_params):
            x = _LAYERS[type(leaf)](leaf, {local: params[full] for local, full in names}, x)
        return x

    def loss(self, w: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Weighted cross-entropy Σ_j weight_j · CE_j (the mean over the batch's real samples)."""
        x, y, weight = batch
        return (F.cross_entropy(self.logits(w, x), y, reduction="none") * weight).sum()

    def loss_vmappable(self, w: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The same loss written as log_softmax + gather: under ``vmap`` the batching rule of
        ``nll_loss`` costs far more than these ops on small batches, while in plain autograd the
        fused ``cross_entropy`` above is the faster one."""
        x, y, weight = batch
        logp = torch.log_softmax(self.logits(w, x), dim=-1)
        return -(logp.gather(-1, y.unsqueeze(-1)).squeeze(-1) * weight).sum()

    @torch.no_grad()
    def evaluate(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> tuple[float, float]:
        """(mean loss, accuracy) of the flat model ``w`` on (x, y)."""
        total_loss, correct = 0.0, 0
        for i in range(0, x.shape[0], batch_size):
            logits = self.logits(w, x[i:i + batch_size])
            yb = y[i:i + batch_size]
            total_loss += float(F.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(1) == yb).sum())
        n = max(int(x.shape[0]), 1)
        return total_loss / n, correct / n
