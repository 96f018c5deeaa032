"""FedProx: local SGD on F_i(w) + μ/2 ‖w − w^t‖² (Li et al. 2020, MLSys, eq. 2).

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in Heterogeneous Networks",
MLSys 2020 (arXiv:1812.06127).

Local objective (eq. 2):   h_i(w; w^t) = F_i(w) + (μ/2) ‖w − w^t‖²

which each client minimises inexactly (a γ_i^t-inexact solution, Definition 2 and Algorithm 2) by
E_i steps of mini-batch SGD on h_i — the rule of the authors' ``PerturbedGradientDescent``:

    w_{i,e+1} = w_{i,e} − η_l [ ∇F_i(w_{i,e}; B_{i,e}) + μ (w_{i,e} − w^t) ]     (∇ of eq. 2)

Server (Algorithm 2's aggregation step, as FedAvg):   w^{t+1} = w^t + η_g Σ_i q_i Δ_i,   Δ_i = w_{i,E_i} − w^t.

μ = 0 is exactly FedAvg (tested).

Stragglers: FedProx's point is to keep the partial solutions of clients that did less work
(Sec. 3, tolerating partial work through γ_i^t-inexactness) rather than drop them; here every client
runs its own ``plan.steps`` E_i and its Δ_i is aggregated like any other, which is that rule. The
proximal term needs no τ: nothing else in the equations depends on E_i.

Choices where the paper and the authors' code (litian96/FedProx) differ:

- Aggregation weights: Algorithm 2 samples devices with probability p_k and takes the plain mean of
  their models; the code's ``aggregate`` weights each solution by its number of samples. Both are
  the framework's ``algorithm.weighting`` (``uniform`` the default, as for every algorithm here;
  ``data`` reproduces the code with uniform client sampling).
- The anchor w^t is what every client downloads anyway, so it is passed as the round's shared
  tensor (``broadcast``) instead of being copied into each client's local state.

Cost: the proximal term is an O(n) vector operation per step, no extra gradient pass and no extra
communication: compute = Σ_i E_i gradient evaluations, 1 model up per returning client, 1 down per
sampled client (the base accounting). The FedLGA paper's grid (Table IV) is μ ∈ {0.1, 0.5, 1}.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fedsweep.algorithms import register
from fedsweep.algorithms.base import Algorithm
from fedsweep.util.lazy import torch


class FedProxParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mu: float = Field(0.1, ge=0, description="μ, the proximal weight of eq. (2): each local step adds "
                      "μ(w − w^t) to the gradient; 0 is FedAvg (FedLGA Table IV grid: 0.1, 0.5, 1).")


@register
class FedProx(Algorithm):
    name = "fedprox"
    rowwise = True   # client_step and client_final are row-wise: run on all K clients stacked
    Params = FedProxParams

    def broadcast(self, w, plan):
        return {"anchor": w}                                   # w^t, the centre of the proximal term

    def client_step(self, state, batch, ops, lr, shared):
        _, g = ops.grad(state["w"], batch)                     # ∇F_i(w; B)
        if self.params.mu:
            g = torch.add(g, state["w"] - shared["anchor"], alpha=self.params.mu)   # + μ(w − w^t)
        return {**state, "w": torch.add(state["w"], g, alpha=-lr)}
