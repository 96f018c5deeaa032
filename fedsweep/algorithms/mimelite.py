"""MimeLite with SGD-momentum as the base optimizer (Karimireddy et al. 2021, "Breaking the centralized
barrier for cross-device federated learning" / "Mime: Mimicking centralized stochastic algorithms in
federated learning", Alg. 1 with the MimeLite client update and the SGDm base optimizer).

The server keeps the momentum m of a centralized SGDm and sends it, frozen, with w^t. Each local
step applies the base optimizer's update with that frozen state (Mime Alg. 1, client loop; SGDm's
U(g, m) = (1 − β) g + β m):

    w_{i,k+1} = w_{i,k} − η_l ((1 − β) g_{i,k} + β m),      g_{i,k} = ∇F_i(w_{i,k}, B_{i,k})

Each client also computes its full-batch gradient at the broadcast model, ∇f_i(w^t) (``probe =
"full"``), and uploads it with Δ_i. The server (Mime Alg. 1, server lines) steps as FedAvg,
w^{t+1} = w^t + η_g Σ q_i Δ_i (the paper's x ← mean y_i is η_g = 1), and updates the momentum with
the gradients *at w^t*, never at the clients' trained models:

    m ← β m + (1 − β) Σ_S q_i ∇f_i(w^t)                     (SGDm state update V(·, m))

Choices, and where they differ from the paper or published code:

- **Momentum form**: the paper writes SGDm with dampening, (1 − β) g + β m. FedJAX's ``mime_lite``
  (the authors' group's published code) uses optax momentum without dampening: local direction
  g + β m and m ← β m + g. The two are the same algorithm with η_l (and the momentum scale) rescaled
  by 1/(1 − β); we follow the paper (and docs/design.md §3), so β = 0 is exactly FedAvg.
- **Initial momentum** m = 0, as both the paper and FedJAX initialize the base optimizer's state: the
  first round's direction is therefore (1 − β) g. No warm-up or bias correction.
- **Mean of the gradients**: weighted by q_i (``algorithm.weighting``); ``uniform`` is the paper's
  1/|S| over the clients that returned, ``data`` is FedJAX's example-weighted mean (it sums
  per-example gradients over the sampled clients' data). Dropped clients count nothing; if no client
  returned, m is kept.
- **Where the probe is computed**: ∇f_i(w^t) is evaluated in ``client_final`` at w^t on the client's
  full data — the same value as before training, without carrying it through the local steps.
- **Accounting**: uploads Δ_i and ∇f_i(w^t) (2 vectors per returning client); downloads w^t and m
  (2 per sampled client); compute adds one full-data gradient evaluation per returning client to
  the local steps (``compute/grad_evals`` counts it as 1, though it touches all n_i samples, i.e.
  ≈ n_i/B minibatch gradients). m is kept in ``state_dict`` (checkpoints resume exactly).
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fedsweep.algorithms import register
from fedsweep.algorithms.base import Algorithm
from fedsweep.util.lazy import torch


class MimeLiteParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    beta: float = Field(0.1, ge=0, lt=1, description="β, the server momentum: local direction (1 − β) g + β m, "
                        "m ← β m + (1 − β) mean ∇f_i(w^t) (FedLGA Table IV: {0.01, 0.1, 0.5}); 0 is FedAvg.")


@register
class MimeLite(Algorithm):
    name = "mimelite"
    rowwise = True   # client_step and client_final are row-wise: run on all K clients stacked
    Params = MimeLiteParams
    probe = "full"
    upload_models = 2.0     # Δ_i and ∇f_i(w^t)
    download_models = 2.0   # w^t and m

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.m = torch.zeros(ctx.dim, device=ctx.device, dtype=ctx.dtype)

    def broadcast(self, w, plan):
        return {"m": self.m}

    def client_step(self, state, batch, ops, lr, shared):
        _, g = ops.grad(state["w"], batch)
        b = self.params.beta
        direction = (1.0 - b) * g + b * shared["m"]            # SGDm's U(g, m) with m frozen
        return {**state, "w": torch.add(state["w"], direction, alpha=-lr)}

    def client_final(self, state, w0, ops, probe):
        return {"delta": state["w"] - w0, "grad": ops.grad(w0, probe)[1]}   # ∇f_i(w^t), full data

    def aggregate(self, w, uploads, plan):
        q = self.weights(plan)
        if bool((q > 0).any()):
            b = self.params.beta
            self.m = b * self.m + (1.0 - b) * (q @ uploads["grad"])          # m ← β m + (1−β) mean ∇f_i(w^t)
        return q @ uploads["delta"]

    def state_dict(self):
        return {"m": self.m.clone()}

    def load_state_dict(self, state):
        if "m" in state:
            self.m = state["m"].to(self.ctx.device, self.ctx.dtype).clone()
