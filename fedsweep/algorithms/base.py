"""The algorithm interface: one object per algorithm, flat parameter vectors, pure client functions.

Shaped after FedJAX's ``for_each_client`` split and Flower's strategies (docs/design.md §1.4, §5.1):

client side — three pure tensor functions of ONE client, which an engine runs in a Python loop
(``engine/loop.py``) or for all K sampled clients at once under ``torch.func.vmap``
(``engine/vectorized.py``; the ``client_step`` and ``client_final`` of an algorithm declared
``rowwise`` may also be called on all K stacked clients directly). They must avoid data-dependent
Python control flow:

    client_init(w, shared, own, ops, probe)       -> local state (dict of tensors; must hold "w")
    client_step(state, batch, ops, lr, shared)    -> local state     (one local SGD step)
    client_final(state, w0, ops, probe)           -> upload (dict of tensors; "delta" = w_final − w^t)

server side — plain code over the K stacked uploads:

    broadcast(w, plan)         -> shared tensors every sampled client downloads (SCAFFOLD's c, FedCM's d̄)
    client_state(plan)         -> rows of per-client state the server keeps for all N (SCAFFOLD's c_i)
    aggregate(w, uploads, plan)-> update u; the server optimizer (the Lightning optimizer, lr η_g)
                                  then steps with pseudo-gradient −u, so SGD gives w ← w + η_g u
    server_train(w, plan, ops) -> optional server-side training after the step (hybrid FL), on
                                  ``plan.server`` (a :class:`ServerRound`: the round's D_s^t, its
                                  E_s minibatches and γ_t) with server-side ``ops`` (``ctx.ops``)
    round_metrics(plan)        -> extra per-round scalars for the metric history (FedSoftMax's weights/*)
    client_record(plan)        -> per-client values of this round, (K,) each, kept in clients.csv
                                  (FedSoftMax's α_i and p_i); {} keeps nothing
    personal_models(w, clients)-> each given client's personal model (M, n) for per-client evaluation
                                  (``eval.clients``: personal/*); None (the default): it has none
    personal_finetuning()      -> (steps, lr or None): a client's personal model is the global one
                                  fine-tuned on its data (FedAvg+FT); None (the default): not so
    state_dict/load_state_dict -> everything above that persists, so checkpoints resume exactly
    communication(plan)        -> model-size units uploaded and downloaded this round
    compute(plan)              -> gradient evaluations spent on clients this round

``ops`` gives the model as functions of a flat vector: ``ops.grad(w, batch) -> (loss, g)``,
``ops.loss(w, batch) -> loss``, ``ops.logits(w, batch) -> (B, C)`` and ``ops.accuracy(w, batch)``, where ``batch = (x, y, weight)`` (``(x, y, weight, key)`` for a model with
dropout: the key of its masks; pass batches to ``ops`` whole) with per-sample weights that sum
to 1 over the real samples (0 on padding), so the loss is the mean cross-entropy of the batch. Extra gradient passes (FedSAM), a gradient at w^t before training (FedCLG, MimeLite:
``probe`` holds a batch of the client's data, declared by ``probe``) and each client's loss at w^t
(FedSoftMax) are all expressed through ``ops`` and ``probe``. Step masks for heterogeneity live in
the engine: a client whose steps are done keeps its state unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from fedsweep.algorithms.client_rows import ClientRows
from fedsweep.config.registry import algorithm_base
from fedsweep.sim.heterogeneity import RoundPlan
from fedsweep.util.lazy import torch

if TYPE_CHECKING:
    from torch import Tensor
Batch = tuple["Tensor", "Tensor", "Tensor"]   # x (B, ...), y (B,), weight (B,) summing to 1


@dataclass
class ModelOps:
    """The model as functions of a flat parameter vector (what client functions may call): ``grad`` and
    ``loss`` of a batch; ``logits(w, batch)``, the model's outputs (B, C) on the batch's inputs (in the
    mode the hook runs in: training for client hooks, its dropout masks the batch's key), and from them
    :meth:`accuracy`."""
    grad: Callable[[Tensor, Batch], tuple[Tensor, Tensor]]
    loss: Callable[[Tensor, Batch], Tensor]
    logits: Callable[[Tensor, Batch], Tensor] | None = None

    def accuracy(self, w: Tensor, batch: Batch) -> Tensor:
        """The weighted share of the batch's samples the model at ``w`` gets right: Σ weight_j · [argmax = y_j]
        (the batch's accuracy; padding weighs 0)."""
        x, y, weight, *_ = batch
        return ((self.logits(w, batch).argmax(-1) == y).to(weight.dtype) * weight).sum(-1)


@dataclass
class ServerRound:
    """Hybrid FL: the server's data D_s^t of one round (FedCLG §III), already on the device."""
    full: Batch              # all m_s samples (full-batch gradients)
    minibatch: Batch         # one minibatch ζ_s drawn apart from the training batches (stochastic g_s)
    batches: list[Batch]     # the E_s minibatches of the server's local training (FedCLG eq. 5)
    lr: float                # γ_t, decayed like η_l


@dataclass
class SetupContext:
    """What an algorithm may know when it is built."""
    num_clients: int      # N, every client id is below it
    dim: int              # n, the length of the flat parameter vector
    client_sizes: Tensor  # (N,) n_i
    weighting: str        # "uniform" | "data"
    local_steps: int      # E (in local.unit)
    device: torch.device
    dtype: torch.dtype
    ops: "ModelOps | None" = None   # server-side model functions (plain autograd): hybrid FL's g_s
    #: (parameter name, start, stop) of each of the model's parameters in w, in order (FedPer's head)
    layout: tuple[tuple[str, int, int], ...] = ()
    #: the names of the model's BatchNorm layers (FedBN's local ones)
    batchnorm: tuple[str, ...] = ()
    #: the federation's size, the N of the papers' 1/N sums: N less the clients eval.unseen_clients holds out
    #: of training (0: N)
    training_clients: int = 0
    #: the run's seed: a server hook's random numbers come from fedsweep.generator(seed, plan.round, purpose)
    seed: int = 0

    def __post_init__(self):
        self.training_clients = self.training_clients or self.num_clients


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


@algorithm_base
class Algorithm:
    """Base class: FedAvg's behaviour everywhere, so each algorithm overrides only what differs."""
    name: ClassVar[str]
    Params: ClassVar[type[BaseModel]] = NoParams
    #: data each client gets at w^t before training: None, one fresh minibatch, or its full data
    probe: Literal[None, "minibatch", "full"] = None
    #: gradient evaluations per local step (FedSAM: 2)
    grads_per_step: ClassVar[int] = 1
    #: model-size vectors each client uploads / downloads per round
    upload_models: ClassVar[float] = 1.0
    download_models: ClassVar[float] = 1.0
    #: hybrid FL: the algorithm cannot run without server data (checked when the config is read)
    needs_server_data: ClassVar[bool] = False
    #: False for server-only training: the engine is not run and no client is contacted
    uses_clients: ClassVar[bool] = True
    #: ``client_step`` and ``client_final`` also work on all K clients stacked: state (K, n), batch
    #: and probe (K, B, ...), w0 and shared tensors (n,) or (K, n), ``ops`` returning (K,) losses and
    #: (K, n) gradients; only row-wise math (reductions along dim=-1), and every upload (K, ...). The
    #: vectorized engine then calls them without ``vmap``. A subclass that overrides either without
    #: declaring it gets False.
    rowwise: ClassVar[bool] = True
    #: rows of n numbers the server keeps for each client that has taken part (SCAFFOLD's c_i: 1), as
    #: :class:`~fedsweep.algorithms.client_rows.ClientRows`; what the memory check before training counts
    client_rows: ClassVar[int] = 0
    #: each client keeps its own copy of the model's buffers (BatchNorm's running statistics: FedBN): the
    #: loop engine trains a client on its copy, per-client evaluation scores its personal model with it
    local_buffers: ClassVar[bool] = False
    #: the names ``round_metrics`` logs, declared so that a sweep may select, score and compare runs by
    #: one of them (``report.metric``, ``search.metric``, ``scheduler.metric``), checked before it runs
    metrics: ClassVar[tuple[str, ...]] = ()
    #: its client hooks draw random numbers (noise, a random mask): every batch they get carries its key,
    #: ``(x, y, weight, key)``, from which :func:`fedsweep.client_normal` / :func:`fedsweep.client_uniform`
    #: draw, the same on every engine and in a resumed run (torch's own generators are refused under
    #: ``vmap`` and unseeded in a loop). Server hooks draw from ``fedsweep.generator(ctx.seed, plan.round, purpose)``.
    random: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if ("client_step" in cls.__dict__ or "client_final" in cls.__dict__) and "rowwise" not in cls.__dict__:
            cls.rowwise = False   # new client code is not assumed row-wise until its author says so

    def __init__(self, params: BaseModel, ctx: SetupContext):
        self.params = params
        self.ctx = ctx

    # ----- server -> clients ------------------------------------------------------------------
    def broadcast(self, w: Tensor, plan: RoundPlan) -> dict[str, Tensor]:
        return {}

    def client_state(self, plan: RoundPlan) -> dict[str, Tensor]:
        return {}

    # ----- client side (pure; one client; vmapped by the vectorized engine) ---------------------
    def client_init(self, w: Tensor, shared: dict, own: dict, ops: ModelOps, probe: Batch | None) -> dict:
        return {"w": w}

    def client_step(self, state: dict, batch: Batch, ops: ModelOps, lr: Tensor, shared: dict) -> dict:
        _, g = ops.grad(state["w"], batch)
        return {**state, "w": torch.add(state["w"], g, alpha=-lr)}   # w − η_l g in one pass

    def client_final(self, state: dict, w0: Tensor, ops: ModelOps, probe: Batch | None) -> dict:
        return {"delta": state["w"] - w0}

    # ----- server side --------------------------------------------------------------------------
    def weights(self, plan: RoundPlan) -> Tensor:
        """q_i (K,) on the device; zero for clients that returned nothing."""
        return plan.weights(self.ctx.weighting).to(self.ctx.device, self.ctx.dtype)

    def aggregate(self, w: Tensor, uploads: dict[str, Tensor], plan: RoundPlan) -> Tensor:
        """FedAvg: u = Σ q_i Δ_i."""
        return self.weights(plan) @ uploads["delta"]

    def server_train(self, w: Tensor, plan: RoundPlan, ops: ModelOps) -> Tensor | None:
        """Server-side training after the server step (hybrid FL); None = nothing to do."""
        return None

    def round_metrics(self, plan: RoundPlan) -> dict[str, float]:
        """Extra scalars of this round (called after ``aggregate``), logged with the round's metrics."""
        return {}

    def client_record(self, plan: RoundPlan) -> dict[str, Tensor]:
        """Per-client values (K,) of this round (called after ``aggregate``), one row per sampled
        client in ``clients.csv``; {} records nothing."""
        return {}

    def personal_models(self, w: Tensor, clients: Tensor) -> Tensor | None:
        """The personal models (M, n) of ``clients`` (M client ids, on the device) as flat vectors, for
        per-client evaluation (``eval.clients``: ``personal/*``): Ditto's v_k, FedPer's head on the
        global body. Called outside training, in eval mode; must not change the algorithm's state.
        None: the algorithm has none (the default)."""
        return None

    def personal_finetuning(self) -> tuple[int, float | None] | None:
        """FedAvg+FT's personal models: each client's is the global model fine-tuned on the client's data
        for ``steps`` local SGD steps of lr ``lr`` (None: ``local.lr``), made by per-client evaluation at
        each evaluation (the batches of ``eval.finetune_steps``: ``(seed, t, "finetune")``). None (the
        default): the personal models, if any, are :meth:`personal_models`'."""
        return None

    @classmethod
    def has_personal_models(cls) -> bool:
        """Whether the algorithm defines personal models (``personal/*`` then measured)."""
        return cls.personal_models is not Algorithm.personal_models or \
            cls.personal_finetuning is not Algorithm.personal_finetuning

    def state_dict(self) -> dict[str, Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        pass

    # ----- accounting ---------------------------------------------------------------------------
    def client_state_held(self) -> tuple[int, int, int]:
        """(allocated bytes, clients, bytes of their rows) of the per-client rows the algorithm holds
        (:class:`ClientRows`); zeros for an algorithm that keeps none."""
        tables = [v for v in vars(self).values() if isinstance(v, ClientRows)]
        return (sum(t.nbytes() for t in tables), max((len(t) for t in tables), default=0),
                sum(t.used_bytes() for t in tables))

    def communication(self, plan: RoundPlan) -> tuple[float, float]:
        """(up, down) in model-size units: uploads from returning clients, downloads to all sampled."""
        up = self.upload_models * int(plan.participated.sum())
        down = self.download_models * plan.num_sampled
        return up, down

    def compute(self, plan: RoundPlan) -> float:
        """Gradient evaluations on clients (local steps × passes per step, plus a probe pass)."""
        probe = int(plan.participated.sum()) if self.probe else 0
        return float(self.grads_per_step * int(plan.steps.sum()) + probe)
