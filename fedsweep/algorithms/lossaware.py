"""Loss-aware aggregation: Generalized FedAvg, FedMax, FedMax(k) and FedSoftMax(T) (the FedSoftMax
paper: Ben Mansour, Carenini, Duplessis, "Tackling Computational Heterogeneity in FL: A Few Theoretical
Insights", §2.3–2.4, eqs. (21)–(22) and the text after them).

Every client trains as in FedAvg. Before training, each sampled client evaluates the round's global
model on its own data, F_i(w^t) (one forward pass; ``probe``), and uploads it with Δ_i. The server
aggregates with weights α_i^t that favour the clients the global model fits worst:

    w^{t+1} = w^t + η_g Σ_i α_i^t Δ_i                          (the paper's global model Σ α_i w_i, η_g = 1)

with gap_i = F_i(w^t) − F_i^* and p_i the client's share (``algorithm.weighting``: ``data`` is the
paper's p_i = n_i / n, ``uniform`` 1/K):

- ``gen_fedavg``: α_i = p_i (Generalized FedAvg, the paper's first strategy; it is ``fedavg``).
- ``fedmax``: α_i = 1 for i = J_t = argmax_i gap_i, else 0 (eq. 22; ties go to the lowest index).
- ``fedmax_k``: α_i = 1/k for the k clients with the largest gaps, else 0 (the paper's FedMax(k),
  Power-of-Choice's selection); ``algorithm.k`` ≥ 1 is a count, 0 < k < 1 a fraction of the K
  sampled clients (⌈k·K⌉); k larger than the clients that returned takes them all.
- ``fedsoftmax``: α_i = p_i exp(gap_i / T) / Σ_j p_j exp(gap_j / T) (the paper's FedSoftMax, "the
  softened version" of FedMax), computed as a softmax of log p_i + gap_i / T (log-sum-exp), so huge
  losses cannot overflow. T → ∞ gives gen_fedavg, T → 0 gives fedmax.

Choices, and where the paper is silent or its code differs:

- **Temperature convention.** The paper divides the gap by T. The authors' public code multiplies the
  loss by T, i.e. it computes exp(T · gap): its T is our 1/T. ``algorithm.temperature_scale:
  multiply`` follows the code; the conversion is T_paper = 1 / T_code. (The paper's §3.2 says "a
  higher temperature entails a higher convergence speed" over T ∈ [5, 30], which only holds for the
  code's convention, where a larger T sharpens the weights towards FedMax.)
- **F_i^*** (``algorithm.optimal_loss``): ``zero`` takes F_i^* = 0 (the loss is a cross-entropy, ≥ 0;
  the paper's experiments ignore F_i^*). ``running_min`` estimates the client's own optimum by the
  lowest loss it has ever reported, counting the loss of its trained local model F_i(w_i^{t+1}) (a
  second forward pass at the end of training), so gap_i ≥ 0 and shrinks as the global model fits
  client i as well as the client can fit itself. F_i^* is kept for all N clients in ``state_dict``.
- **Which data** (``algorithm.loss_batch``): ``full`` evaluates F_i on all of the client's data (the
  paper's F_i), ``minibatch`` on one fresh minibatch (cheaper; Power-of-Choice's estimate).
- **Stragglers and dropouts.** A straggler's Δ_i is its partial work, weighted like any other; a
  client that returned nothing gets α_i = 0 and the others are renormalised; if none returned the
  round leaves w unchanged.
- **Accounting.** The loss is a scalar: uploads stay one model per client. ``compute/grad_evals``
  counts the probe pass(es) as one evaluation per returning client.
- **Records.** Each round keeps p_i, α_i, |α_i − p_i|, F_i(w^t) and gap_i per sampled client
  (``clients.csv``, the paper's Figs. 6 and 7) and logs ``weights/max_abs_dev``,
  ``weights/mean_abs_dev``, ``weights/max`` and ``weights/effective_clients`` (1 / Σ α_i²).
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fedsweep.algorithms import register
from fedsweep.algorithms.base import Algorithm
from fedsweep.util.lazy import torch


class LossAwareParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    optimal_loss: Literal["zero", "running_min"] = Field(
        "zero", description="F_i^*: `zero`, or `running_min` (the lowest loss client i has reported, its trained "
        "local model's included).")
    loss_batch: Literal["full", "minibatch"] = Field(
        "full", description="F_i(w^t) on the client's full data (the paper) or on one fresh minibatch.")


class FedMaxKParams(LossAwareParams):
    k: float = Field(0.2, gt=0, description="Clients that share the weight: a count (an integer ≥ 1) or a "
                     "fraction of the K sampled clients (< 1, rounded up).")

    @field_validator("k")
    @classmethod
    def _count_or_fraction(cls, k: float) -> float:
        if k >= 1 and k != int(k):
            raise ValueError(f"k = {k:g}: a count must be a whole number, a fraction must be below 1")
        return k


class FedSoftMaxParams(LossAwareParams):
    temperature: float = Field(
        1.0, gt=0, description="T in α_i ∝ p_i exp((F_i − F_i^*)/T): large T → gen_fedavg, small T → fedmax.")
    temperature_scale: Literal["divide", "multiply"] = Field(
        "divide", description="`divide`: exp(gap/T), the paper. `multiply`: exp(T·gap), the authors' public code "
        "(T_paper = 1/T_code).")


class _LossAware(Algorithm):
    """FedAvg clients that also report F_i(w^t); subclasses turn the gaps into weights α."""
    Params = LossAwareParams
    rowwise = True   # client_step and client_final are row-wise: run on all K clients stacked
    metrics = ("weights/max_abs_dev", "weights/mean_abs_dev", "weights/max", "weights/effective_clients")

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.probe = params.loss_batch
        self.fstar = torch.full((ctx.num_clients,), math.inf, device=ctx.device, dtype=torch.float64)
        self._record: dict[str, torch.Tensor] = {}

    def client_final(self, state, w0, ops, probe):
        out = {"delta": state["w"] - w0, "loss": ops.loss(w0, probe)}             # F_i(w^t)
        if self.params.optimal_loss == "running_min":
            out["loss_local"] = ops.loss(state["w"], probe)                      # F_i(w_i^{t+1})
        return out

    def alpha(self, p: torch.Tensor, gap: torch.Tensor, returned: torch.Tensor) -> torch.Tensor:
        """Weights (K,) summing to 1 over the clients that returned (float64)."""
        raise NotImplementedError

    def aggregate(self, w, uploads, plan):
        returned = plan.participated.to(self.ctx.device)
        p = self.weights(plan).double()
        loss = uploads["loss"].double()
        clients = plan.clients.to(self.ctx.device)
        if self.params.optimal_loss == "running_min":
            seen = torch.minimum(loss, uploads["loss_local"].double())
            best = torch.minimum(self.fstar[clients], seen)
            self.fstar[clients] = torch.where(returned, best, self.fstar[clients])
            fstar = torch.where(returned, self.fstar[clients], torch.zeros_like(loss))
        else:
            fstar = torch.zeros_like(loss)
        gap = torch.where(returned, loss - fstar, torch.zeros_like(loss))
        alpha = self.alpha(p, gap, returned) if bool(returned.any()) else torch.zeros_like(p)
        self._record = {"p": p, "alpha": alpha, "abs_dev": (alpha - p).abs(), "loss_global": loss, "gap": gap}
        return alpha.to(self.ctx.dtype) @ uploads["delta"]

    def round_metrics(self, plan):
        r, returned = self._record, plan.participated.to(self.ctx.device)
        if not r or not bool(returned.any()):
            return {}
        dev = r["abs_dev"][returned]
        return {"weights/max_abs_dev": float(dev.max()), "weights/mean_abs_dev": float(dev.mean()),
                "weights/max": float(r["alpha"].max()), "weights/effective_clients": float(1 / (r["alpha"] ** 2).sum())}

    def client_record(self, plan):
        return dict(self._record)

    def state_dict(self):
        return {"fstar": self.fstar.clone()}

    def load_state_dict(self, state):
        if "fstar" in state:
            self.fstar = state["fstar"].to(self.ctx.device, torch.float64).clone()


@register
class GenFedAvg(_LossAware):
    name = "gen_fedavg"

    def alpha(self, p, gap, returned):
        return p


@register
class FedMax(_LossAware):
    name = "fedmax"

    def alpha(self, p, gap, returned):
        j = torch.argmax(torch.where(returned, gap, torch.full_like(gap, -math.inf)))   # eq. (22)
        return torch.zeros_like(p).index_fill_(0, j.view(1), 1.0)


@register
class FedMaxK(_LossAware):
    name = "fedmax_k"
    Params = FedMaxKParams

    def top_k(self, num_sampled: int, num_returned: int) -> int:
        k = self.params.k
        k = int(k) if k >= 1 else math.ceil(k * num_sampled)
        return max(1, min(k, num_returned))

    def alpha(self, p, gap, returned):
        k = self.top_k(len(p), int(returned.sum()))
        masked = torch.where(returned, gap, torch.full_like(gap, -math.inf))
        # stable sort: among equal gaps the lower index wins, as in fedmax
        top = torch.sort(masked, descending=True, stable=True).indices[:k]
        return torch.zeros_like(p).index_fill_(0, top, 1.0 / k)


@register
class FedSoftMax(_LossAware):
    name = "fedsoftmax"
    Params = FedSoftMaxParams

    def alpha(self, p, gap, returned):
        t, valid = self.params.temperature, returned & (p > 0)
        # gaps relative to the largest: the exponent is ≤ 0, so neither a huge gap nor a tiny T overflows
        # an infinite loss (a client the model fits infinitely badly) leads; NaN stays NaN (divergence)
        gap = torch.nan_to_num(gap, nan=math.nan, posinf=torch.finfo(gap.dtype).max)
        rel = gap - gap[valid].max()
        scaled = rel / t if self.params.temperature_scale == "divide" else rel * t
        logits = torch.where(valid, torch.log(p) + scaled, torch.full_like(p, -math.inf))
        return torch.softmax(logits, dim=0)          # = p_i e^{gap_i/T} / Σ_j p_j e^{gap_j/T}
