"""Engines train the K sampled clients of a round with an algorithm's client functions.

An engine never names an algorithm: it runs ``client_init``/``client_step``/``client_final`` of
whatever object it is given. ``LoopEngine`` is the readable reference (one client after another,
plain autograd); ``VectorizedEngine`` runs all K at once with ``torch.func`` and per-client step
masks. Same seed, same numbers (tests/test_engines.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fedsweep.engine.functional import FunctionalModel
from fedsweep.sim.client_index import ClientIndex
from fedsweep.sim.heterogeneity import Batches, RoundPlan, schedule_batches


@dataclass
class ClientData:
    """The device-resident training tensors that batches (``Batches.index``) index into."""
    x: torch.Tensor
    y: torch.Tensor


def probe_batches(kind: str | None, plan: RoundPlan, clients: ClientIndex, batch_size: int,
                  seed: int) -> Batches | None:
    """The data each client evaluates at w^t (``Algorithm.probe``): one fresh minibatch, or all of it.

    Returned with one "step": index/mask of shape (K, 1, B) or (K, 1, n_max). n_max is the largest
    client's of all N, fixed for the run, so that the vectorized engine's padded sums are the same
    whoever is sampled; it costs K·n_max sample slots a round, which with heavy-tailed client sizes
    (FedProx synthetic at N = 10^6) is far more than the K clients' own data: a minibatch probe
    (``scaffold`` option 2, ``loss_batch``/``gradient_batch: minibatch``) costs B.
    """
    if kind is None:
        return None
    if kind == "minibatch":
        return schedule_batches(plan, clients, batch_size, "steps", seed, steps=1, purpose="probe")
    rows, mask = clients.rows(plan.clients)                           # (K, n_max of all N)
    return Batches(rows.unsqueeze(1), mask.unsqueeze(1))


def choose_engine(name: str, module: torch.nn.Module, device: torch.device | str) -> str:
    """The engine ``engine: auto`` runs: ``loop`` for a model with convolutions on a CPU (there
    ``vmap`` turns K convolutions into one grouped convolution, 0.5–0.7× the loop's speed), else
    ``vectorized`` (2.6–3.9× the loop for the MLP on 2 CPU cores; benchmarks/README.md)."""
    if name != "auto":
        return name
    convs = any(isinstance(m, torch.nn.Conv2d) for m in module.modules())
    return "loop" if convs and torch.device(device).type == "cpu" else "vectorized"


def make_engine(name: str, fmodel: FunctionalModel, algorithm, data: ClientData):
    from fedsweep.engine.loop import LoopEngine
    from fedsweep.engine.vectorized import VectorizedEngine
    return {"loop": LoopEngine, "vectorized": VectorizedEngine}[name](fmodel, algorithm, data)
