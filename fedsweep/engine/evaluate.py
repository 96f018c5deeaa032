"""Per-client evaluation: each client's accuracy on its own samples, of one model or of one model a client.

* One model (the global w): every sample any client holds is scored once (:meth:`FunctionalModel.sample_scores`),
  then summed per client through its indices, so M clients cost the forward passes of the samples
  they hold together, not M passes.
* One model a client (fine-tuned or personal, ``W`` (M, n)): on the vectorized engine, chunks of
  clients at once under ``vmap``, each client's samples padded to the chunk's largest; on the loop
  engine one client after another. Both in eval mode; the same numbers (tests/test_client_eval.py).
  With each client's own buffers (``buffers_of``: FedBN's BatchNorm statistics) one client after another,
  each under its own.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch.func import vmap

from fedsweep.engine.functional import FunctionalModel
from fedsweep.sim.client_index import ClientIndex


def per_client_sums(scores: torch.Tensor, index: ClientIndex) -> torch.Tensor:
    """Σ of ``scores[j]`` over each client's indices j: (M,) float64."""
    owner = torch.repeat_interleave(torch.arange(len(index), device=scores.device), index.sizes.to(scores.device))
    return torch.zeros(len(index), dtype=torch.float64, device=scores.device).index_add_(
        0, owner, scores[index.values.to(scores.device)])


@torch.no_grad()
def one_model(fmodel: FunctionalModel, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, index: ClientIndex,
              batch_size: int) -> torch.Tensor:
    """Each client's count of right answers (M,) float64 of the model ``w`` on ``x[index[i]]``."""
    needed, where = torch.unique(index.values, return_inverse=True)
    _, right = fmodel.sample_scores(w, x[needed], y[needed], batch_size)
    return per_client_sums(right, ClientIndex(index.offsets, where))


@torch.no_grad()
def own_models(fmodel: FunctionalModel, W: torch.Tensor, x: torch.Tensor, y: torch.Tensor, index: ClientIndex,
               batch_size: int, vectorized: bool,
               buffers_of: Callable[[int], contextlib.AbstractContextManager] | None = None) -> torch.Tensor:
    """Each client's count of right answers (M,) float64 of its own model ``W[i]`` on ``x[index[i]]``;
    ``buffers_of(i)``: the model's buffers are client i's inside (engine/client_buffers.py)."""
    M = len(index)
    out = torch.zeros(M, dtype=torch.float64, device=W.device)
    if not vectorized or buffers_of is not None:
        for i in range(M):
            rows = index[i]
            if rows.numel():
                with buffers_of(i) if buffers_of is not None else contextlib.nullcontext():
                    out[i] = fmodel.sample_scores(W[i], x[rows], y[rows], batch_size)[1].sum()
        return out
    sizes = index.sizes.tolist()
    with fmodel.evaluating():
        at = 0
        while at < M:   # as many clients as fill a batch of eval.batch_size samples (padded), at least one
            width, end = max(sizes[at], 1), at + 1
            while end < M and (end + 1 - at) * max(width, sizes[end]) <= batch_size:
                width, end = max(width, sizes[end]), end + 1
            rows, mask = index.rows(torch.arange(at, end, device=index.offsets.device), width)
            rows, mask = rows.to(x.device), mask.to(x.device)
            logits = vmap(fmodel.logits)(W[at:end], x[rows])                     # (m, width, C)
            right = (logits.argmax(-1) == y[rows]) & mask
            out[at:end] = right.sum(-1).double()
            at = end
    return out
