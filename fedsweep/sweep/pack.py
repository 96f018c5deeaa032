"""Packed trials: several configs trained together, in one process and one Lightning fit.

A sweep's trials are mostly short runs of one model on one dataset that differ in a seed, a
learning rate or a setting. Run one by one, each pays a process, a Trainer and a round loop of its
own, and the engine sees only K rows at a time. Packed, the configs ("members") share all of that:

    every round, each member plans its own round (clients, steps, batches, what its server sends)
    members whose clients run the same client code (same algorithm and parameters, same η_l this
      round) form a group; a group's clients are the rows of one engine call (on a CPU, calls of
      at most CPU_GROUP_BYTES of client state), every row with its own w^t, shared tensors,
      batches and step count (VectorizedEngine.run_rows)
    each member then aggregates, steps its own server optimizer and evaluates on its own cadence

Nothing an algorithm sees changes: it still gets one config's (K, n) uploads and its own state, so
algorithm files know nothing of packing. A member that diverges stops alone (its rows leave the
groups; the others go on). A member's numbers equal its unpacked run's up to float rounding
(tests/test_pack.py: 1e-5 on every algorithm family).

Members must share what fixes the engine's shapes: the model, the data source (its tensors are
concatenated once, equal ones kept once), the round count, the engine and the device
(:func:`fedsweep.sweep.units.pack_key`). Members whose engine is the loop (``engine: loop``, or ``auto``
with a conv model on a CPU) run their own engines one after another.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import lightning as L
import torch
from torch import nn

from fedsweep.config.schema import ConfigError, RunConfig
from fedsweep.data import FederatedData
from fedsweep.engine import ClientData
from fedsweep.engine.vectorized import VectorizedEngine
from fedsweep.sim.heterogeneity import Batches
from fedsweep.runs.module import FederatedModule, RoundWork, Rounds
from fedsweep.sweep.units import client_code, pack_key

# On a CPU, one engine call's client states should stay within the cache: the local steps stream
# the (rows, n) state several times per step. Measured on 2 cores (benchmarks/README.md): 12 FedLGA
# configs of the FedLGA MLP (n = 30,010, K = 10) packed: 10 rows a call (no merging) 13.0 s, 20 rows
# 14.0 s, 40 rows 14.6 s, 80 rows 17.6 s, all 120 at once 15.8 s; unpacked 17.1 s. Members are
# merged up to this many bytes of state (1.2 MB is 10 rows of that MLP); on a
# GPU, where rows are nearly free, all of a group's rows go in one call, and a call that runs out of
# memory is split, later ones capped at half its rows (PackedModule._train_clients).
CPU_GROUP_BYTES = 1.5e6


def check_packable(cfgs: list[RunConfig]) -> None:
    keys = {pack_key(c) for c in cfgs}
    if len(keys) > 1:
        raise ConfigError("pack: configs in one pack must share model, data source (all but data.partition, "
                          "data.num_clients, data.train_size, data.validation*), rounds, engine and device")


class PackedModule(L.LightningModule):
    """One Lightning module over several :class:`FederatedModule` members; one training_step runs
    round t of every member still training."""

    def __init__(self, cfgs: list[RunConfig], data: list[FederatedData | None] | None = None,
                 max_rows: int | None = None, ids: list[int] | None = None):
        super().__init__()
        if not cfgs:
            raise ConfigError("pack: no configs to train")
        check_packable(cfgs)
        self.automatic_optimization = False
        self.members = nn.ModuleList([FederatedModule(c, data=d) for c, d in zip(cfgs, data or [None] * len(cfgs))])
        self.cfg = cfgs[0]                 # what Rounds reads: the shared round count
        self.ids = list(ids) if ids is not None else list(range(len(cfgs)))   # the members' sweep trials
        self.max_rows = max_rows           # rows of one engine call; None: the rule in build()
        self.rounds_done = 0
        self.engines: dict[str, VectorizedEngine] = {}
        self.offsets: list[int] = []
        self.x = self.y = None

    # ----- set-up --------------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        self.build()

    def build(self) -> None:
        if self.x is not None:
            return
        # Members of one dataset hold the same tensors (a process loads a file-backed dataset once,
        # data.sources): moved to the device once, not once a member (CIFAR-10 is 0.75 GB a copy).
        # Keyed by the memory a tensor views, not by the object: a dataset made as numpy arrays once
        # a process (mnist_5k) reaches each member as a tensor object of its own over the same memory.
        moved: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}   # view -> (the tensor, on the device)

        def once(t: torch.Tensor, dev: torch.device) -> torch.Tensor:
            view = (t.device, t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
            if view not in moved:
                moved[view] = (t, t.to(dev))
            return moved[view][1]
        for m in self.members:
            d, dev = m.data, m.w.device
            m.data = dataclasses.replace(d, x_train=once(d.x_train, dev), y_train=once(d.y_train, dev),
                                         x_test=once(d.x_test, dev), y_test=once(d.y_test, dev))
            m.build()
        # The members' training tensors, concatenated once; a member's sample i is row offset + i.
        # Equal tensors (same source, e.g. the seeds of a digits config) are kept once.
        kept: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        self.offsets, at = [], 0
        for m in self.members:
            x, y = m.data.x_train, m.data.y_train
            same = next((off for kx, ky, off in kept if (kx is x and ky is y) or (
                kx.shape == x.shape and ky.shape == y.shape and torch.equal(kx, x) and torch.equal(ky, y))), None)
            if same is None:
                kept.append((x, y, at))
                same, at = at, at + x.shape[0]
            self.offsets.append(same)
        if len(kept) == 1:   # one dataset: its own tensors, not a copy
            self.x, self.y = kept[0][0], kept[0][1]
        else:
            self.x, self.y = torch.cat([k[0] for k in kept]), torch.cat([k[1] for k in kept])
        if self.max_rows is None and self.x.device.type == "cpu":
            dim = self.members[0].fmodel.dim
            self.max_rows = max(int(CPU_GROUP_BYTES // (4 * dim)), 1)

    def _engine(self, member: FederatedModule) -> VectorizedEngine:
        """The engine of a group: the client code of ``member``'s algorithm on the packed data."""
        key = client_code(member.cfg)
        if key not in self.engines:
            self.engines[key] = VectorizedEngine(member.fmodel, member.algorithm, ClientData(self.x, self.y))
        return self.engines[key]

    def configure_optimizers(self):
        return [m.configure_optimizers() for m in self.members]

    def train_dataloader(self):
        return Rounds(self)

    # ----- one round of every member -----------------------------------------------------------
    def training_step(self, t, batch_idx):
        t = int(t)
        start = time.perf_counter()
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        active = [i for i, m in enumerate(self.members) if not m.diverged]
        works = {i: self.members[i].prepare_round(t) for i in active}
        results = self._train_clients(active, works)
        if self.x.device.type == "cuda":   # the groups' kernels, before their time is shared out
            torch.cuda.synchronize(self.x.device)
        per_member = (time.perf_counter() - start) / max(len(active), 1)
        for i in active:
            m = self.members[i]
            metrics = m.finish_round(works[i], *results[i], opts[i], time.perf_counter())
            metrics["round/seconds"] += per_member   # its share of the pack's planning and training
            m.record_round(metrics)                  # a diverged member stops alone; the others go on
        self.rounds_done = t + 1
        if all(m.diverged for m in self.members):
            self.trainer.should_stop = True

    def _train_clients(self, active: list[int], works: dict[int, RoundWork]) -> dict[int, tuple]:
        """(uploads, client losses) of every active member, its clients trained in groups."""
        out, groups = {}, {}
        for i in active:
            m, work = self.members[i], works[i]
            if work.batches is None or m.engine_name != "vectorized":   # no clients, or the loop engine
                out[i] = m.train_clients(work)
            else:
                groups.setdefault((client_code(m.cfg), work.plan.lr), []).append(i)
        rows = lambda idx: [works[i].plan.num_sampled for i in idx]   # noqa: E731
        for (_, lr), idx in groups.items():
            pending = _chunks(idx, rows(idx), self.max_rows)
            while pending:
                chunk = pending.pop(0)
                if len(chunk) == 1:              # alone: its own engine, as unpacked
                    out[chunk[0]] = self.members[chunk[0]].train_clients(works[chunk[0]])
                    continue
                try:
                    out.update(self._train_group(chunk, [works[i] for i in chunk], lr))
                    continue
                except torch.OutOfMemoryError:
                    pass   # below, once the failed call's tensors have gone with its traceback
                # On a GPU a group's rows are not capped (see CPU_GROUP_BYTES), and a large model's pack
                # can outgrow the memory: the group changed no member's state (its tensors are copies),
                # so it is split, and every later group capped at half its rows.
                self.max_rows = max(sum(rows(chunk)) // 2, 1)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                print(f"pack: a group of {sum(rows(chunk))} client rows ran out of device memory; groups "
                      f"of at most {self.max_rows} rows from now on", file=sys.stderr)
                rest = chunk + [i for c in pending for i in c]
                pending = _chunks(rest, rows(rest), self.max_rows)
        return out

    def _train_group(self, idx: list[int], works: list[RoundWork], lr: float) -> dict[int, tuple]:
        members = [self.members[i] for i in idx]
        sizes = [w.plan.num_sampled for w in works]
        w_rows = torch.cat([m.w.detach().expand(k, -1) for m, k in zip(members, sizes)])
        shared = {key: torch.cat([w.shared[key].unsqueeze(0).expand(k, *w.shared[key].shape)
                                  for w, k in zip(works, sizes)]) for key in works[0].shared}
        own = {key: torch.cat([w.own[key] for w in works]) for key in works[0].own}
        offsets = [self.offsets[i] for i in idx]
        batches = _stack_batches([w.batches for w in works], offsets)
        probe = _stack_batches([w.probe for w in works], offsets) if works[0].probe is not None else None
        steps = torch.cat([w.plan.steps for w in works])
        uploads, loss = self._engine(members[0]).run_rows(w_rows, steps, lr, batches, probe, shared, own)
        out, at = {}, 0
        for i, k in zip(idx, sizes):
            out[i] = ({key: v[at:at + k] for key, v in uploads.items()}, loss[at:at + k])
            at += k
        return out

    # ----- checkpoints -----------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        states = []
        for m in self.members:
            c: dict[str, Any] = {}
            m.on_save_checkpoint(c)
            states.append({**c["fedsweep"], "diverged": m.diverged})
        checkpoint["fedsweep_pack"] = {"rounds_done": self.rounds_done, "members": states, "ids": self.ids}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint["fedsweep_pack"]
        if list(state.get("ids", self.ids)) != self.ids:
            raise ConfigError(f"--resume: the checkpoint holds the pack's members {state['ids']}, this pack "
                              f"{self.ids}")
        self.rounds_done = int(state["rounds_done"])
        for m, s in zip(self.members, state["members"]):
            m.on_load_checkpoint({"fedsweep": s})
            m.diverged = bool(s.get("diverged", False))


def _chunks(idx: list[int], rows: list[int], cap: int | None) -> list[list[int]]:
    """``idx`` cut into consecutive runs of at most ``cap`` rows (each run holds at least one member)."""
    if cap is None:
        return [idx]
    out, cur, n = [], [], 0
    for i, k in zip(idx, rows):
        if cur and n + k > cap:
            out.append(cur)
            cur, n = [], 0
        cur.append(i)
        n += k
    return out + [cur]


def _stack_batches(parts: list[Batches], offsets: list[int]) -> Batches:
    """Members' (K_m, S_m, B_m) schedules as one (ΣK, max S, max B), indices shifted into the packed
    tensors; the padding is masked (weight 0, and past a row's steps)."""
    K = sum(b.index.shape[0] for b in parts)
    S = max(b.index.shape[1] for b in parts)
    B = max(b.index.shape[2] for b in parts)
    like = parts[0].index
    index = torch.zeros(K, S, B, dtype=like.dtype, device=like.device)
    mask = torch.zeros(K, S, B, dtype=torch.bool, device=like.device)
    keys = torch.zeros(K, S, dtype=torch.int64, device=like.device)
    at = 0
    for b, off in zip(parts, offsets):
        k, s, n = b.index.shape
        index[at:at + k, :s, :n] = b.index + off
        mask[at:at + k, :s, :n] = b.mask
        keys[at:at + k, :s] = b.keys
        at += k
    return Batches(index, mask, keys)


def train_packed(cfgs: list[RunConfig], *, callbacks=(), resume=None, data=None, max_rows=None,
                 ids=None) -> PackedModule:
    """Fit the members of a pack; returns the module (``module.members[i].history`` per config).
    ``ids``: the members' sweep trial indices, kept in the checkpoint (default 0..n-1)."""
    from fedsweep.util.allocator import keep_freed_memory
    from fedsweep.runs.memory import check_state_fits, state_bound
    from fedsweep.runs.run import lightning_trainer, matmul_precision, quiet_logs, resolve_device
    quiet_logs()
    keep_freed_memory()
    devices = {resolve_device(c.device) for c in cfgs}
    with matmul_precision(cfgs[0].matmul_precision):   # one in a pack: sweep.pack_key
        module = PackedModule(cfgs, data=data, max_rows=max_rows, ids=ids)
        check_state_fits([(m.cfg, state_bound(m.cfg, m.fmodel.dim)) for m in module.members], next(iter(devices)))
        # One epoch of `rounds` training steps: with one optimizer per member, Lightning counts every
        # member's server step as a step of its own, so max_steps cannot count rounds here.
        trainer = lightning_trainer(devices.pop(), -1, list(callbacks), max_epochs=1)
        trainer.fit(module, ckpt_path=str(resume) if resume is not None else None)
        for m in module.members:
            m.record_eval()   # a member cut short (divergence) still ends evaluated
    return module
