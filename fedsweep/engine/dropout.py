"""Dropout whose masks are a pure function of a key, so that every mask derives from ``(seed, round,
purpose)`` (docs/design.md §2.6) and K clients draw theirs at once under ``torch.func.vmap``.

``torch.nn.Dropout`` draws from torch's global generator: two runs of one seed differed, and ``vmap``
refuses it. ``FunctionalModel`` swaps each ``Dropout``/``Dropout1d``/``2d``/``3d`` of a model for a
:class:`SeededDropout` of the same ``p``, whose mask is a counter-based hash of

    (the batch's key, the layer's number, the element's position in the batch)

The key of a training batch is :func:`fedsweep.sim.rng.batch_keys`' of its client and local step, so a client's mask
at a step is the same on the loop and the vectorized engine (real samples come first in both, so an
element has the same position), in a packed or resumed run, and whoever else is sampled. In eval
mode the layer is the identity, as ``nn.Dropout``'s is. The model a run returns gets its own classes
back (:func:`unseeded`).

The hash is :func:`fedsweep.sim.rng.mix32`, exact on every device.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from fedsweep.sim.rng import mix32

_DROPOUTS = {nn.Dropout: False, nn.Dropout1d: True, nn.Dropout2d: True, nn.Dropout3d: True}  # class: per channel


class SeededDropout(nn.Module):
    """``nn.Dropout`` (or its channel-wise kin with ``per_channel``) with its mask hashed from the
    buffer ``key``, which :class:`~fedsweep.engine.functional.FunctionalModel` sets per batch."""

    def __init__(self, p: float, per_channel: bool, layer: int, original: type):
        super().__init__()
        self.p, self.per_channel, self.original = float(p), per_channel, original
        self.salt = int(mix32(torch.tensor(layer)))   # layers of one model draw apart
        self.register_buffer("key", torch.zeros((), dtype=torch.int64), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.p >= 1.0:
            return x * 0.0
        shape = tuple(x.shape[:2]) + (1,) * (x.dim() - 2) if self.per_channel else tuple(x.shape)
        position = torch.arange(math.prod(shape), dtype=torch.int64, device=x.device).view(shape)
        u = mix32(mix32(self.key ^ self.salt) ^ position)
        keep = u >= int(self.p * 2**32)
        return x * keep.to(x.dtype) / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}, per_channel={self.per_channel}"


def seed_dropouts(module: nn.Module) -> list[str]:
    """Swap every dropout layer of ``module`` (in place) for a :class:`SeededDropout`; the names of
    their ``key`` buffers, in module order (a layer swapped before, as in a copy of a swapped model,
    is kept and named)."""
    found = [(name, m) for name, m in module.named_modules() if type(m) in _DROPOUTS or isinstance(m, SeededDropout)]
    for layer, (name, m) in enumerate(found):
        if not isinstance(m, SeededDropout):
            _replace(module, name, SeededDropout(m.p, _DROPOUTS[type(m)], layer, type(m)))
    return [f"{name}.key" for name, _ in found]


def unseeded(module: nn.Module) -> nn.Module:
    """``module`` (in place) with each :class:`SeededDropout` back to the dropout class it replaced."""
    for name, m in list(module.named_modules()):
        if isinstance(m, SeededDropout):
            _replace(module, name, m.original(m.p))
    return module


def _replace(module: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(module.get_submodule(parent) if parent else module, leaf, new)
