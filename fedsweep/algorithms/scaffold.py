"""SCAFFOLD: stochastic controlled averaging (Karimireddy et al., ICML 2020, Alg. 1).

The server keeps a control variate c and one c_i per client (c_i = 0 and c = 0 before a client first
takes part; the c_i are rows of a :class:`~fedsweep.algorithms.client_rows.ClientRows`, allocated for
the clients that have taken part). With S the sampled clients, x = w^t
the server model, K_i = E_i the SGD steps client i actually takes and η_l the round's local lr:

    y_i ← x;  K_i times:  y_i ← y_i − η_l (g_i(y_i) − c_i + c)                  (Alg. 1 lines 8–10)
    option I:   c_i⁺ = ∇f_i(x)                 (the client's full-batch gradient at x; line 12)
    option II:  c_i⁺ = c_i − c + (x − y_i)/(K_i η_l) = c_i − c − Δ_i/(K_i η_l)    (eq. 4; line 12)
    Δ_i = y_i − x,   Δc_i = c_i⁺ − c_i,   c_i ← c_i⁺                          (line 13)
    x ← x + η_g Σ_S q_i Δ_i                                               (lines 16–17, q_i = 1/|S|)
    c ← c + (1/N) Σ_S Δc_i          (= c + (|S|/N) mean_S Δc_i, line 17)

Since every c_i starts at 0 and c moves by 1/N of the sum of the changes, c stays the mean of all N
c_i (tested); N is the federation's, the clients that train (``ctx.training_clients``: without the
ones ``eval.unseen_clients`` holds out). The update handed to the server optimizer is u = Σ q_i Δ_i, so server SGD with lr η_g
is line 17 exactly (η_g = 1 is FedAvg's server step; momentum/Adam act on u as for FedAvg).

Choices:

- ``option`` 2 (default) is the paper's recommended, cheaper variant; 1 spends one extra full-batch
  gradient per client at x (``probe = "full"``, counted as one gradient evaluation).
- **Stragglers**: K in option II is each client's actual step count E_i (``plan.steps``), not the
  nominal E, so c_i⁺ is the mean corrected gradient along the path the client really took. The
  widely used implementation in the FedDyn authors' repository
  (github.com/alpemreacar/FedDyn, ``utils_methods.train_SCAFFOLD``) uses a fixed ``n_minibatch`` and the
  *undecayed* learning rate in this division while training with the decayed one; we follow the
  paper: the steps taken and the round's η_l.
- **Where c_i⁺ is computed**: option II needs only c_i, c, Δ_i, E_i and η_l, all of which the server
  holds here (it keeps the c_i), so ``aggregate`` computes it; the arithmetic is line 12 unchanged.
  Communication is still counted as the paper's protocol: 2 models down (x, c) to every sampled
  client, 2 up (Δy_i, Δc_i) from every client that returns.
- **Dropped clients** (``heterogeneity.dropout``) return nothing: their c_i is left as it was and
  they add nothing to c; a client never sampled keeps c_i = 0.
- **Weights**: Δx uses the framework's q_i (uniform 1/|S| = the paper; ``weighting: data`` gives
  n_i/Σn over S). The c update is always the paper's unweighted 1/N sum. (The FedDyn repository
  instead rescales c by n_i-based weights; not done here.)
- **No gradient clipping**: the FedDyn repository clips the corrected gradient to norm 10; the
  paper does not, and neither do we.
- **FedLGA Table IV** lists "Scaffold: local variance control c = {5, 10, 20}". SCAFFOLD has no
  scalar hyper-parameter of that name — c is the server control variate, a state that is learned,
  not tuned — and FedLGA's text does not say what was swept (it does not fit η_g either, which the
  SCAFFOLD paper keeps at 1). We read that row as having no counterpart here; the tunable knobs are
  ``option``, ``server.lr`` (η_g), ``local.lr`` and ``local.steps``.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedsweep.algorithms import register
from fedsweep.algorithms.base import Algorithm
from fedsweep.algorithms.client_rows import ClientRows
from fedsweep.util.lazy import torch


class ScaffoldParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    option: Literal[1, 2] = Field(
        2, description="Control-variate update (Alg. 1 line 12): 1 = c_i⁺ is the client's full-batch "
        "gradient at w^t (+1 gradient pass per client); 2 = c_i − c − Δ_i/(E_i η_l), free (the paper's default).")


@register
class Scaffold(Algorithm):
    name = "scaffold"
    rowwise = True   # client_step and client_final are row-wise: run on all K clients stacked
    client_rows = 1  # c_i
    Params = ScaffoldParams
    upload_models = 2.0      # Δy_i and Δc_i
    download_models = 2.0    # x and c

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.probe = "full" if params.option == 1 else None
        self.c = torch.zeros(ctx.dim, device=ctx.device, dtype=ctx.dtype)
        self.c_i = ClientRows(ctx.num_clients, ctx.dim, ctx.device, ctx.dtype)

    # ----- server -> clients ------------------------------------------------------------------
    def broadcast(self, w, plan):
        return {"c": self.c}

    def client_state(self, plan):
        return {"c_i": self.c_i.get(plan.clients)}

    # ----- client -------------------------------------------------------------------------------
    def client_init(self, w, shared, own, ops, probe):
        return {"w": w, "corr": shared["c"] - own["c_i"]}                          # c − c_i, fixed all round

    def client_step(self, state, batch, ops, lr, shared):
        _, g = ops.grad(state["w"], batch)
        return {**state, "w": torch.add(state["w"], g + state["corr"], alpha=-lr)}  # line 10

    def client_final(self, state, w0, ops, probe):
        upload = {"delta": state["w"] - w0}
        if self.params.option == 1:
            upload["grad_x"] = ops.grad(w0, probe)[1]                               # ∇f_i(x), line 12 (I)
        return upload

    # ----- server -------------------------------------------------------------------------------
    def aggregate(self, w, uploads, plan):
        delta = uploads["delta"]
        ok = plan.participated.to(delta.device).unsqueeze(1)
        c_old = self.c_i.get(plan.clients)
        if self.params.option == 1:
            c_new = uploads["grad_x"]
        else:
            k_lr = (plan.steps.clamp(min=1).to(delta) * plan.lr).unsqueeze(1)       # K_i η_l
            c_new = c_old - self.c - delta / k_lr                                   # line 12 (II)
        dc = torch.where(ok, c_new - c_old, torch.zeros_like(c_new))               # dropped: no change
        u = self.weights(plan) @ delta                                              # Δx (line 16)
        self.c_i.set(plan.clients, c_old + dc, where=plan.participated)          # line 13 (dropped: as they were)
        self.c = self.c + dc.sum(0) / self.ctx.training_clients                          # line 17
        return u

    def state_dict(self):
        return {"c": self.c.clone(), **self.c_i.state_dict("c_i")}

    def load_state_dict(self, state):
        c = state["c"]
        if tuple(c.shape) != tuple(self.c.shape):
            raise ValueError(f"scaffold state has c {tuple(c.shape)}; this run needs {tuple(self.c.shape)}")
        self.c_i.load_state_dict(state, "c_i", "scaffold state c_i")
        self.c = c.to(self.ctx.device, self.ctx.dtype).clone()
