"""The reference engine: each sampled client trains in turn, with plain autograd.

Readable on purpose — it is the oracle the vectorized engine is tested against. Batches are the
real (unpadded) samples of each step, and gradients come from ``torch.autograd.grad`` rather than
``torch.func``, so the two engines share only the algorithm's equations and the batch schedule.
"""
from __future__ import annotations

import contextlib

import torch

from fedsweep.algorithms.base import ModelOps


def autograd_ops(fmodel) -> ModelOps:
    """The model's loss and gradient for one parameter vector, with plain autograd (no vmap):
    the loop engine's clients and every server-side computation (hybrid FL) use these."""

    def grad(w, batch):
        w = w.detach().requires_grad_(True)
        with torch.enable_grad():
            loss = fmodel.loss(w, batch)
            (g,) = torch.autograd.grad(loss, w)
        return loss.detach(), g

    return ModelOps(grad=grad, loss=fmodel.loss, logits=getattr(fmodel, "batch_logits", None))


class LoopEngine:
    """``buffers``: each client's own copy of the model's buffers (:mod:`fedsweep.engine.client_buffers`),
    for an algorithm that keeps them local; None: one copy, which every client's forward passes move."""

    def __init__(self, fmodel, algorithm, data, buffers=None):
        self.fmodel, self.algo, self.data, self.buffers = fmodel, algorithm, data, buffers
        self.ops = autograd_ops(fmodel)

    def _batch(self, index, mask, key):
        keep = index[mask]
        x, y = self.data.x[keep], self.data.y[keep]
        weight = torch.full((keep.shape[0],), 1.0 / max(keep.shape[0], 1), dtype=x.dtype, device=x.device)
        return (x, y, weight, key) if self.fmodel.random else (x, y, weight)

    def run(self, w, plan, batches, probe, shared, own):
        """Uploads stacked (K, ...) and each client's mean training loss over its steps (K,)."""
        uploads, losses = [], []
        for k in range(plan.num_sampled):
            step_losses = []

            def grad(w_, batch, _record=step_losses):
                loss, g = self.ops.grad(w_, batch)
                _record.append(loss)      # every gradient pass; the step's first is its loss
                return loss, g

            ops = self.ops
            step_ops = ModelOps(grad=grad, loss=self.fmodel.loss, logits=self.ops.logits)
            own_k = {name: v[k] for name, v in own.items()}
            probe_k = self._batch(probe.index[k, 0], probe.mask[k, 0], probe.keys[k, 0]) if probe is not None else None
            first = []
            with (self.buffers.of(int(plan.clients[k]), keep=bool(plan.participated[k])) if self.buffers is not None
                  else contextlib.nullcontext()):
                state = self.algo.client_init(w, shared, own_k, ops, probe_k)
                for s in range(int(plan.steps[k])):
                    step_losses.clear()
                    batch = self._batch(batches.index[k, s], batches.mask[k, s], batches.keys[k, s])
                    state = self.algo.client_step(state, batch, step_ops, plan.lr, shared)
                    first.append(step_losses[0])
                uploads.append(self.algo.client_final(state, w, ops, probe_k))
            losses.append(torch.stack(first).mean() if first else w.new_tensor(float("nan")))
        stacked = {name: torch.stack([u[name] for u in uploads]) for name in uploads[0]}
        return stacked, torch.stack(losses)
