"""The LightningModule: one whole federated round per ``training_step``.

    plan  = who is sampled, how many steps each completes, which batches   (sim/heterogeneity.py)
    local = engine runs the algorithm's client functions for the K clients (engine/)
    agg   = algorithm.aggregate -> update u                                  (algorithms/)
    step  = the server optimizer (Lightning's) steps on pseudo-gradient −u, lr η_g
    (+ algorithm.server_train for hybrid FL)

The global model is one flat ``nn.Parameter`` ``w``; the network is reached through
``torch.func.functional_call`` on views of it. Evaluation on the test split (and the validation split,
where there is one) runs inside ``training_step`` every ``eval.every`` rounds. Checkpoints carry w,
the server optimizer, the algorithm's state, the round counter and the metric history, so a resumed
run ends identically.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch import nn

from fedsweep.algorithms import get_algorithm_class
from fedsweep.algorithms.base import ServerRound, SetupContext
from fedsweep.config.schema import RunConfig
from fedsweep.data import FederatedData, load_federated
from fedsweep.engine import ClientData, engine_choice, make_engine, probe_batches
from fedsweep.engine.loop import autograd_ops
from fedsweep.engine.functional import FunctionalModel
from fedsweep.sim.heterogeneity import Planner, decayed_lr, schedule_batches
from fedsweep.sim.models import build_model
from fedsweep.sim.rng import batch_keys, derive_seed, generator, np_rng


def divergence_limit(factor: float | None, num_classes: int) -> float:
    """The ``train/loss`` above which a round counts as diverged: ``eval.divergence_factor`` × ln(C), C
    classes, the loss of a uniform guess; inf (only NaN/inf count) when the factor is None."""
    return factor * math.log(num_classes) if factor is not None else math.inf


def is_diverged(train_loss: float, w: torch.Tensor, limit: float, loss_measured: bool = True) -> bool:
    """The one divergence rule (docs/design.md §2.8), for runs and pack members alike: the model w
    has a NaN/inf entry, or the round's ``train/loss`` is NaN, inf or above ``limit``. A round in
    which no client returned (all dropped out: ``loss_measured`` False) has no loss to judge, only w."""
    if loss_measured and not (math.isfinite(train_loss) and train_loss <= limit):
        return True
    # 0·w is NaN exactly where w is ±inf or NaN, so the sum is 0 iff the model is finite (one pass:
    # isfinite(w).all() took ~60 µs a round of the sweeps/fedlga.yaml MLP on 1 CPU thread, this ~9)
    return not bool((w * 0).sum() == 0)


@dataclass
class RoundWork:
    """One config's round between planning and aggregation (what the engine is handed)."""
    plan: Any
    batches: Any           # Batches on the device; None when no client is contacted
    probe: Any
    shared: dict
    own: dict


class Rounds:
    """The training 'dataloader': one epoch of ``cfg.rounds`` batches, each a round index.

    Iteration starts at the module's ``rounds_done`` (restored from a checkpoint), while the length
    stays the full round count, matching the batch progress Lightning restores mid-epoch.
    """

    def __init__(self, module: "FederatedModule"):
        self.module = module

    def __iter__(self):
        return iter(range(self.module.rounds_done, self.module.cfg.rounds))

    def __len__(self):
        return self.module.cfg.rounds


class FederatedModule(L.LightningModule):
    def __init__(self, cfg: RunConfig, data: FederatedData | None = None):
        super().__init__()
        self.automatic_optimization = False
        self.cfg = cfg
        self.data = data if data is not None else load_federated(cfg.data, cfg.seed, server=cfg.server_data)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(cfg.seed, -1, "init") % (2**31))
            net = build_model(cfg.model, self.data.input_shape, self.data.num_classes)
        self.fmodel = FunctionalModel(net)
        self.w = nn.Parameter(self.fmodel.flatten())
        self.planner = Planner(cfg, self.data.client_sizes)
        self.clients_cpu = self.data.client_indices   # the CPU copy that batch schedules are made from
        self.algorithm = None            # built in setup(), once the device is known
        self.engine = None
        self.engine_name = None          # what `engine` resolved to (auto: by model and device)
        self.engine_why = ""             # why auto chose the loop for a model vmap cannot run
        self.rounds_done = 0
        self.history: list[dict[str, float]] = []   # one dict per round (+ eval metrics on eval rounds)
        self.client_log: list[dict[str, list]] = []  # per round: client ids + the algorithm's per-client values
        self.diverged = False
        self.loss_limit = divergence_limit(cfg.eval.divergence_factor, self.data.num_classes)
        self.loss_measured = True   # the last round's train/loss averages some client's (or the server's)
        self._pending_algo_state: dict | None = None   # from a checkpoint loaded before build()
        self.client_buffers = None       # each client's buffers, for an algorithm that keeps them local
        self._pending_buffers: dict | None = None
        self.client_eval = None          # per-client evaluation (eval.clients), built in build()
        self.client_eval_rows: list[dict] = []   # its last evaluation's per-client values (client_eval.csv)
        self._plugin_records = None
        if cfg.plugins:
            self.plugin_records()   # their hashes as the run starts: what its checkpoints keep

    # ----- set-up --------------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        # Not in setup(): Lightning calls setup before it moves the module to its device (and before
        # restoring a checkpoint); here w is on the final device and restored state is waiting.
        self.build()

    def build(self) -> None:
        """Move data to w's device, build the algorithm (with restored state) and the engine."""
        if self.engine is not None:
            return
        dev = self.w.device
        self.data = self.data.to(dev)
        self.fmodel.module.to(dev)
        self.fmodel.buffers = {k: v.to(dev) for k, v in self.fmodel.buffers.items()}
        cls = get_algorithm_class(self.cfg.algorithm.name)
        ctx = SetupContext(num_clients=self.data.num_clients, dim=self.fmodel.dim,
                           client_sizes=self.data.client_sizes.to(dev), weighting=self.cfg.algorithm.weighting,
                           local_steps=self.cfg.local.steps, device=dev, dtype=self.w.dtype,
                           ops=autograd_ops(self.fmodel), layout=self.fmodel.layout(),
                           batchnorm=tuple(n for n, m in self.fmodel.module.named_modules()
                                           if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)),
                           training_clients=len(self.planner.pool) if self.planner.pool is not None else 0,
                           seed=self.cfg.seed)
        self.fmodel.keyed = cls.random   # its client hooks draw from the batches' keys
        self.algorithm = cls(self.cfg.algorithm.params, ctx)
        if self._pending_algo_state is not None:
            self.algorithm.load_state_dict(self._pending_algo_state)
            self._pending_algo_state = None
        client_data = ClientData(self.data.x_train, self.data.y_train)
        # a random op the seeded dropout layers do not cover: each keyed forward pass seeds a fork of
        # the global RNG (engine.functional), so the run still repeats exactly. fedsweep's own models
        # draw nothing (tests/test_models.py): not tried
        ours = type(self.fmodel.module).__module__.startswith("fedsweep.")
        self.fmodel.global_rng = not ours and self.fmodel.draws_global_rng(self.data.input_shape)
        self.engine_name, self.engine_why = engine_choice(self.cfg.engine, self.fmodel.module, dev,
                                                          self.data.input_shape)
        if cls.local_buffers and self.fmodel.buffers and self.engine_name == "loop":
            from fedsweep.engine.client_buffers import ClientBuffers
            self.client_buffers = ClientBuffers(self.fmodel)
            if self._pending_buffers is not None:
                self.client_buffers.load_state_dict(self._pending_buffers)
                self._pending_buffers = None
        self.engine = make_engine(self.engine_name, self.fmodel, self.algorithm, client_data, self.client_buffers)
        if self.cfg.eval.clients is not None:
            from fedsweep.runs.client_eval import ClientEvaluation
            self.client_eval = ClientEvaluation(self.cfg, self.data, self.fmodel, self.engine_name, self.algorithm,
                                               self.clients_cpu, self.client_buffers)

    def configure_optimizers(self):
        s = self.cfg.server
        if s.optimizer == "adam":
            return torch.optim.Adam([self.w], lr=s.lr, betas=(s.momentum, s.beta2), eps=s.eps)
        momentum = s.momentum if s.optimizer == "momentum" else 0.0
        return torch.optim.SGD([self.w], lr=s.lr, momentum=momentum)

    def train_dataloader(self):
        return Rounds(self)

    def val_dataloader(self):
        return [0]  # one "batch": validation_step evaluates the whole device-resident test split

    def on_validation_start(self) -> None:
        self.build()   # `trainer.validate(module, ckpt_path=...)` evaluates a checkpoint

    # ----- one round -------------------------------------------------------------------------------
    def run_round(self, t: int) -> dict[str, float]:
        """Plan, train the K clients, aggregate, step the server. Returns the round's metrics."""
        start = time.perf_counter()
        work = self.prepare_round(t)
        return self.finish_round(work, *self.train_clients(work), self.optimizers(), start)

    def prepare_round(self, t: int) -> "RoundWork":
        """The part of round t before local training: the plan, what the server sends, the batches
        (None when the algorithm contacts no client)."""
        cfg, algo = self.cfg, self.algorithm
        plan = self.planner.plan(t)
        plan.server = self.server_round(t)
        w = self.w.detach()
        with torch.no_grad():
            shared = algo.broadcast(w, plan)
            own = algo.client_state(plan)
        batches = probe = None
        if algo.uses_clients:
            dev = self.w.device
            batches = schedule_batches(plan, self.clients_cpu, cfg.local.batch_size, cfg.local.unit, cfg.seed).to(dev)
            probe = probe_batches(algo.probe, plan, self.clients_cpu, cfg.local.batch_size, cfg.seed)
            probe = probe.to(dev) if probe is not None else None
        return RoundWork(plan, batches, probe, shared, own)

    def train_clients(self, work: "RoundWork") -> tuple[dict, torch.Tensor]:
        """(uploads, each client's mean training loss) of the round's clients, on this module's engine."""
        if work.batches is None:   # server-only training: no client is contacted
            return {}, torch.full((work.plan.num_sampled,), float("nan"), device=self.w.device)
        return self.engine.run(self.w.detach(), work.plan, work.batches, work.probe, work.shared, work.own)

    def finish_round(self, work: "RoundWork", uploads, client_loss, opt, start: float) -> dict[str, float]:
        """The part of round t after local training: aggregate, the server optimizer ``opt`` steps on
        −u, server-side training; returns the round's metrics."""
        algo, plan, t = self.algorithm, work.plan, work.plan.round
        dev = self.w.device
        with torch.no_grad():
            update = algo.aggregate(self.w.detach(), uploads, plan)
        self.w.grad = -update   # the optimizer's one parameter: this replaces its gradient (no zero_grad)
        opt.step()
        with torch.no_grad():
            trained = algo.server_train(self.w.detach(), plan, algo.ctx.ops)
            if trained is not None:
                self.w.copy_(trained)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        extra = dict(algo.round_metrics(plan))   # ours to extend below
        record = algo.client_record(plan)
        if record:
            self.client_log.append({"round": t + 1, "client": plan.clients.tolist(),
                                    **{k: v.detach().cpu().tolist() for k, v in record.items()}})
        up, down = algo.communication(plan)
        returned = plan.participated.to(client_loss.device)
        self.loss_measured = bool(returned.any())
        train_loss = float(client_loss[returned].mean()) if self.loss_measured else float("nan")
        if plan.server is not None:   # the server's own loss on D_s^t after its training
            with self.fmodel.evaluating():   # a measurement: eval mode, as every evaluation
                extra["server/loss"] = float(self.fmodel.loss(self.w.detach(), plan.server.full))
            extra["server/lr"] = plan.server.lr
            if not algo.uses_clients:
                train_loss, self.loss_measured = extra["server/loss"], True
        return {
            "round": t + 1,
            **extra,
            "train/loss": train_loss,
            "round/seconds": time.perf_counter() - start,
            "round/lr": plan.lr,
            "comm/up_models": float(up),
            "comm/down_models": float(down),
            "compute/grad_evals": algo.compute(plan),
            "stragglers/fraction": float(plan.stragglers.sum()) / plan.num_sampled,
        }

    def server_round(self, t: int) -> ServerRound | None:
        """Hybrid FL: the server's D_s^t of round t and its E_s minibatches (draws from (seed, t, ·))."""
        pool = getattr(self.data, "server_pool", None)
        if pool is None:
            return None
        from fedsweep.data.server import round_server_indices
        sd, dev = self.cfg.server_data, self.w.device
        labels = self.data.y_train.cpu().numpy()
        idx = torch.as_tensor(round_server_indices(pool.cpu().numpy(), labels, sd, self.data.num_classes, t,
                                                   self.cfg.seed), dtype=torch.long)
        m, b = idx.numel(), min(sd.batch_size, idx.numel())
        g = generator(self.cfg.seed, t, "server_batches")
        passes = -(-sd.steps * b // m) if sd.steps else 0      # walk fresh permutations of D_s^t
        stream = torch.cat([idx[torch.randperm(m, generator=g)] for _ in range(passes)]) if passes else idx[:0]

        # dropout keys: D_s^t whole, ζ_s, then each of the E_s minibatches
        keys = batch_keys(self.cfg.seed, t, "server", torch.zeros(1, dtype=torch.int64), sd.steps + 2)[0].to(dev)

        def batch(ix, j):
            ix = ix.to(dev)
            x = self.data.x_train[ix]
            out = x, self.data.y_train[ix], torch.full((ix.numel(),), 1.0 / ix.numel(), dtype=x.dtype, device=dev)
            return (*out, keys[j]) if self.fmodel.random else out

        gamma = decayed_lr(sd.lr, self.cfg, t)
        probe = idx[torch.randperm(m, generator=generator(self.cfg.seed, t, "server_probe"))[:b]]
        return ServerRound(full=batch(idx, 0), minibatch=batch(probe, 1),
                           batches=[batch(stream[i * b:(i + 1) * b], 2 + i) for i in range(sd.steps)], lr=gamma)

    def training_step(self, t, batch_idx):
        if self.record_round(self.run_round(int(t))):
            self.trainer.should_stop = True

    def record_round(self, metrics: dict[str, float]) -> bool:
        """Keep a finished round's metrics; mark the run diverged (returns True) by :func:`is_diverged`,
        else evaluate on the ``eval.every`` cadence. A pack's members come here too, one by one."""
        self.history.append(metrics)
        self.rounds_done = metrics["round"]
        if is_diverged(metrics["train/loss"], self.w.detach(), self.loss_limit, self.loss_measured):
            self.diverged = True
        elif self.rounds_done % self.cfg.eval.every == 0 or self.rounds_done == self.cfg.rounds:
            self.record_eval()   # here, not in Lightning's val loop: exact cadence across resumes
        return self.diverged

    # ----- evaluation ----------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """test/loss, test/accuracy and, with a validation split, val/loss, val/accuracy of the global model;
        with ``eval.clients`` the per-client metrics (:mod:`fedsweep.runs.client_eval`)."""
        loss, acc = self.fmodel.evaluate(self.w.detach(), self.data.x_test, self.data.y_test,
                                         self.cfg.eval.batch_size)
        out = {"test/loss": loss, "test/accuracy": acc, **self.evaluate_validation()}
        if self.client_eval is not None:
            out.update(self.client_eval.evaluate(self.w.detach(), self.rounds_done - 1))
            self.client_eval_rows = self.client_eval.rows
        return out

    def evaluate_validation(self) -> dict[str, float]:
        """val/loss, val/accuracy on the central validation split, or on the pooled validation samples of
        the clients this evaluation reads (:meth:`validation_samples`): a sample-weighted mean of the
        clients' own, as a deployed FL system aggregates its clients' reports; {} without a split."""
        d = self.data
        if not d.validation:
            return {}
        if d.x_val is not None:
            x, y = d.x_val, d.y_val
        else:
            idx = self.validation_samples(self.rounds_done - 1)
            x, y = d.x_train[idx], d.y_train[idx]
        loss, acc = self.fmodel.evaluate(self.w.detach(), x, y, self.cfg.eval.batch_size)
        return {"val/loss": loss, "val/accuracy": acc}

    def validation_samples(self, t: int) -> torch.Tensor:
        """The pooled federated validation samples (indices into ``x_train``) read after round t: of every
        client holding some, or of ``eval.validation_clients`` of them drawn without replacement from
        (seed, t, "validation clients"), the same for every engine and for a packed or resumed run."""
        val = self.data.val_indices
        holders = torch.nonzero(val.sizes).flatten().cpu().numpy()
        wanted = self.cfg.eval.validation_clients
        if wanted is None or wanted >= len(holders):
            return val.values                                   # every holder's, in client order
        rng = np_rng(self.cfg.seed, t, "validation clients")
        chosen = sorted(int(i) for i in rng.choice(holders, size=wanted, replace=False))
        return torch.cat([val[i] for i in chosen])

    def validation_step(self, batch, batch_idx):
        """``trainer.validate``: test (and validation) metrics of the current global model. During ``fit`` evaluation
        runs inside ``training_step`` every ``eval.every`` rounds, so its cadence survives resumes."""
        self.log_dict(self.evaluate(), batch_size=1)

    def record_eval(self) -> None:
        if not self.history or "test/accuracy" in self.history[-1]:
            return  # nothing trained since the last evaluation
        self.history[-1].update(self.evaluate())

    # ----- checkpoints -----------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["fedsweep"] = {
            "rounds_done": self.rounds_done,
            "history": self.history,
            "client_log": self.client_log,
            **({"client_eval": self.client_eval_rows} if self.client_eval_rows else {}),
            "algorithm": self.algorithm.state_dict() if self.algorithm is not None else {},
            "config": self.cfg.model_dump(mode="json"),
            # a model's buffers (BatchNorm's running statistics): not in w, but the model's state too
            **({"buffers": {k: v.detach().cpu() for k, v in self.fmodel.buffers.items()}} if self.fmodel.buffers else {}),
            **({"client_buffers": self.client_buffers.state_dict()} if self.client_buffers is not None else {}),
            # the plugins' files and hashes: a --resume with one changed is refused (runs/checkpoints.py)
            **({"plugins": self.plugin_records()} if self.cfg.plugins else {}),
            # whose checkpoint this is (fedsweep/runs/checkpoints.py): never replaced by another run's
            **({"identity": dict(self.identity)} if getattr(self, "identity", None) else {}),
        }

    def plugin_records(self) -> list[dict]:
        """The plugins the config names, as imported when the run started (their hashes then)."""
        if getattr(self, "_plugin_records", None) is None:
            from fedsweep.config.plugins import records
            self._plugin_records = records(self.cfg.plugins)
        return self._plugin_records

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint["fedsweep"]
        self.rounds_done = int(state["rounds_done"])
        self.history = [dict(h) for h in state["history"]]
        self.client_log = [dict(r) for r in state.get("client_log", [])]
        self.client_eval_rows = [dict(r) for r in state.get("client_eval", [])]
        for k, v in state.get("buffers", {}).items():
            if k in self.fmodel.buffers:   # in place: on the CPU they are the module's own buffers
                with torch.no_grad():
                    self.fmodel.buffers[k].copy_(v)
        if "client_buffers" in state:
            if self.client_buffers is not None:
                self.client_buffers.load_state_dict(state["client_buffers"])
            else:
                self._pending_buffers = state["client_buffers"]
        if self.algorithm is not None:
            self.algorithm.load_state_dict(state["algorithm"])
        else:
            self._pending_algo_state = state["algorithm"]
