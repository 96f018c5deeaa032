"""FedCM: client-level momentum (Xu et al. 2021, "FedCM: Federated Learning with Client-level Momentum", Alg. 1).

The server broadcasts, with w^t, the last round's normalized mean update d̄ (the paper's Δ_t); every
local step mixes the fresh minibatch gradient with it (Alg. 1, client loop):

    v_{i,k}   = α g_{i,k} + (1 − α) d̄,      g_{i,k} = ∇F_i(w_{i,k}, B_{i,k})          (Alg. 1, "v")
    w_{i,k+1} = w_{i,k} − η_l v_{i,k}                                                 (Alg. 1, local step)

and after aggregation stores the new direction, normalized by each client's actual step count E_i
(stragglers included) and the round's η_l (Alg. 1, server: Δ_{t+1} = −(1/(η_l K |S|)) Σ_S Δ_i):

    d̄ ← −Σ_S q_i Δ_i / (E_i η_l),            Δ_i = w_{i,E_i} − w^t

Server step as FedAvg: w^{t+1} = w^t + η_g Σ q_i Δ_i (the server optimizer's lr η_g).

Choices, and where they differ from the paper or published code:

- **Naming**: ``alpha`` is the paper's α, the weight of the *fresh gradient* (the paper calls α the
  momentum parameter; α = 1 is FedAvg, small α is heavy momentum). FedLGA's Table IV lists "FedCM
  momentum β ∈ {0.01, 0.1, 0.5}"; we read that β as this α (the same range the FedCM paper sweeps,
  whose best value is α = 0.1, the default here). If a source means the weight of d̄ instead, use
  α = 1 − β.
- **First round**: no d̄ exists yet. ``first_round: gradient`` (default, docs/design.md §3) takes plain
  steps on g (a FedAvg round), and nothing extra is downloaded. ``zero_momentum`` uses d̄ = 0 in the
  formula, i.e. α g (Alg. 1 with a zero initial Δ_0, as zero-initialized public implementations do),
  which only shrinks the first round's lr by α.
- **Stragglers**: each Δ_i is divided by its own E_i (``plan.steps``) on the server, so d̄ estimates
  the mean gradient rate even when clients took different numbers of steps (the paper has one K).
  A public re-implementation (Zaccone et al., GHBM code) instead stores Σ q_i Δ_i and lets each
  *receiving* client divide by its own lr·steps; the two agree when every client takes E steps.
- **Weights**: the mean over S uses the aggregation weights q_i (``algorithm.weighting``): with
  ``uniform`` it is the paper's 1/|S| over the clients that returned; dropped clients count nothing.
  If no client returned, d̄ is kept.
- **Server lr**: the paper's server step x ← x − η_g Δ_{t+1} uses the normalized direction; here the
  server steps on Σ q_i Δ_i like FedAvg, so the paper's η_g equals ours times η_l E (equal steps).
- **Communication**: every sampled client downloads w^t and d̄ (2 model-size vectors) once d̄ exists
  (and α < 1; with α = 1, d̄ is unused and not sent, so α = 1 is exactly FedAvg); uploads are Δ_i only.
  d̄ is kept in ``state_dict`` (checkpoints resume exactly).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedsweep.algorithms import register
from fedsweep.algorithms.base import Algorithm
from fedsweep.util.lazy import torch


class FedCMParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    alpha: float = Field(0.1, ge=0, le=1, description="α, weight of the fresh gradient in α g + (1 − α) d̄ "
                         "(FedCM's α; FedLGA Table IV's 'momentum β' ∈ {0.01, 0.1, 0.5}); 1 is FedAvg.")
    first_round: Literal["gradient", "zero_momentum"] = Field(
        "gradient", description="Before any d̄ exists: `gradient` plain steps on g (FedAvg round); "
        "`zero_momentum` d̄ = 0 in the formula, i.e. steps on α g.")


@register
class FedCM(Algorithm):
    name = "fedcm"
    rowwise = True   # client_step and client_final are row-wise: run on all K clients stacked
    Params = FedCMParams

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.d: torch.Tensor | None = None       # d̄, the last round's normalized mean update
        self._sent_d = False                      # whether this round's broadcast carried d̄

    # ----- server -> clients ------------------------------------------------------------------
    def broadcast(self, w, plan):
        alpha = self.params.alpha
        if alpha == 1.0:
            self._sent_d = False
            return {}
        if self.d is None:
            self._sent_d = False
            if self.params.first_round == "gradient":
                return {}
            return {"d": torch.zeros_like(w)}     # not sent: the clients know d̄ = 0
        self._sent_d = True
        return {"d": self.d}

    # ----- client ---------------------------------------------------------------------------------
    def client_step(self, state, batch, ops, lr, shared):
        _, g = ops.grad(state["w"], batch)
        if "d" in shared:                          # structure, not tensor values: same for all clients
            a = self.params.alpha
            g = a * g + (1.0 - a) * shared["d"]     # v = α g + (1 − α) d̄
        return {**state, "w": torch.add(state["w"], g, alpha=-lr)}

    # ----- server ---------------------------------------------------------------------------------
    def aggregate(self, w, uploads, plan):
        delta = uploads["delta"]
        q = self.weights(plan)
        if bool((q > 0).any()):
            steps = plan.steps.clamp(min=1).to(delta)              # E_i (dropped: weight 0 anyway)
            self.d = -(q @ (delta / (plan.lr * steps).unsqueeze(1)))   # d̄ = −Σ q_i Δ_i/(E_i η_l)
        return q @ delta

    def state_dict(self):
        return {} if self.d is None else {"d": self.d.clone()}

    def load_state_dict(self, state):
        d = state.get("d")
        self.d = None if d is None else d.to(self.ctx.device, self.ctx.dtype).clone()

    # ----- accounting -----------------------------------------------------------------------------
    def communication(self, plan):
        up, down = super().communication(plan)
        return up, down + (plan.num_sampled if self._sent_d else 0)
