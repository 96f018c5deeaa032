"""All K sampled clients at once: stacked states, ``torch.func.vmap`` over the algorithm's client
functions, one batched step for every client still training, heterogeneity as per-client step counts.

The rows are ordered by their step counts E_i, longest first, so the clients still training at
step s are the first k_s rows: step s runs on those alone, and the others keep their state. The
Python loop runs over steps, never over clients. Data never leaves the device: each step gathers
its (k_s, B) batch from the resident training tensors by index.
"""
from __future__ import annotations

import torch
from torch.func import grad_and_value, vmap

from fedsweep.algorithms.base import ModelOps
from fedsweep.engine import batched
from fedsweep.engine.functional import masked_weights


class VectorizedEngine:
    """``fast_grad``: MLP-shaped models (Linear/ReLU/Flatten) get hand-written batched gradients
    (:mod:`fedsweep.engine.batched`) instead of ``torch.func.grad``; same numbers, less overhead.
    With them, an algorithm whose client code is row-wise (``Algorithm.rowwise``) steps and ends all
    K clients without ``vmap`` (vmapping ``client_final`` was ~0.45 ms of a FedAvg round's ~5 ms on
    the sweeps/fedlga.yaml MLP, 2 CPU cores); ``client_init`` stays vmapped where clients differ."""

    def __init__(self, fmodel, algorithm, data, fast_grad: bool = True):
        self.fmodel, self.algo, self.data = fmodel, algorithm, data
        self._gv = grad_and_value(self.fmodel.loss_vmappable)
        self.fast = fast_grad and batched.supports(fmodel)
        self._chain = batched.ChainGrad(fmodel) if self.fast else None
        self._fast_grad = batched.chain_grad_op(self._chain) if self.fast else None
        self.ops = ModelOps(grad=self._grad, loss=self.fmodel.loss_vmappable,
                            logits=getattr(self.fmodel, "batch_logits", None))
        # row-wise client steps on the hand-written batched gradients need no vmap at all
        self.rowwise = self.fast and algorithm.rowwise

    def _grad(self, w, batch):
        if self._fast_grad is not None:
            return self._fast_grad(w, batch)
        g, loss = self._gv(w, batch)
        return loss, g

    def _rows_loss(self, w, batch):
        """``ops.loss`` of every client at once: w (K, n) or (n,) shared, batch (K, B, ...); the same
        vmapped per-client loss that vmapped client code calls, so the same numbers."""
        return vmap(self.fmodel.loss_vmappable, in_dims=(0 if w.dim() == 2 else None, 0))(w, batch)

    def _rows_logits(self, w, batch):
        """``ops.logits`` of every client at once (row-wise code): w (K, n) or (n,) shared, batch (K, B, ...)."""
        return vmap(self.fmodel.batch_logits, in_dims=(0 if w.dim() == 2 else None, 0))(w, batch)

    def _gather(self, index, weight, keys):
        batch = self.data.x[index], self.data.y[index], weight
        return (*batch, keys) if self.fmodel.random else batch

    def run(self, w, plan, batches, probe, shared, own):
        """Uploads stacked (K, ...) and each client's mean training loss over its steps (K,)."""
        return self.run_rows(w, plan.steps, plan.lr, batches, probe, shared, own, per_row=False)

    def run_rows(self, w, steps, lr, batches, probe, shared, own, per_row: bool = True):
        """The K rows of :meth:`run` given as tensors; with ``per_row`` each row has its own w^t (w is
        (K, n)) and its own shared tensors (each (K, ...)): rows of several configs trained in one
        call (:mod:`fedsweep.sweep.pack`). ``steps`` (K,) on the CPU; ``lr`` one float for all rows.

        Clients that finish early stop computing: the rows are ordered by their step counts (longest
        first), so the clients still training at step s are the first k_s rows, and step s runs on
        those alone. The finished rows are put back in plan order when they are joined, before
        ``client_final``."""
        algo, ops, K = self.algo, self.ops, int(steps.numel())
        dtype = self.data.x.dtype
        device = batches.index.device
        wd = 0 if per_row else None           # vmap's in_dim of w and of the shared tensors
        # what client_final and the losses see: the rows in plan order
        w_plan, steps_plan = w, steps
        probe_plan = self._gather(probe.index[:, 0], masked_weights(probe.mask[:, 0], dtype), probe.keys[:, 0]) \
            if probe is not None else None
        probe_b = probe_plan
        if int(steps.min()) != int(steps.max()):
            order = torch.argsort(steps, descending=True, stable=True)
            steps = steps[order]
            dev_order = order.to(device)
            batches = batches.rows(dev_order)
            probe_b = tuple(t[dev_order] for t in probe_plan) if probe_plan is not None else None
            own = {k: v[dev_order] for k, v in own.items()}
            if per_row:
                w, shared = w[dev_order], {k: v[dev_order] for k, v in shared.items()}
        weights = masked_weights(batches.mask, dtype)         # (K, S, B), once for all steps

        def dims(*args):
            return tuple(None if a is None else 0 for a in args)
        if own or probe_b is not None or per_row:
            state = vmap(lambda w_, sh, o, p: algo.client_init(w_, sh, o, ops, p),
                         in_dims=(wd, wd, *dims(own, probe_b)))(w, shared, own, probe_b)
        else:  # nothing differs between clients yet: initialise once, broadcast (no copy)
            state = {k: v.expand(K, *v.shape)
                     for k, v in algo.client_init(w, shared, own, ops, None).items()}

        def stepper(grad_fn, loss_fn, logits_fn):
            """One local step of ``client_step`` that also returns the step's training loss (the
            first gradient pass's)."""
            def one_step(st, b, sh):
                seen = []

                def grad(w_, batch):
                    loss, g = grad_fn(w_, batch)
                    seen.append(loss)
                    return loss, g
                return algo.client_step(st, b, ModelOps(grad=grad, loss=loss_fn, logits=logits_fn), lr, sh), seen[0]
            return one_step

        def step_of(k: int):
            """The step function on the first k rows."""
            if self.rowwise:   # the algorithm's step on the stacked clients directly (Algorithm.rowwise)
                stacked = batched.stacked_ops(self._chain, k)
                return stepper(stacked.grad, stacked.loss, self._rows_logits)
            return vmap(stepper(self._grad, ops.loss, ops.logits), in_dims=(0, 0, wd))

        steps_list = steps.tolist()
        active = [sum(1 for n in steps_list if n > s) for s in range(max(steps_list, default=0))]
        step_fns: dict[int, object] = {}
        loss_sum = torch.zeros(K, device=device, dtype=dtype)
        # Rows that have finished are set aside as they are (views, never written again) and joined
        # back once, after the last step: not copied with every later step (all K rows' state, each
        # step, was ~6% of a sweeps/fedlga.yaml trial on 2 CPU cores).
        finished: list[tuple[dict, torch.Tensor]] = []
        for s, k in enumerate(active):
            if k not in step_fns:
                step_fns[k] = step_of(k)
            if k < loss_sum.shape[0]:    # rows k.. took their last step at step s − 1
                finished.append(({key: v[k:] for key, v in state.items()}, loss_sum[k:]))
                state, loss_sum = {key: v[:k] for key, v in state.items()}, loss_sum[:k]
            sh = {key: v[:k] for key, v in shared.items()} if per_row and k < K else shared
            state, loss = step_fns[k](state, self._gather(batches.index[:k, s], weights[:k, s], batches.keys[:k, s]), sh)
            loss_sum = loss_sum + loss
        if finished:   # rows finish early only when their step counts differ, so the rows are ordered
            # Each part goes straight to its clients' rows in plan order: one copy of every row, and
            # the uploads need no reordering after client_final (a (K, n) gather of each of them).
            parts = [(state, loss_sum), *finished[::-1]]       # sorted order: the rows that stopped last first
            state = {key: _in_plan_order(dev_order, [p[key] for p, _ in parts]) for key in state}
            loss_sum = _in_plan_order(dev_order, [rows_loss for _, rows_loss in parts])
        w, probe_b, steps = w_plan, probe_plan, steps_plan

        if self.rowwise:   # the algorithm's client_final on the stacked clients directly, as its steps
            uploads = algo.client_final(state, w, ModelOps(grad=batched.stacked_ops(self._chain, K).grad,
                                                           loss=self._rows_loss, logits=self._rows_logits), probe_b)
            for key, v in uploads.items():   # what vmap would have stacked: one row per client
                if v.dim() == 0 or v.shape[0] != K:
                    raise ValueError(f"{type(algo).__name__} declares rowwise = True, but its client_final on "
                                     f"{K} stacked clients returned {key!r} of shape {tuple(v.shape)}, not one "
                                     f"row per client; make every upload (K, ...) or declare rowwise = False")
        else:
            uploads = vmap(lambda st, w_, p: algo.client_final(st, w_, ops, p),
                           in_dims=(0, wd, *dims(probe_b)))(state, w, probe_b)
        steps_dev = steps.to(device)
        loss = loss_sum / steps_dev.clamp(min=1).to(loss_sum) + torch.where(
            steps_dev > 0, 0.0, float("nan")).to(loss_sum)
        return uploads, loss


def _in_plan_order(order: torch.Tensor, parts: list[torch.Tensor]) -> torch.Tensor:
    """The K rows of ``parts`` (consecutive runs of the rows sorted by ``order``: sorted row i is plan
    row ``order[i]``) as one (K, ...) tensor in plan order, each row copied once."""
    out = torch.empty((order.numel(), *parts[0].shape[1:]), dtype=parts[0].dtype, device=parts[0].device)
    at = 0
    for part in parts:
        out.index_copy_(0, order[at:at + part.shape[0]], part)
        at += part.shape[0]
    return out
