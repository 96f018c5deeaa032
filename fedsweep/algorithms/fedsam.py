"""FedSAM: FedAvg with sharpness-aware local steps (Qu et al. 2022, "Generalized Federated Learning via
Sharpness Aware Minimization", local SAM optimizer; Caldarola et al. 2022, "Improving Generalization
in Federated Learning by Seeking Flat Minima"; SAM: Foret et al. 2021, eq. 2 with p = 2).

Each local step takes two gradient passes on the SAME minibatch B_{i,k} (SAM's first-order
approximation of the inner max, Foret et al. eq. 2–3):

    g   = ∇F_i(w_{i,k}, B_{i,k})                                   (first pass)
    ε   = r g / ‖g‖₂                                               (ε̂(w), p = 2)
    w_{i,k+1} = w_{i,k} − η_l ∇F_i(w_{i,k} + ε, B_{i,k})           (second pass, the SAM gradient)

Server as FedAvg: w^{t+1} = w^t + η_g Σ q_i Δ_i.

Choices, and where they differ from the paper or published code:

- **‖g‖ = 0**: ε = 0 (then the step is a plain SGD step). The published SAM code (Foret et al.) and
  the FedSAM code of Caldarola et al. divide by ‖g‖ + 1e-12 instead; the two differ by a relative
  1e-12 when ‖g‖ > 0, and ours is exactly the formula.
- **Norm**: over the whole flat parameter vector (SAM's global norm), not per layer.
- **Radius** ``radius`` is SAM's ρ, FedLGA Table IV's "sharpness radius r" ∈ {0.1, 0.5, 0.9};
  r = 0 is exactly FedAvg (but still costs two passes a step in the accounting).
- **Accounting**: ``grads_per_step = 2``, so ``compute/grad_evals`` is 2 Σ E_i (FedLGA compares
  FedSAM on the number of back-propagations for this reason); communication as FedAvg. The step's
  training loss is the first pass's (at w, not at w + ε). No state across rounds.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fedsweep.algorithms import register
from fedsweep.algorithms.base import Algorithm
from fedsweep.util.lazy import torch


class FedSAMParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    radius: float = Field(0.1, ge=0, description="r (SAM's ρ): the gradient is taken at w + r g/‖g‖ "
                          "(FedLGA Table IV: {0.1, 0.5, 0.9}); 0 is FedAvg.")


@register
class FedSAM(Algorithm):
    name = "fedsam"
    rowwise = True   # client_step and client_final are row-wise: run on all K clients stacked
    Params = FedSAMParams
    grads_per_step = 2

    def client_step(self, state, batch, ops, lr, shared):
        w = state["w"]
        _, g = ops.grad(w, batch)                                   # first pass
        norm = torch.linalg.vector_norm(g, dim=-1, keepdim=True)
        positive = norm > 0
        scale = torch.where(positive, self.params.radius / torch.where(positive, norm, torch.ones_like(norm)),
                            torch.zeros_like(norm))                # r/‖g‖, 0 where g = 0
        _, g_sam = ops.grad(w + scale * g, batch)                   # second pass at w + ε
        return {**state, "w": torch.add(w, g_sam, alpha=-lr)}
