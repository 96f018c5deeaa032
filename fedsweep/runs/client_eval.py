"""Per-client evaluation of a run (``eval.clients``): how well the model serves each client, and how
unequally (docs/run.md, Per-client evaluation).

At every evaluation each evaluated client is scored on its own test data (and, with a validation
split, its own validation data: :mod:`fedsweep.data.client_test`) with

* ``clients/*``: the global model w^t;
* ``finetuned/*``: w^t fine-tuned on the client's training data for ``eval.finetune_steps`` local SGD
  steps (FedAvg's client update, batches from ``(seed, t, "finetune")``), the FedAvg+FT baseline;
* ``personal/*``: the algorithm's personal model of the client (``Algorithm.personal_models``: Ditto's
  v_k, FedPer's head on the shared body), where it has them;
* ``served/*``: the model the client is served: its personal one where the algorithm has them, else the
  global one, so methods with and without personal models compare on one metric (``report.metric``);
* ``unseen/*`` and ``unseen_finetuned/*``: with ``eval.unseen_clients``, the global model and it
  fine-tuned on the clients held out of training (no personal models: those clients never trained).

Each gives the distribution's summaries over the clients (:func:`distribution`): ``accuracy_mean``
(every client alike), ``accuracy_weighted`` (by its test samples), ``accuracy_p10`` (the mean of the
worst 10% of clients, at least one: q-FFL's "worst 10%"), ``accuracy_std``, ``accuracy_min``, and the
same on validation as ``val_accuracy_*``. The last evaluation's per-client values are the run's
``client_eval.csv`` (a column ``unseen`` marks the held-out clients' rows).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from fedsweep.algorithms.base import Algorithm, NoParams
from fedsweep.config.schema import ConfigError, RunConfig
from fedsweep.data import FederatedData
from fedsweep.data.client_test import evaluated_clients, matched_sets
from fedsweep.engine import ClientData, make_engine
from fedsweep.engine.evaluate import one_model, own_models
from fedsweep.engine.functional import FunctionalModel
from fedsweep.sim.client_index import ClientIndex
from fedsweep.sim.heterogeneity import RoundPlan, schedule_batches, training_clients, unseen_clients

#: Clients fine-tuned at once (their (m, n) models at a time).
FINETUNE_CHUNK = 64


def distribution(right: np.ndarray, n: np.ndarray, prefix: str) -> dict[str, float]:
    """The summaries of the clients' accuracies right/n over the clients with n > 0 (module docstring)."""
    keep = n > 0
    if not keep.any():
        return {}
    acc, size = right[keep] / n[keep], n[keep]
    worst = max(1, math.ceil(0.1 * acc.size))
    return {f"{prefix}_mean": float(acc.mean()), f"{prefix}_weighted": float(right[keep].sum() / size.sum()),
            f"{prefix}_p10": float(np.sort(acc)[:worst].mean()), f"{prefix}_std": float(acc.std()),
            f"{prefix}_min": float(acc.min())}


class ClientEvaluation:
    """Per-client evaluation of a run: the clients that train and, with ``eval.unseen_clients``, apart,
    those held out of training (module docstring)."""

    def __init__(self, cfg: RunConfig, data: FederatedData, fmodel: FunctionalModel, engine_name: str,
                 algorithm: Algorithm, clients_cpu: ClientIndex, buffers=None):
        held_out = unseen_clients(cfg.eval.unseen_clients, data.num_clients, cfg.seed)
        training = training_clients(cfg.eval.unseen_clients, data.num_clients, cfg.seed)
        args = (cfg, data, fmodel, engine_name, algorithm, clients_cpu, buffers)
        self.groups = [ClientEvaluator(*args, evaluated_clients(cfg.eval.clients, training, cfg.seed))]
        if held_out.size:
            self.groups.append(ClientEvaluator(*args, evaluated_clients(cfg.eval.clients, held_out, cfg.seed,
                                                                        "eval unseen clients"), unseen=True))
        self.rows: list[dict] = []   # the last evaluation's per-client values

    def evaluate(self, w: torch.Tensor, t: int) -> dict[str, float]:
        """The per-client metrics of the evaluation after round t (0-based) of the global model ``w``."""
        metrics, rows = {}, []
        for group in self.groups:
            metrics.update(group.evaluate(w, t))
            rows += [{**r, "unseen": group.unseen} for r in group.rows] if len(self.groups) > 1 else group.rows
        self.rows = rows
        return metrics


class ClientEvaluator:
    """One group of evaluated clients (``ids``): their data (indices on the data's device) and scoring;
    ``unseen``: clients held out of training, scored as ``unseen/*`` without personal models."""

    def __init__(self, cfg: RunConfig, data: FederatedData, fmodel: FunctionalModel, engine_name: str,
                 algorithm: Algorithm, clients_cpu: ClientIndex, buffers, ids: np.ndarray, unseen: bool = False):
        self.cfg, self.data, self.fmodel, self.algorithm = cfg, data, fmodel, algorithm
        self.buffers = buffers   # each client's own model buffers (engine/client_buffers.py), or None
        self.vectorized = engine_name == "vectorized"
        self.clients_cpu = clients_cpu
        self.unseen = unseen
        self.kinds = {"clients": "unseen", "finetuned": "unseen_finetuned"} if unseen else \
            {k: k for k in ("clients", "finetuned", "personal", "served")}
        self.ids = torch.as_tensor(ids)
        dev = data.x_train.device
        labels = data.y_train.cpu().numpy()
        train_labels = [labels[clients_cpu[int(i)].numpy()] for i in ids]
        mode = cfg.eval.client_test
        if mode == "natural" and data.client_test is None:
            raise ConfigError(f"eval.client_test: natural: dataset {cfg.data.name!r} has no per-client test samples "
                              "(LEAF's users and datasets that return client_test_indices have); use matched, or "
                              "auto, which picks it")
        self.natural = data.client_test is not None and mode != "matched"
        if self.natural:
            test = ClientIndex.from_parts([data.client_test[int(i)].cpu() for i in ids])
        else:
            test = ClientIndex.from_parts(matched_sets(train_labels, ids.tolist(), data.y_test.cpu().numpy(),
                                                       cfg.eval.client_test_size, data.num_classes, cfg.seed))
        self.test = test.to(dev)
        self.val = self.x_val = self.y_val = None
        if data.validation == "federated":
            self.val = ClientIndex.from_parts([data.val_indices[int(i)].cpu() for i in ids]).to(dev)
            self.x_val, self.y_val = data.x_train, data.y_train
        elif data.validation == "central":
            self.val = ClientIndex.from_parts(matched_sets(
                train_labels, ids.tolist(), data.y_val.cpu().numpy(), cfg.eval.client_test_size, data.num_classes,
                cfg.seed, "client validation")).to(dev)
            self.x_val, self.y_val = data.x_val, data.y_val
        self.rows: list[dict] = []   # the last evaluation's per-client values
        tuning = cfg.eval.finetune_steps or (algorithm.personal_finetuning() is not None and not unseen)
        self.finetuner = make_engine(engine_name, fmodel, Algorithm(NoParams(), algorithm.ctx),
                                     ClientData(data.x_train, data.y_train)) if tuning else None

    def splits(self):
        """(name, x, y, each client's indices) of the data the clients are scored on."""
        yield "accuracy", self.data.x_test, self.data.y_test, self.test
        if self.val is not None:
            yield "val_accuracy", self.x_val, self.y_val, self.val

    def evaluate(self, w: torch.Tensor, t: int) -> dict[str, float]:
        """The per-client metrics of the evaluation after round t (0-based) of the global model ``w``."""
        bs = self.cfg.eval.batch_size
        right = {("clients", name): one_model(self.fmodel, w, x, y, index, bs)
                 for name, x, y, index in self.splits()}
        for kind, models in (("finetuned", self.finetuned), ("personal", self.personal))[:1 if self.unseen else 2]:
            parts = []
            for at in range(0, len(self.ids), FINETUNE_CHUNK):
                chunk = torch.arange(at, min(at + FINETUNE_CHUNK, len(self.ids)))
                W = models(w, t, chunk)
                if W is None:
                    break
                ids = self.ids[chunk].tolist()
                own = (lambda i, ids=ids: self.buffers.of(ids[i], keep=False)) \
                    if kind == "personal" and self.buffers is not None else None
                parts.append({name: own_models(self.fmodel, W, x, y, _select(index, chunk), bs, self.vectorized, own)
                              for name, x, y, index in self.splits()})
            for name, *_ in self.splits() if parts else ():
                right[(kind, name)] = torch.cat([p[name] for p in parts])
        for name, *_ in () if self.unseen else self.splits():   # what each client is served: its personal
            right[("served", name)] = right.get(("personal", name), right[("clients", name)])   # model, else global
        sizes = {name: index.sizes.cpu().numpy() for name, _, _, index in self.splits()}
        metrics, rows = {}, {"client": self.ids.tolist()}
        rows.update({f"n_{'test' if name == 'accuracy' else 'val'}": sizes[name].tolist()
                     for name, *_ in self.splits()})
        for (kind, name), r in right.items():
            r = r.cpu().numpy()
            metrics.update(distribution(r, sizes[name], f"{self.kinds[kind]}/{name}"))
            if kind != "served":   # the csv has the models themselves
                acc = np.where(sizes[name] > 0, r / np.maximum(sizes[name], 1), np.nan)
                rows[name if kind == "clients" else f"{kind}_{name}"] = acc.tolist()
        self.rows = [dict(zip(rows, values)) for values in zip(*rows.values())]
        return metrics

    def finetuned(self, w: torch.Tensor, t: int, chunk: torch.Tensor) -> torch.Tensor | None:
        """The chunk's clients' models: w fine-tuned for ``eval.finetune_steps`` SGD steps on their data."""
        if not self.cfg.eval.finetune_steps:
            return None
        return self.finetune(w, t, chunk, self.cfg.eval.finetune_steps, self.cfg.eval.finetune_lr)

    def finetune(self, w: torch.Tensor, t: int, chunk: torch.Tensor, steps: int, lr: float | None) -> torch.Tensor:
        """The chunk's clients' models: w after ``steps`` SGD steps of lr ``lr`` (None: ``local.lr``) on each
        client's data, on the batches of ``(seed, t, "finetune")``."""
        ids = self.ids[chunk]
        m = ids.numel()
        plan = RoundPlan(round=t, clients=ids, work=torch.full((m,), steps), steps=torch.full((m,), steps),
                         sizes=self.clients_cpu.sizes[ids], dropped=torch.zeros(m, dtype=torch.bool),
                         expected_work=steps, lr=lr or self.cfg.local.lr)
        batches = schedule_batches(plan, self.clients_cpu, self.cfg.local.batch_size, "steps", self.cfg.seed,
                                   purpose="finetune").to(w.device)
        kept = {k: v.clone() for k, v in self.fmodel.buffers.items()}   # BatchNorm's: the global model's own
        uploads, _ = self.finetuner.run(w, plan, batches, None, {}, {})
        for k, v in kept.items():
            self.fmodel.buffers[k].copy_(v)
        return w + uploads["delta"]

    def personal(self, w: torch.Tensor, t: int, chunk: torch.Tensor) -> torch.Tensor | None:
        tuning = self.algorithm.personal_finetuning()
        if tuning is not None:   # FedAvg+FT: the global model fine-tuned on each client's data
            return self.finetune(w, t, chunk, *tuning)
        return self.algorithm.personal_models(w, self.ids[chunk].to(w.device))


def _select(index: ClientIndex, chunk: torch.Tensor) -> ClientIndex:
    """The clients ``chunk`` (consecutive positions) of ``index``."""
    a, b = int(chunk[0]), int(chunk[-1]) + 1
    offsets = index.offsets[a:b + 1]
    return ClientIndex(offsets - offsets[0], index.values[int(offsets[0]):int(offsets[-1])])
