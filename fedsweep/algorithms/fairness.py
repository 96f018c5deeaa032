"""Fair resource allocation: q-FFL solved by q-FedAvg (Li, Sanjabi, Beirami, Smith, "Fair Resource
Allocation in Federated Learning", ICLR 2020, objective eq. 2, Algorithm 2).

q-FFL minimizes f_q(w) = Σ_k p_k F_k^{q+1}(w) / (q + 1): the larger q, the more weight on the clients
the model fits worst (q = 0 is FedAvg's objective), for a more uniform accuracy across clients.
q-FedAvg: each sampled client k evaluates F_k(w^t) on its data (``probe``), runs FedAvg's local SGD
to w̄_k (Δ_k = w̄_k − w^t, fedsweep's sign), and the server steps with the Lipschitz estimate L = 1/η_l:

    Δw_k = L (w^t − w̄_k) = −L Δ_k
    h_k  = q F_k^{q−1}(w^t) ‖Δw_k‖² + L F_k^q(w^t)
    w^{t+1} = w^t − Σ_k F_k^q(w^t) Δw_k / Σ_k h_k   →   u = L Σ_k F_k^q Δ_k / Σ_k h_k

so q = 0 gives u = mean Δ_k, FedAvg with uniform weights over the clients that returned (tested); the
server optimizer steps on u with η_g (η_g = 1 is the paper's rule). Choices: L is 1/η_l of the round,
as the paper sets it (``lipschitz`` overrides); F_k is the client's loss on all its data (``loss_batch:
full``, the paper's) or one fresh minibatch; the paper samples clients in proportion to their data and
averages uniformly, fedsweep samples as configured and ``algorithm.weighting`` is not read (the rule
above has no weights); a client that returned nothing counts in neither sum. Each round logs
``qffl/mean_Fq`` (mean F_k^q) and ``qffl/max_loss``, and clients.csv each client's F_k(w^t).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fedsweep.algorithms import register
from fedsweep.algorithms.base import Algorithm
from fedsweep.util.lazy import torch


class QFFLParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    q: float = Field(1.0, ge=0, description="q of q-FFL: 0 is FedAvg's objective; larger puts more weight on the "
                     "clients with the highest loss (the paper uses 0.001–15 by dataset; 1 and 5 on its vision tasks).")
    loss_batch: Literal["full", "minibatch"] = Field(
        "full", description="F_k(w^t) on all of the client's data (the paper's) or one fresh minibatch.")
    lipschitz: float | None = Field(
        None, gt=0, description="L of the server step; default 1/η_l of the round, as the paper sets it.")


@register
class QFedAvg(Algorithm):
    name = "qffl"
    Params = QFFLParams
    rowwise = True
    metrics = ("qffl/mean_Fq", "qffl/max_loss")

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.probe = params.loss_batch
        self._last: dict[str, torch.Tensor] = {}

    def client_init(self, w, shared, own, ops, probe):
        return {"w": w, "loss": ops.loss(w, probe)}                      # F_k(w^t)

    def client_final(self, state, w0, ops, probe):
        return {"delta": state["w"] - w0, "loss": state["loss"]}

    def aggregate(self, w, uploads, plan):
        q, delta = self.params.q, uploads["delta"]
        L = self.params.lipschitz or 1.0 / plan.lr
        ok = plan.participated.to(delta.device)
        F = uploads["loss"].to(delta.dtype).clamp(min=1e-12)
        Fq = torch.where(ok, F ** q, torch.zeros_like(F))
        h = L * Fq
        if q != 0:
            h = h + q * F ** (q - 1) * (L ** 2) * (delta ** 2).sum(1)            # q F^{q−1} ‖L Δ_k‖²
        h = torch.where(ok, h, torch.zeros_like(h))
        self._last = {"loss": F, "Fq": Fq, "ok": ok}
        if not bool(ok.any()):
            return torch.zeros_like(w)
        return L * (Fq @ delta) / h.sum()

    def round_metrics(self, plan):
        if not self._last or not bool(self._last["ok"].any()):
            return {}
        ok = self._last["ok"]
        return {"qffl/mean_Fq": float(self._last["Fq"][ok].mean()), "qffl/max_loss": float(self._last["loss"][ok].max())}

    def client_record(self, plan):
        return {"loss": self._last["loss"]} if self._last else {}
