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
from fedsweep.sim.heterogeneity import Batches, RoundPlan, schedule_batches


@dataclass
class ClientData:
    """Device-resident training tensors and the (N, n_max) table of each client's sample indices."""
    x: torch.Tensor
    y: torch.Tensor
    table: torch.Tensor  # on the same device as x


def probe_batches(kind: str | None, plan: RoundPlan, table_cpu: torch.Tensor, batch_size: int,
                  seed: int) -> Batches | None:
    """The data each client evaluates at w^t (``Algorithm.probe``): one fresh minibatch, or all of it.

    Returned with one "step": index/mask of shape (K, 1, B) or (K, 1, n_max).
    """
    if kind is None:
        return None
    if kind == "minibatch":
        return schedule_batches(plan, table_cpu, batch_size, "steps", seed, steps=1, purpose="probe")
    rows = table_cpu[plan.clients]                                    # (K, n_max)
    mask = torch.arange(rows.shape[1]).view(1, -1) < plan.sizes.view(-1, 1)
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
