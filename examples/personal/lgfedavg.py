"""LG-FedAvg (Liang et al., "Think Locally, Act Globally: Federated Learning with Local and Global
Representations", 2020, Algorithm 1) as a plugin: each client keeps its own representation (every layer
but the last ``global_layers``) and the federation averages the head on top. FedPer, which fedsweep
ships, is the other way round.

    (b_k, W_G) ← E_i steps of SGD on F_k from (b_k, W_G^t)      (all layers train)
    W_G^{t+1} = W_G^t + η_g Σ q_k (W_G,k − W_G^t);   b_k kept by client k

Per-client evaluation (``eval.clients``) scores each client's personal model, its own body under the
global head (``personal_models``); the global vector keeps the initial body, which no client trains.
A client's body starts as the global (initial) one at its first round.
"""
from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

import fedsweep
from fedsweep.algorithms.client_rows import ClientRows
from fedsweep.algorithms.personal import last_layers


class LGParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    global_layers: int = Field(1, ge=1, description="The last this many layers with parameters are federated; "
                               "the others are each client's own.")


@fedsweep.register_algorithm
class LGFedAvg(fedsweep.Algorithm):
    name = "lgfedavg"
    Params = LGParams
    rowwise = True        # client_init/client_final below are row-wise
    client_rows = 1       # b_k: a client's body

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.local = ~last_layers(ctx, params.global_layers, "global_layers")   # the body: all but the head
        self.bodies = ClientRows(ctx.num_clients, int(self.local.sum()), ctx.device, ctx.dtype)

    def _own(self, clients):
        """(M, n) each client's body in the local entries (0 elsewhere), and (M, n) where it applies."""
        rows = torch.zeros(clients.numel(), self.ctx.dim, device=self.ctx.device, dtype=self.ctx.dtype)
        rows[:, self.local] = self.bodies.get(clients)
        return rows, self.local & self.bodies.held(clients).to(self.ctx.device).unsqueeze(1)

    def client_state(self, plan):
        body, mine = self._own(plan.clients)
        return {"body": body, "mine": mine}

    def client_init(self, w, shared, own, ops, probe):
        return {"w": torch.where(own["mine"], own["body"], w)}

    def client_final(self, state, w0, ops, probe):
        return {"delta": state["w"] - w0}

    def aggregate(self, w, uploads, plan):
        delta = uploads["delta"]
        self.bodies.set(plan.clients, (w + delta)[:, self.local], where=plan.participated)
        return self.weights(plan) @ torch.where(self.local, 0.0, delta)     # the global head only

    def personal_models(self, w, clients):
        body, mine = self._own(clients)
        return torch.where(mine, body, w)

    def state_dict(self):
        return self.bodies.state_dict("bodies")

    def load_state_dict(self, state):
        self.bodies.load_state_dict(state, "bodies", "lgfedavg state bodies")
