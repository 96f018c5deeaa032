"""FedLGA: local gradient approximation on the server (Li, Qu, Tang, Lu, "FedLGA: Toward System-Heterogeneity
of Federated Learning via Local Gradient Approximation", IEEE Transactions on Cybernetics, 2023).

Stragglers (τ_i > 1) return Δ_i = w_i − w^t after only E_i < E steps. The server approximates the
update Δ_{i,E} they would have made with E steps from a first-order Taylor expansion (eq. 4–5) at
their model w_i = w^t + Δ_i, towards the estimate of where they would have ended,

    ŵ = w^t + (1/K_2) Σ_{j ∈ K_2} Δ_j                                       (Alg. 2 line 8)

(K_2: the sampled clients that completed E), with the Hessian replaced by the outer product of the
client gradient, H_i ≈ G_i = g_i g_iᵀ (eq. 6, the empirical Fisher), so every correction costs O(n):
no n×n matrix is ever formed. Then (eq. 7; Alg. 2 line 15)

    w^{t+1} = w^t + η_g (1/K) (Σ_{K_1} Δ̂_i + Σ_{K_2} Δ_i).

Eq. (4)–(5) as printed add a Hessian-vector product (a change of gradient) to a model displacement,
so they cannot be used literally; ``reading`` picks how they are read:

- ``projection`` (eq. 5 as printed):      Δ̂_i = Δ_i + G_i (ŵ − w_i).
  Units do not match (a gradient change is added to a displacement).
- ``continuation`` (the text around eq. 4: g is "the averaged gradient between epoch E_i and E"):
  the server makes the straggler's m_i missing steps itself, with the Taylor-corrected gradient
  at ŵ,
      ḡ_i = g_i + G_i (ŵ − w_i),        Δ̂_i = Δ_i − η_l m_i ḡ_i.
  Eq. (4) read as the expansion of the gradient ∇F_i(w_{i,E}) ≈ ∇F_i(w_i) + H_i (w_{i,E} − w_i).
- ``extrapolation``: the continuation without the Hessian term, Δ̂_i = Δ_i − η_l m_i g_i; with the
  ``mean`` gradient this is linear extrapolation, Δ̂_i = Δ_i (E_i + m_i)/E_i.

The default reading, ``extrapolation`` (with ``mean``), was chosen by the rule stated in
sweeps/fedlga_safeguards.yaml before its runs (docs/results.md): no divergence at any learning rate
where FedAvg converges, on digits and on real MNIST images (mnist_5k), then the lowest mean rounds to
target, ties to the simpler variant. ``continuation`` with λ = 0, which sweeps/fedlga_readings.yaml
ranks first on digits alone at η_l ≤ 0.1, diverged where FedAvg did not at 35 of the study's grid
points: its Hessian term grows with η_l m_i ‖g_i‖², which reaches 20 on MNIST's larger gradients in
the first round (docs/results/fedlga_divergence.py). ``damping: step`` bounds it.

m_i are the SGD steps the straggler did not take: E − E_i with ``local.unit: steps``, and
(E − E_i) passes of ceil(n_i/B) steps with ``local.unit: epochs``.

Choices the paper leaves open, exposed as options:

- ``grad_source`` — which g_i the server uses. ``mean`` (default): the average gradient over the
  client's completed steps, g_i = −Δ_i / (η_l s_i) with s_i its steps, recovered on the server for
  free (no extra upload). ``last``: the gradient of the client's last local step (+1 vector uploaded
  by each straggler). ``exact``: a fresh mini-batch gradient at w_i, the quantity eq. 6 names
  literally (+1 gradient pass and +1 upload per straggler).
- ``damping`` λ ≥ 0 (default 0) — G_i v = g_i (g_iᵀv) / (1 + λ‖g_i‖²). λ = 0 is the paper. For λ > 0 this is the
  Sherman–Morrison-damped step: bounded when ‖g‖ is large (it tends to the projection of v on g
  scaled by 1/λ), which keeps early, large-gradient rounds stable. ``step`` sets λ_i = η_l m_i, so
  the continuation's Hessian displacement η_l m_i G_i v = [a/(1+a)] ĝ ĝᵀ v (a = η_l m_i ‖g_i‖²) never
  exceeds the projection of ŵ − w_i on g_i: a trust region with nothing to choose.
- ``fallback`` when every sampled client is a straggler (K_2 empty, ŵ undefined): ``fedavg``
  (default) aggregates the uncorrected Δ_i, exactly FedAvg for that round; ``extrapolate`` uses
  ŵ = w^t + mean_i Δ_i E / E_i, each straggler's mean rate continued to E. ``extrapolation``
  needs no ŵ and always corrects.

Sign convention: the paper writes Δ as old − new in places; here Δ is always new − old
(docs/design.md §3), and with ρ = 0 (no stragglers) every reading is exactly FedAvg.
Aggregation weights q_i replace 1/K when ``algorithm.weighting: data``.
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fedsweep.algorithms import register
from fedsweep.algorithms.base import Algorithm
from fedsweep.util.lazy import torch


class FedLGAParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reading: Literal["projection", "continuation", "extrapolation"] = Field(
        "extrapolation", description="How eq. (4)–(5) are read: `projection` Δ_i + G_i(ŵ − w_i) (eq. 5 as "
        "printed); `continuation` Δ_i − η_l m_i (g_i + G_i(ŵ − w_i)), the m_i missing steps taken with the "
        "Taylor-corrected gradient (the text's 'averaged gradient between epoch E_i and E'); "
        "`extrapolation` Δ_i − η_l m_i g_i (no Hessian term).")
    grad_source: Literal["mean", "last", "exact"] = Field(
        "mean", description="g_i for the rank-1 Hessian: `mean` −Δ_i/(η_l E_i) (free), `last` last local "
        "gradient (+1 upload), `exact` fresh gradient at w_i (+1 pass, +1 upload).")
    damping: float | Literal["step"] = Field(
        0.0, description="λ ≥ 0: G_i v = g(gᵀv)/(1+λ‖g‖²); 0 is eq. (6) literally. `step`: λ_i = η_l m_i, the "
        "length of the straggler's missing steps, so that the Hessian term never moves the model further "
        "along g_i than ŵ lies, however large ‖g_i‖ (a trust region).")

    @field_validator("damping", mode="before")
    @classmethod
    def _number_or_step(cls, v):
        """One error naming the key and what it allows (a union would name each of its branches)."""
        if v == "step":
            return v
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ValueError("allowed: a number ≥ 0, or 'step'") from None
        if not math.isfinite(x):
            raise ValueError("Input should be a finite number")
        if x < 0:
            raise ValueError("allowed: a number ≥ 0, or 'step'")
        return x
    fallback: Literal["fedavg", "extrapolate"] = Field(
        "fedavg", description="When no sampled client completed E: `fedavg` (no correction) or "
        "`extrapolate` (ŵ = w^t + mean Δ_i·E/E_i).")


@register
class FedLGA(Algorithm):
    name = "fedlga"
    rowwise = True   # client_step and client_final are row-wise: run on all K clients stacked
    Params = FedLGAParams

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.probe = "minibatch" if params.grad_source == "exact" else None

    def client_step(self, state, batch, ops, lr, shared):
        _, g = ops.grad(state["w"], batch)
        new = {**state, "w": torch.add(state["w"], g, alpha=-lr)}
        if self.params.grad_source == "last":
            new["g_last"] = g
        return new

    def client_init(self, w, shared, own, ops, probe):
        state = {"w": w}
        if self.params.grad_source == "last":
            state["g_last"] = torch.zeros_like(w)
        return state

    def client_final(self, state, w0, ops, probe):
        upload = {"delta": state["w"] - w0}
        if self.params.grad_source == "last":
            upload["grad"] = state["g_last"]
        elif self.params.grad_source == "exact":
            upload["grad"] = ops.grad(state["w"], probe)[1]
        return upload

    # ----- server -----------------------------------------------------------------------------
    def client_gradients(self, uploads, plan, rows: torch.Tensor) -> torch.Tensor:
        """g_i per ``grad_source`` of the clients at positions ``rows`` (len(rows), n)."""
        if self.params.grad_source == "mean":
            steps = plan.steps.clamp(min=1).to(uploads["delta"])[rows]
            return -uploads["delta"][rows] / (plan.lr * steps).unsqueeze(1)
        return uploads["grad"][rows]

    def compensated(self, w, uploads, plan) -> torch.Tensor:
        """Δ̂ (K, n): Δ_i for clients that completed E, the ``reading`` of eq. (4)–(6) for stragglers.

        Only the stragglers' rows change, so the reading is computed on their rows alone and written
        into a copy of Δ. Every step is row by row, so the numbers are those of computing it on all K
        rows and keeping the stragglers' (bit for bit); the server step of a sweeps/fedlga.yaml round
        took ~1.7 ms that way, on (K, n) tensors, with half the clients straggling (2 CPU cores)."""
        delta = uploads["delta"]
        slow = plan.stragglers.to(delta.device)
        if not bool(slow.any()):
            return delta
        rows = slow.nonzero().squeeze(1)
        d, g = delta[rows], self.client_gradients(uploads, plan, rows)                # Δ_i, g_i of K_1
        reading = self.params.reading
        if reading == "extrapolation":
            return delta.index_copy(0, rows, d - self.missing_step_size(plan, delta)[rows] * g)
        full = (plan.participated & ~plan.stragglers).to(delta.device)
        if bool(full.any()):
            w_hat = w + delta[full].mean(0)                                         # Alg. 2 line 8
        elif self.params.fallback == "extrapolate":
            scale = (plan.expected_work / plan.work.clamp(min=1)).to(delta)
            w_hat = w + (d * scale[rows].unsqueeze(1)).mean(0)                     # the stragglers' rows only
        else:
            return delta
        v = w_hat - (w + d)                                                         # ŵ − w_i
        step = self.missing_step_size(plan, delta)[rows]                            # η_l m_i
        coef = (g * v).sum(1) / (1.0 + self.damping_for(step.squeeze(1), (g * g).sum(1)))   # gᵀv / (1+λ‖g‖²)
        hv = coef.unsqueeze(1) * g                                                  # G_i (ŵ − w_i), eq. (6)
        if reading == "projection":
            corrected = d + hv                                                      # eq. (5) as printed
        else:                                                                       # continuation
            corrected = d - step * (g + hv)
        return delta.index_copy(0, rows, corrected)

    def damping_for(self, step: torch.Tensor, gg: torch.Tensor) -> torch.Tensor | float:
        """λ_i ‖g_i‖², the damping of G_i's denominator: λ given, or λ_i = η_l m_i (``step``)."""
        lam = self.params.damping
        return step * gg if lam == "step" else lam * gg

    @staticmethod
    def missing_step_size(plan, like: torch.Tensor) -> torch.Tensor:
        """η_l m_i (K, 1): the learning rate times the SGD steps each client did not take."""
        return (plan.lr * plan.missing_steps.to(like)).unsqueeze(1)

    def aggregate(self, w, uploads, plan):
        return self.weights(plan) @ self.compensated(w, uploads, plan)             # eq. (7)

    # ----- accounting ---------------------------------------------------------------------------
    def communication(self, plan):
        up, down = super().communication(plan)
        if self.params.grad_source != "mean":
            up += int(plan.stragglers.sum())
        return up, down

    def compute(self, plan):
        # In the protocol only stragglers (which know τ_i > 1) take the extra pass; the vectorized
        # engine computes it for every client and discards the rest, which does not change results.
        extra = int(plan.stragglers.sum()) if self.params.grad_source == "exact" else 0
        return float(int(plan.steps.sum()) + extra)
