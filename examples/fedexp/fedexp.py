"""FedExP as a fedsweep plugin: one algorithm fedsweep does not ship, in one file.

Named in a sweep file's ``plugins: [fedexp.py]``, it is ``algorithm.name: fedexp`` (and a method of
``methods:``) like any built-in, through both engines, stragglers, packs, search, confirm runs and
reports. ``fedsweep check fedexp --plugins fedexp.py`` checks it against the algorithm contract.
"""
from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

import fedsweep


@fedsweep.register_algorithm
class FedExP(fedsweep.Algorithm):
    """FedExP (Jhunjhunwala, Wang and Joshi, "FedExP: Speeding Up Federated Averaging via Extrapolation",
    ICLR 2023, arXiv:2301.09604): FedAvg whose server step is extrapolated each round by how much the
    clients' updates agree.

    With q_i the aggregation weights of the clients that returned (0 for one that dropped out) and
    Δ_i = w_i − w^t:

        η_g^t = max(1, Σ q_i ‖Δ_i‖² / (2 (‖Σ q_i Δ_i‖² + ε))),    u = η_g^t Σ q_i Δ_i,

    and the server steps w ← w + server.lr · u (server.lr = 1 is FedExP's). This is the step size the
    authors' code computes (github.com/Divyansh03/FedExP, main.py: ``max(1, 0.5 * grad_norm_avg /
    (grad_avg_norm + S * epsilon))``, its gradients the negated Δ_i) with ε where it has M·ε (M the
    clients of a round), and without its decay of ε by 0.998² a round. The clients run FedAvg's local
    SGD, so the client code is FedAvg's (row-wise). The authors evaluate the average of the last two
    iterates; fedsweep evaluates w^t, as for every method. Each round logs η_g^t as ``fedexp/eta_g``."""
    name = "fedexp"
    metrics = ("fedexp/eta_g",)      # what round_metrics logs: a sweep may select on it

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        epsilon: float = Field(1e-3, gt=0, description="ε, which keeps η_g finite when the updates cancel "
                                                      "(the paper: 1e-3 on CIFAR, 0.1 on EMNIST).")

    def aggregate(self, w, uploads, plan):
        q = self.weights(plan)                               # (K,)
        delta = uploads["delta"]                             # (K, n)
        mean = q @ delta
        spread = q @ (delta * delta).sum(dim=1)              # Σ q_i ‖Δ_i‖²
        self.eta = torch.clamp(spread / (2 * (mean @ mean + self.params.epsilon)), min=1.0)
        return self.eta * mean

    def round_metrics(self, plan):
        return {"fedexp/eta_g": float(self.eta)}
