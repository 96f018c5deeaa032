"""FedDyn: federated learning with dynamic regularization (Acar et al., ICLR 2021, Alg. 1).

Each client i keeps (here: the server keeps, as rows of a
:class:`~fedsweep.algorithms.client_rows.ClientRows` allocated for the clients that have taken part) the
linear term ∇L_i(θ_i^{t−1}), zero before i first takes part; the server keeps h, h^0 = 0. With P_t the clients
that return this round, θ^{t−1} = w^t the server model and α the dynamic-regularizer weight:

    θ_i^t = argmin_θ L_i(θ) − ⟨∇L_i(θ_i^{t−1}), θ⟩ + (α/2)‖θ − θ^{t−1}‖²        (Alg. 1 line 5)
        solved by E_i local SGD steps from θ^{t−1} on the gradient
        g_i(θ) − ∇L_i(θ_i^{t−1}) + α (θ − θ^{t−1})
    ∇L_i(θ_i^t) = ∇L_i(θ_i^{t−1}) − α (θ_i^t − θ^{t−1}) = ∇L_i^{prev} − α Δ_i     (line 6)
    h^t = h^{t−1} − α (1/N) Σ_{P_t} Δ_i                                          (line 9; m = N)
    θ^t = (1/|P_t|) Σ_{P_t} θ_i^t − h^t/α                                         (line 10)

(N: the clients that train, ``ctx.training_clients``, without those ``eval.unseen_clients`` holds out.)

As an update relative to w^t (what the server optimizer applies, w ← w + η_g u):

    u = Σ_{P_t} q_i Δ_i − h^t/α          (q_i = 1/|P_t|: then w + u is line 10 exactly)

so with ``server.optimizer: sgd`` and ``server.lr`` η_g = 1 this is FedDyn. With η_g ≠ 1 the server
moves η_g times the whole FedDyn step, w^t + η_g (θ^t − θ^{t−1}) — both the averaged client change and
the −h/α correction are scaled, while h itself (the running mean of the clients' linear terms, h^t =
(1/N) Σ_all ∇L_i) is not; it is no longer the paper's algorithm and its stationarity argument
(Acar et al. §3) does not apply. Momentum/Adam likewise act on u as a pseudo-gradient.

Choices:

- **α** default 0.01, the middle of FedLGA Table IV's grid {0.1, 0.01, 0.001}.
- **Constant α.** The authors' code (github.com/alpemreacar/FedDyn, ``utils_methods.train_FedDyn``)
  uses α_i = α / (N n_i/Σn), an "adaptive" per-client α that equals α for equal-sized clients; the
  paper's Alg. 1 has one α, which we take (also with ``weighting: data``).
- **Local solver**: the paper solves line 5 inexactly with SGD; the code does the same (the α‖θ‖²/2
  part as SGD weight decay, the linear part as an extra loss), and also clips the full gradient to
  norm 10, which the paper does not; we do not clip. We take each client's actual E_i steps
  (stragglers simply solve line 5 less accurately; line 6 uses their actual Δ_i).
- **Server model**: the code trains clients from, and regularizes them to, the "cloud" model
  avg + mean_all(θ_i − θ^{t−1} accumulated) = line 10, but reports test accuracy of the plain average
  of the returned models; there is one model here, θ^t of line 10, which is what is evaluated.
- **Weights**: mean_S uses q_i (uniform 1/|P_t| = the paper; ``weighting: data`` gives n_i/Σn);
  h always uses the paper's unweighted 1/N sum.
- **Dropped clients** return nothing: their ∇L_i row is unchanged and they add nothing to h. If no
  client returns, u = 0 (w, h unchanged): line 10 has no average to take.
- **Communication** equals FedAvg's (1 model down, 1 up): the linear term lives with the client
  and is updated from Δ_i alone (line 6), which the server can also do (it does here).
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fedsweep.algorithms import register
from fedsweep.algorithms.base import Algorithm
from fedsweep.algorithms.client_rows import ClientRows
from fedsweep.util.lazy import torch


class FedDynParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    alpha: float = Field(
        0.01, gt=0, description="α, the dynamic-regularizer weight: local gradient g − ∇L_i^{prev} + "
        "α(w − w^t); server w = mean w_i − h/α (FedLGA Table IV grid: 0.1, 0.01, 0.001).")


@register
class FedDyn(Algorithm):
    name = "feddyn"
    rowwise = True   # client_step and client_final are row-wise: run on all K clients stacked
    client_rows = 1  # ∇L_i(θ_i)
    Params = FedDynParams

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.h = torch.zeros(ctx.dim, device=ctx.device, dtype=ctx.dtype)
        self.grad_prev = ClientRows(ctx.num_clients, ctx.dim, ctx.device, ctx.dtype)

    # ----- server -> clients ------------------------------------------------------------------
    def client_state(self, plan):
        return {"grad_prev": self.grad_prev.get(plan.clients)}

    # ----- client -------------------------------------------------------------------------------
    def client_init(self, w, shared, own, ops, probe):
        # g − ∇L^{prev} + α(θ − θ^{t−1}) = g + αθ − b with the constant b = ∇L^{prev} + α θ^{t−1}
        return {"w": w, "b": own["grad_prev"] + self.params.alpha * w}

    def client_step(self, state, batch, ops, lr, shared):
        _, g = ops.grad(state["w"], batch)
        d = torch.add(g, state["w"], alpha=self.params.alpha) - state["b"]
        return {**state, "w": torch.add(state["w"], d, alpha=-lr)}

    # ----- server -------------------------------------------------------------------------------
    def aggregate(self, w, uploads, plan):
        alpha = self.params.alpha
        delta = uploads["delta"]
        ok = plan.participated.to(delta.device).unsqueeze(1)
        delta = torch.where(ok, delta, torch.zeros_like(delta))                     # dropped: nothing
        ids = plan.clients
        self.grad_prev.set(ids, self.grad_prev.get(ids) - alpha * delta, where=plan.participated)   # line 6
        self.h = self.h - alpha * delta.sum(0) / self.ctx.training_clients               # line 9
        if not bool(ok.any()):
            return torch.zeros_like(w)
        return self.weights(plan) @ delta - self.h / alpha                          # line 10 − w^t

    def state_dict(self):
        return {"h": self.h.clone(), **self.grad_prev.state_dict("grad_prev")}

    def load_state_dict(self, state):
        h = state["h"]
        if tuple(h.shape) != tuple(self.h.shape):
            raise ValueError(f"feddyn state has h {tuple(h.shape)}; this run needs {tuple(self.h.shape)}")
        self.grad_prev.load_state_dict(state, "grad_prev", "feddyn state grad_prev")
        self.h = h.to(self.ctx.device, self.ctx.dtype).clone()
