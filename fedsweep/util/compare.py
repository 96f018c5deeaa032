"""Comparing what an algorithm computes (fedsweep.testing's checks): tensors, nested state, metric
histories, and what a checkpoint keeps."""
from __future__ import annotations

import io
import math

from fedsweep.util.lazy import torch


def gap(a, b) -> float:
    """The largest difference between two tensors (inf where only one is finite, or the shapes differ)."""
    if a.shape != b.shape:
        return math.inf
    d = (a.detach().double() - b.detach().double()).abs()
    return float(torch.nan_to_num(d, nan=math.inf).max()) if d.numel() else 0.0


def garbage(uploads: dict, dropped, scale: float) -> dict:
    """``uploads`` with the rows of the clients that dropped out replaced by finite random numbers of ``scale``."""
    g, out = torch.Generator().manual_seed(0), {}
    for key, v in uploads.items():
        if v.is_floating_point() and v.dim() >= 1 and v.shape[0] == dropped.numel():
            junk = (scale * torch.randn(v.shape, generator=g, dtype=torch.float64)).to(v)
            v = torch.where(dropped.to(v.device).view(-1, *[1] * (v.dim() - 1)), junk, v)
        out[key] = v
    return out


def same(a, b, close: bool = False) -> bool:
    """Equal data, NaN equal to NaN; ``close``: numbers to float32 rounding (rtol 1e-5, atol 1e-6)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        if close:
            return bool(torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6, equal_nan=True))
        return bool(((a == b) | (a != a) & (b != b)).all())
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], close) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y, close) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, (int, float)) and (math.isnan(a) or close):
        return math.isnan(a) and math.isnan(b) or math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
    try:
        return type(a) is type(b) and bool(a == b)
    except (TypeError, ValueError, RuntimeError):   # an array: compared as a tensor
        return same(torch.as_tensor(a), torch.as_tensor(b), close)


def checkpoints_keep(value) -> bool:
    """``value`` comes back equal through torch.save and torch.load(weights_only=True), as a --resume reads it."""
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
        return same(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True), value)
    except Exception:  # noqa: BLE001 - unpicklable, or refused by the weights-only loader
        return False


def timeless(history: list[dict]) -> list[dict]:
    """A metric history without its wall times (measurements, never compared: docs/design.md §2.7)."""
    return [{k: v for k, v in row.items() if k != "round/seconds"} for row in history]
