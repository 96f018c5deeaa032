"""Hybrid FL with server data: Server-only, CLG-SGD, FedCLG-C, FedCLG-S, SCAFFOLD+
(the FedCLG paper: Bian et al., "Accelerating Hybrid Federated Learning Convergence Under Partial
Participation", IEEE Transactions on Signal Processing, 2024; Sec. III–IV, Algorithm 1).

The server holds D_s^t (m_s samples, ``server_data``; ``plan.server``). After the clients' update is
aggregated it trains on it for E_s steps with lr γ (eq. 5):

    x_{t+1,e+1} = x_{t+1,e} − γ ∇f_s(x_{t+1,e}; ζ_s),   e = 0..E_s−1

- ``server_only``  no clients at all; only eq. 5 (the paper's Server-only baseline).
- ``clg_sgd``      FedAvg aggregation (eq. 4) then eq. 5. With no server data or E_s = 0 it is FedAvg.
- ``fedclg_c``     the server sends g_s = ∇f_s(x_t) with x_t; each client corrects every local step
                   with c_i = g_s − g_i, g_i = ∇f_i(x_t) (eq. 10); then eq. 4 and eq. 5. One extra vector down.
- ``fedclg_s``     clients train as FedAvg and upload Δ_i and g_i; the server aggregates
                   x = x_t + η_g mean(Δ_i − E_i η_l (g_s − g_i)) (eq. 11, with each client's actual E_i
                   under stragglers), then eq. 5. One extra vector up.
- ``scaffold_plus`` SCAFFOLD (``scaffold.py``) followed by eq. 5.

``algorithm.gradient_batch``: g_s and g_i on one minibatch (default; ζ_s, ζ_i of the paper) or on all
of D_s^t / the client's data (``full``); the paper allows both. The server's E_s steps are minibatch
steps of ``server_data.batch_size`` (the paper's "epochs" read as steps, like the clients' E;
docs/design.md §2.5).
Aggregation weights q_i replace the paper's 1/M under ``algorithm.weighting: data``.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedsweep.algorithms import register
from fedsweep.algorithms.base import Algorithm, NoParams
from fedsweep.algorithms.scaffold import Scaffold
from fedsweep.util.lazy import torch


class GradientBatchParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gradient_batch: Literal["minibatch", "full"] = Field(
        "minibatch", description="g_s and g_i at x_t: on one minibatch (ζ_s, ζ_i) or on the full server/client data.")


def server_steps(w: torch.Tensor, plan, ops) -> torch.Tensor | None:
    """FedCLG eq. (5): E_s SGD steps of lr γ_t on the server's minibatches; None without server data."""
    if plan.server is None or not plan.server.batches:
        return None
    for batch in plan.server.batches:
        _, g = ops.grad(w, batch)
        w = torch.add(w, g, alpha=-plan.server.lr)
    return w


def server_gradient(w: torch.Tensor, plan, ops, kind: str) -> torch.Tensor:
    """g_s = ∇f_s(x_t) on ζ_s or on all of D_s^t."""
    return ops.grad(w, plan.server.full if kind == "full" else plan.server.minibatch)[1]


class _ServerTraining(Algorithm):
    """Every hybrid algorithm ends the round with the server's local training (eq. 5)."""

    def server_train(self, w, plan, ops):
        return server_steps(w, plan, ops)


@register
class ServerOnly(_ServerTraining):
    name = "server_only"
    Params = NoParams
    needs_server_data = True
    uses_clients = False

    def aggregate(self, w, uploads, plan):
        return torch.zeros_like(w)

    def communication(self, plan):
        return 0.0, 0.0

    def compute(self, plan):
        return 0.0


@register
class ClgSgd(_ServerTraining):
    name = "clg_sgd"
    Params = NoParams


@register
class FedClgC(_ServerTraining):
    name = "fedclg_c"
    rowwise = True   # client_step and client_final are row-wise: run on all K clients stacked
    Params = GradientBatchParams
    needs_server_data = True
    download_models = 2.0        # x_t and g_s

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.probe = "full" if params.gradient_batch == "full" else "minibatch"

    def broadcast(self, w, plan):
        return {"g_s": server_gradient(w, plan, self.ctx.ops, self.params.gradient_batch)}

    def client_init(self, w, shared, own, ops, probe):
        _, g_i = ops.grad(w, probe)                                        # g_t^i at x_t
        return {"w": w, "corr": shared["g_s"] - g_i}                       # c_i = g_s − g_i (eq. 10)

    def client_step(self, state, batch, ops, lr, shared):
        _, g = ops.grad(state["w"], batch)
        return {**state, "w": torch.add(state["w"], g + state["corr"], alpha=-lr)}   # eq. (10)


@register
class FedClgS(_ServerTraining):
    name = "fedclg_s"
    Params = GradientBatchParams
    rowwise = True   # client_step and client_final are row-wise: run on all K clients stacked
    needs_server_data = True
    upload_models = 2.0          # Δ_i and g_i

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.probe = "full" if params.gradient_batch == "full" else "minibatch"

    def client_final(self, state, w0, ops, probe):
        return {"delta": state["w"] - w0, "g_i": ops.grad(w0, probe)[1]}  # g_t^i at x_t

    def aggregate(self, w, uploads, plan):
        g_s = server_gradient(w, plan, self.ctx.ops, self.params.gradient_batch)
        e_lr = (plan.steps.to(uploads["delta"]) * plan.lr).unsqueeze(1)   # E_i η_l, actual steps
        corrected = uploads["delta"] - e_lr * (g_s - uploads["g_i"])       # eq. (11)
        return self.weights(plan) @ corrected


@register
class ScaffoldPlus(Scaffold):
    """SCAFFOLD (Karimireddy et al. 2020) followed by the server's local training (FedCLG eq. 5)."""
    name = "scaffold_plus"
    needs_server_data = True

    def server_train(self, w, plan, ops):
        return server_steps(w, plan, ops)
