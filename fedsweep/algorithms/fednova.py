"""FedNova: each update normalized by its local-solver coefficients a_i (Wang et al. 2020, NeurIPS).

Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization", NeurIPS 2020 (arXiv:2007.07481).

Sec. 4 writes any local solver whose update is linear in the local gradients as

    Δ_i = w_{i,τ_i} − w^t = −η_l G_i a_i,     G_i = [∇F_i(w_{i,0}; B), …, ∇F_i(w_{i,τ_i−1}; B)]

with a_i ∈ R^{τ_i} the solver's coefficient vector, and shows FedAvg then optimizes a surrogate
objective in which client i weighs q_i‖a_i‖₁ instead of q_i (the "objective inconsistency"). FedNova
(Sec. 5) normalizes each update by its ‖a_i‖₁ and rescales by an effective step count:

    d_i = −Δ_i / (η_l ‖a_i‖₁)                       (normalized gradient  G_i a_i / ‖a_i‖₁)
    τ_eff = Σ_i q_i ‖a_i‖₁                           (Sec. 5: the τ_eff FedAvg implicitly uses)
    w^{t+1} = w^t − η_g τ_eff Σ_i q_i η_l d_i = w^t + η_g τ_eff Σ_i q_i Δ_i / ‖a_i‖₁

so ``aggregate`` returns u = τ_eff Σ q_i Δ_i / a_i and the server optimizer (lr η_g) adds η_g u;
the code's server momentum (``gmf``) is ``server.optimizer: momentum`` here.
τ_i is each client's ACTUAL number of local steps this round (``plan.steps``; stragglers included).
Writing a_i for ‖a_i‖₁, the local solvers and their a_i (Sec. 4 examples, Appendix):

    plain SGD      w ← w − η g                                  a_i = τ_i
    momentum ρ     m ← ρ m + g (m₀ = 0),  w ← w − η m            a_i = [τ_i − ρ(1 − ρ^{τ_i})/(1 − ρ)] / (1 − ρ)
                   (coefficients [1 − ρ^{τ_i}, …, 1 − ρ]/(1 − ρ))
    proximal μ     w ← w − η [g + μ(w − w^t)]                    a_i = [1 − (1 − ημ)^{τ_i}] / (ημ)
                   (coefficients [(1 − ημ)^{τ_i−1}, …, 1])

These were checked against the paper (from its text as recalled, without a copy at hand, so
equations are cited by section, not number) and against the authors' code (JYWa/FedNova,
``distoptim/FedNova.py``), whose per-step normalizer recursions — counter c ← ρc + 1, a += c for
momentum; a ← (1 − ημ) a + 1 for prox; a += 1 for plain — sum to exactly these closed forms
(tested). With equal τ_i, ρ = 0 and μ = 0, a_i = τ_eff = τ and FedNova is exactly FedAvg; with equal
τ_i and μ > 0 it is exactly FedProx (tested).

Choices where the paper and the published code differ, or neither says:

- τ_eff (``tau_eff``): the paper's FedNova keeps FedAvg's τ_eff = Σ q_i a_i (default ``paper``), so
  only the relative weights change. The code's ``average()`` uses τ_eff = Σ q_i τ_i whenever μ ≠ 0
  (and Σ q_i a_i otherwise): ``code``. With prox this scales every update by Σq τ / Σq a > 1.
- Momentum and prox together: the code adds μ(w − w^t) to ``d_p`` after ``d_p = buf``, an alias, so
  the proximal term enters the momentum buffer: m ← ρ m + g + μ(w − w^t), heavy-ball SGD on the
  FedProx objective. That is the local rule here. The code's normalizer for this case
  ((a + c)(1 − ημ) + 1 per step) is not the coefficient sum of that rule, and the paper gives no
  formula, so a_i here is the exact coefficient sum of the rule: B_k = ρ B_{k−1} + 1 − ημ S_{k−1},
  S_k = S_{k−1} + B_k, a_i = S_{τ_i} (it reduces to both closed forms above; it equals ‖a_i‖₁ as long
  as the coefficients stay ≥ 0, which holds for small ημ).
- The momentum buffer starts at 0 every round (the code re-zeroes it in ``average()``); it lives in
  the local state, which the engines mask per client, so stragglers keep theirs unchanged.
- Weights q_i: the code uses the data ratio n_i/n; here ``algorithm.weighting`` (``data`` is the
  code's). A dropped client (τ_i = 0, q_i = 0) contributes nothing and no 0/0.

Cost: a_i is computed on the server from τ_i (the client would send one scalar; counted as
nothing), so communication is the base 1 model up per returning client and 1 down per sampled
client; compute is Σ_i τ_i gradient evaluations (momentum and prox are O(n) vector operations; the
buffer is one extra model-size vector of client memory). The FedLGA paper (Table IV) runs FedNova
with proximal SGD, μ ∈ {0.001, 0.005, 0.01}.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedsweep.algorithms import register
from fedsweep.algorithms.base import Algorithm
from fedsweep.util.lazy import torch


class FedNovaParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    momentum: float = Field(0.0, ge=0, lt=1, description="ρ, local heavy-ball momentum m ← ρm + g, "
                            "w ← w − η_l m (buffer reset each round); 0 is plain local SGD.")
    mu: float = Field(0.0, ge=0, description="μ, proximal local SGD: + μ(w − w^t) in each step's gradient "
                      "(FedLGA Table IV grid: 0.001, 0.005, 0.01); 0 is none.")
    tau_eff: Literal["paper", "code"] = Field(
        "paper", description="τ_eff: `paper` Σ q_i a_i (FedAvg's, Sec. 5); `code` Σ q_i τ_i when μ > 0, as in "
        "the authors' FedNova.average().")


def normalizer_recursion(steps: torch.Tensor, rho: float, etamu: float) -> torch.Tensor:
    """a_i = sum of the coefficients of the local gradients in Δ_i = −η G_i a_i for the rule
    m ← ρ m + g + μ(w − w^t), w ← w − η m, iterated on scalars: B_k = ρ B_{k−1} + 1 − ημ S_{k−1},
    S_k = S_{k−1} + B_k, a_i = S_{τ_i}. Works for any ρ, ημ (the closed forms are its special cases)."""
    steps = steps.to(torch.float64)
    S = torch.zeros_like(steps)
    B = torch.zeros_like(steps)
    for k in range(1, int(steps.max()) + 1 if steps.numel() else 1):
        B_new = rho * B + 1.0 - etamu * S
        active = steps >= k
        B = torch.where(active, B_new, B)
        S = torch.where(active, S + B_new, S)
    return S


@register
class FedNova(Algorithm):
    name = "fednova"
    rowwise = True   # client_step and client_final are row-wise: run on all K clients stacked
    Params = FedNovaParams

    # ----- client ---------------------------------------------------------------------------------
    def broadcast(self, w, plan):
        return {"anchor": w} if self.params.mu else {}          # w^t, centre of the proximal term

    def client_init(self, w, shared, own, ops, probe):
        state = {"w": w}
        if self.params.momentum:
            state["m"] = torch.zeros_like(w)                     # m₀ = 0 every round
        return state

    def client_step(self, state, batch, ops, lr, shared):
        _, g = ops.grad(state["w"], batch)                       # ∇F_i(w; B)
        if self.params.mu:
            g = torch.add(g, state["w"] - shared["anchor"], alpha=self.params.mu)   # + μ(w − w^t)
        new = dict(state)
        if self.params.momentum:
            g = torch.add(g, state["m"], alpha=self.params.momentum)               # m ← ρ m + g
            new["m"] = g
        new["w"] = torch.add(state["w"], g, alpha=-lr)                              # w ← w − η m
        return new

    # ----- server ---------------------------------------------------------------------------------
    def normalizer(self, plan) -> torch.Tensor:
        """a_i = ‖a_i‖₁ (K,) float64 on CPU, from each client's actual steps τ_i (0 for dropped)."""
        tau = plan.steps.to(torch.float64)
        rho, etamu = float(self.params.momentum), float(plan.lr) * float(self.params.mu)
        if rho == 0 and etamu == 0:
            return tau                                                               # plain: τ_i
        if etamu == 0:
            return (tau - rho * (1 - rho ** tau) / (1 - rho)) / (1 - rho)            # momentum
        if rho == 0:
            return (1 - (1 - etamu) ** tau) / etamu                                  # proximal
        return normalizer_recursion(plan.steps, rho, etamu)                         # both

    def effective_steps(self, plan, a: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """τ_eff = Σ q_i a_i (paper) or Σ q_i τ_i when μ > 0 (code)."""
        if self.params.tau_eff == "code" and self.params.mu:
            return q @ plan.steps.to(q)
        return q @ a

    def aggregate(self, w, uploads, plan):
        q = self.weights(plan)
        a = self.normalizer(plan).to(q)
        tau_eff = self.effective_steps(plan, a, q)
        scale = torch.where(a > 0, q / torch.where(a > 0, a, torch.ones_like(a)), torch.zeros_like(a))
        return (tau_eff * scale) @ uploads["delta"]                # τ_eff Σ q_i Δ_i / a_i
