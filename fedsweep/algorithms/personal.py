"""Personalized FL: FedAvg+FT, Ditto, FedPer, FedRep and FedBN. Each keeps a personal model per client, which per-client
evaluation scores on the client's own data (``eval.clients``: ``personal/*``; docs/run.md).

**FedAvg+FT** (the fine-tuning baseline: Wang, Mathews, Kiddon, Eichner, Beaufays, Ramage, "Federated
Evaluation of On-device Personalization", 2019; pFL-Bench's FedAvg-FT, Chen et al., NeurIPS 2022 D&B).
FedAvg trains the global model; client k's personal model is it fine-tuned on the client's own data:

    v_k = w^t − η Σ_{s<S} ∇F_k(v_k,s; b_s)    (S = ``finetune_steps`` local SGD steps, η = ``finetune_lr``)

made at each evaluation (``Algorithm.personal_finetuning``), on the batches ``eval.finetune_steps``
draws, ``(seed, t, "finetune")``, so ``fedavg_ft``'s ``personal/*`` equals FedAvg's ``finetuned/*`` with
the same steps and lr (tested). As an algorithm of its own it is compared with the others on
``served/*`` in a sweep; ``eval.finetune_steps`` fine-tunes every method's global model alike.

**Ditto** (Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through Personalization",
ICML 2021, Algorithm 1, objective eq. 2). Client k's personal model v_k minimizes
h_k(v; w*) = F_k(v) + (λ/2)‖v − w*‖². Each sampled client trains the global model as FedAvg does and,
on the same minibatches, its personal model:

    w_k ← w_k − η_l ∇F_k(w_k; b)                         (UPDATE_GLOBAL: FedAvg's local SGD, from w^t)
    v_k ← v_k − η_l (∇F_k(v_k; b) + λ (v_k − w^t))      (Alg. 1 line 8, s = E_i steps)
    w^{t+1} = w^t + η_g Σ q_k Δ_k                        (AGGREGATE, Δ_k = w_k − w^t)

λ = 0 makes v_k local training of the client's own model; the global model is FedAvg's for every λ
(tested). Choices: the personal steps s are the client's own E_i on the same minibatches (Algorithm 1
leaves s free; one data pass serves both); v_k starts as w^t at the client's first round (the
authors' code copies the initial global model into every personal one: a client's personal model
then starts where the federation is when it joins); a client never sampled has none, and its personal
model is the global w^t. v_k stays on the client: one model up, one down, two gradient passes a step.

**FedPer** (Arivazhagan, Aggarwal, Singh, Choudhary, "Federated Learning with Personalization Layers",
2019, Algorithm 1). The last ``head_layers`` layers holding parameters are the personalization layers
W_P,k, kept per client; the base layers W_B are federated:

    (W_B, W_P,k) ← E_i steps of SGD on F_k from (W_B^t, W_P,k)           (all layers train)
    W_B^{t+1} = W_B^t + η_g Σ q_k (W_B,k − W_B^t);   W_P,k kept by client k

The global vector's head entries never move (u is 0 there): the global model is the base with the
initial head, and a client's personal model is the base with its own head (the initial one before its
first round). Uploads and downloads count the whole model (the split is the algorithm's, the
accounting the framework's convention).

**FedRep** (Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations for
Personalized Federated Learning", ICML 2021, Algorithm 1). As FedPer, but a client first trains its
head with the body frozen, then the body with its new head frozen:

    τ_h = min(``head_steps``, E_i) steps on the head only; then E_i − τ_h steps on the body only
    W_B^{t+1} = W_B^t + η_g Σ q_k (W_B,k − W_B^t);   h_k kept by client k

(the paper's τ_h head epochs and τ body epochs, in fedsweep's local steps: a straggler that stops
early shortens the body phase first). ``head_steps: 0`` trains the body alone with the heads fixed.

**FedBN** (Li, Jiang, Zhang, Kamp, Dou, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR 2021, Algorithm 1). Each client keeps its BatchNorm layers: their parameters
(γ, β) and their running statistics (μ, σ²); everything else is FedAvg's:

    w_k ← E_i steps of SGD on F_k from (W^t without BN, its own BN layers)     (all layers train)
    W^{t+1} = W^t + η_g Σ q_k (W_k − W^t)  over the non-BN entries;   BN_k kept by client k

The BN entries of w are those of the model's BatchNorm layers (``ctx.batchnorm``); the statistics, not in
w, are the model's buffers, which each client keeps a copy of (``local_buffers``: the loop engine trains
it on its copy, per-client evaluation scores its personal model with it). A client's personal model is
the global non-BN layers with its own BN layers (the initial ones and the initial statistics before
its first round); the global model keeps the initial BN layers and statistics: read the personal
models (``served/*``). A model without BatchNorm is refused (``model.options.batchnorm: true`` gives
the MLP and the CNN one after each hidden layer, as FedBN's models have).
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from fedsweep.algorithms import register
from fedsweep.algorithms.base import Algorithm
from fedsweep.algorithms.client_rows import ClientRows
from fedsweep.util.errors import ConfigError
from fedsweep.util.lazy import torch


class FedAvgFTParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    finetune_steps: int = Field(10, ge=1, description="S: local SGD steps that fine-tune the global model on a "
                                "client's data into its personal model, at each evaluation.")
    finetune_lr: float | None = Field(None, gt=0, description="η of the fine-tuning steps; default `local.lr`.")


@register
class FedAvgFT(Algorithm):
    """FedAvg's training; the personal models are the global one fine-tuned per client (module docstring)."""
    name = "fedavg_ft"
    Params = FedAvgFTParams

    def personal_finetuning(self):
        return self.params.finetune_steps, self.params.finetune_lr


class DittoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lam: float = Field(0.1, ge=0, description="λ of Ditto's personal objective F_k(v) + (λ/2)‖v − w‖²: 0 trains "
                       "each personal model alone, larger keeps it nearer the global model (the paper tunes "
                       "λ ∈ {0.05, 0.1, 0.2, 0.5, 1, 2}).")


@register
class Ditto(Algorithm):
    name = "ditto"
    Params = DittoParams
    rowwise = True      # row-wise: every step is per-row arithmetic on (K, n)
    client_rows = 1     # v_k
    grads_per_step = 2

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.v = ClientRows(ctx.num_clients, ctx.dim, ctx.device, ctx.dtype)

    def client_state(self, plan):
        held = self.v.held(plan.clients).to(self.ctx.device).unsqueeze(1)
        return {"v": self.v.get(plan.clients), "has_v": held.to(self.ctx.dtype)}

    def client_init(self, w, shared, own, ops, probe):
        v = own["has_v"] * own["v"] + (1 - own["has_v"]) * w          # first round: v_k starts at w^t
        return {"w": w, "v": v, "w0": w}

    def client_step(self, state, batch, ops, lr, shared):
        _, g = ops.grad(state["w"], batch)
        _, g_v = ops.grad(state["v"], batch)
        v = state["v"] - lr * (g_v + self.params.lam * (state["v"] - state["w0"]))
        return {**state, "w": torch.add(state["w"], g, alpha=-lr), "v": v}

    def client_final(self, state, w0, ops, probe):
        return {"delta": state["w"] - w0, "v": state["v"]}

    def aggregate(self, w, uploads, plan):
        self.v.set(plan.clients, uploads["v"], where=plan.participated)
        return self.weights(plan) @ uploads["delta"]

    def personal_models(self, w, clients):
        held = self.v.held(clients).to(w.device).unsqueeze(1)
        return torch.where(held, self.v.get(clients), w)

    def state_dict(self):
        return self.v.state_dict("v")

    def load_state_dict(self, state):
        self.v.load_state_dict(state, "v", "ditto state v")


class FedPerParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    head_layers: int = Field(1, ge=1, description="The last this many layers holding parameters are each "
                             "client's own (the personalization layers); the others are federated.")


def last_layers(ctx, layers: int, key: str) -> "torch.Tensor":
    """bool (n,): the entries of w that are the last ``layers`` parameter-holding layers (``ctx.layout``),
    for an algorithm that splits the model there (``key`` names its option in the one-line error when
    they leave no layer before them)."""
    owners = list(dict.fromkeys(name.rpartition(".")[0] for name, _, _ in ctx.layout))
    if not ctx.layout or layers >= len(owners):
        raise ConfigError(f"algorithm.{key}: the last {layers} layer(s) leave none before them; the model has "
                          f"{len(owners)} layer(s) with parameters ({', '.join(owners) or 'none named'}); "
                          f"allowed 1..{max(len(owners) - 1, 1)}")
    head = set(owners[-layers:])
    mask = torch.zeros(ctx.dim, dtype=torch.bool, device=ctx.device)
    for name, start, stop in ctx.layout:
        if name.rpartition(".")[0] in head:
            mask[start:stop] = True
    return mask


def batchnorm_entries(ctx) -> "torch.Tensor":
    """bool (n,): the entries of w that are the parameters of the model's BatchNorm layers (FedBN's local
    ones); a model without any: one line naming the fix."""
    if not ctx.batchnorm:
        raise ConfigError("algorithm.name: fedbn keeps each client's BatchNorm layers, and the model has none; set "
                          "model.options.batchnorm: true (mlp, cnn), or use a model with BatchNorm layers")
    mask = torch.zeros(ctx.dim, dtype=torch.bool, device=ctx.device)
    for name, start, stop in ctx.layout:
        if name.rpartition(".")[0] in ctx.batchnorm:
            mask[start:stop] = True
    return mask


class _PersonalHead(Algorithm):
    """FedPer's, FedRep's and FedBN's shared part: some entries of w per client (the head), the rest federated."""
    rowwise = True
    client_rows = 1     # h_k (the head's entries only)

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.head = self.own_entries(params, ctx)
        self.heads = ClientRows(ctx.num_clients, int(self.head.sum()), ctx.device, ctx.dtype)

    def own_entries(self, params, ctx) -> "torch.Tensor":
        """bool (n,): the entries each client keeps (FedPer's and FedRep's: the last ``head_layers`` layers)."""
        return last_layers(ctx, params.head_layers, "head_layers")

    def own_heads(self, clients) -> "torch.Tensor":
        """(M, n): each client's head in the head's entries, 0 elsewhere and for a client without one yet."""
        rows = torch.zeros(clients.numel(), self.ctx.dim, device=self.ctx.device, dtype=self.ctx.dtype)
        rows[:, self.head] = self.heads.get(clients)
        return rows

    def mine(self, clients) -> "torch.Tensor":
        """(M, n) bool: the entries that are a client's own (its head, once it has one)."""
        return self.head & self.heads.held(clients).to(self.ctx.device).unsqueeze(1)

    def client_state(self, plan):
        return {"head": self.own_heads(plan.clients), "mine": self.mine(plan.clients)}

    def client_init(self, w, shared, own, ops, probe):
        return {"w": torch.where(own["mine"], own["head"], w)}     # the body of w^t under its own head

    def client_final(self, state, w0, ops, probe):
        return {"delta": state["w"] - w0}   # the head's entries: h_k − w^t's head, kept, not averaged

    def aggregate(self, w, uploads, plan):
        delta = uploads["delta"]
        self.heads.set(plan.clients, (w + delta)[:, self.head], where=plan.participated)
        return self.weights(plan) @ torch.where(self.head, 0.0, delta)      # W_B only

    def personal_models(self, w, clients):
        return torch.where(self.mine(clients), self.own_heads(clients), w)

    def state_dict(self):
        return self.heads.state_dict("heads")

    def load_state_dict(self, state):
        self.heads.load_state_dict(state, "heads", f"{self.name} state heads")


@register
class FedPer(_PersonalHead):
    """Every layer trains locally (FedAvg's client step); the head stays with the client."""
    name = "fedper"
    Params = FedPerParams


class FedRepParams(FedPerParams):
    head_steps: int = Field(5, ge=0, description="τ_h: local steps on the head (body frozen) before the body "
                            "steps (head frozen); the rest of a client's E_i steps train the body.")


@register
class FedRep(_PersonalHead):
    name = "fedrep"
    Params = FedRepParams
    rowwise = True

    def client_init(self, w, shared, own, ops, probe):
        return {**super().client_init(w, shared, own, ops, probe), "step": torch.zeros_like(w[..., :1])}

    def client_step(self, state, batch, ops, lr, shared):
        _, g = ops.grad(state["w"], batch)
        on_head = state["step"] < self.params.head_steps                   # (…, 1): this step's phase
        moves = torch.where(on_head, self.head, ~self.head)
        return {"w": state["w"] - lr * torch.where(moves, g, 0.0), "step": state["step"] + 1}


@register
class FedBN(_PersonalHead):
    """Every layer trains locally (FedAvg's client step); the BatchNorm layers and their statistics stay
    with the client."""
    name = "fedbn"
    local_buffers = True

    def own_entries(self, params, ctx):
        return batchnorm_entries(ctx)
