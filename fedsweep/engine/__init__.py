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
from fedsweep.sim.rng import batch_keys


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
    return Batches(rows.unsqueeze(1), mask.unsqueeze(1), batch_keys(seed, plan.round, "probe", plan.clients, 1))


def choose_engine(name: str, module: torch.nn.Module, device: torch.device | str,
                  input_shape: tuple[int, ...] | None = None) -> str:
    """The engine ``engine: name`` runs (:func:`engine_choice`)."""
    return engine_choice(name, module, device, input_shape)[0]


def engine_choice(name: str, module: torch.nn.Module, device: torch.device | str,
                  input_shape: tuple[int, ...] | None = None) -> tuple[str, str]:
    """(the engine ``engine: name`` runs, why, for ``auto``). ``auto``: ``loop`` for a model with
    convolutions on a CPU (there ``vmap`` turns K convolutions into one grouped convolution, 0.5–0.7×
    the loop's speed) or one ``torch.func.vmap`` cannot run (:func:`vmap_problem`: BatchNorm's running
    statistics, noise from the global RNG, ...; dropout layers are seeded and vmap), else ``vectorized`` (2.6–3.9× the loop for the MLP on 2 CPU
    cores; benchmarks/README.md). ``vectorized`` for a model vmap cannot run: one line, before training.
    ``input_shape`` None: the vmap check is not made."""
    if name == "loop":
        return name, ""
    # fedsweep's own models are pure functions of their parameters (tests/test_models.py): not tried,
    # unless built with BatchNorm (`batchnorm: true`), whose running statistics training moves in place
    batchnorm = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules())
    ours = type(module).__module__.startswith("fedsweep.") and not batchnorm
    problem = vmap_problem(module, input_shape) if input_shape is not None and not ours else None
    if problem is not None and name == "auto":
        return "loop", f"torch.func.vmap cannot run this model: {problem}"
    convs = any(isinstance(m, torch.nn.Conv2d) for m in module.modules())
    if name == "auto" and convs and torch.device(device).type == "cpu":
        return "loop", ""   # the rule the run header has always meant by "(auto)"
    if problem is None:
        return "vectorized", ""
    from fedsweep.util.errors import ConfigError
    raise ConfigError(f"engine: 'vectorized' runs every client's model under torch.func.vmap, which cannot run this "
                      f"model ({problem}); use engine: loop, or auto, which picks it")


_VMAP_CHECKED: dict[tuple, str | None] = {}


def vmap_problem(module: torch.nn.Module, input_shape: tuple[int, ...]) -> str | None:
    """Why ``vmap`` of a gradient of ``module``'s loss over two stacked copies fails, as the vectorized
    engine runs it (a batch of two zero samples, on a copy of the model on the CPU); None if it does not.
    Known once a process per model structure and input shape."""
    key = (type(module), str(module), tuple(input_shape))
    if key not in _VMAP_CHECKED:
        import copy

        from torch.func import grad_and_value, vmap
        fm = FunctionalModel(copy.deepcopy(module).cpu())
        w = fm.flatten().float()
        batch = (torch.zeros(2, 2, *input_shape), torch.zeros(2, 2, dtype=torch.int64), torch.full((2, 2), 0.5))
        try:
            vmap(grad_and_value(fm.loss_vmappable))(torch.stack([w, w]), batch)
            _VMAP_CHECKED[key] = None
        except Exception as e:  # noqa: BLE001 - what vmap says is the reason given
            _VMAP_CHECKED[key] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
    return _VMAP_CHECKED[key]


def make_engine(name: str, fmodel: FunctionalModel, algorithm, data: ClientData, buffers=None):
    """``buffers`` (loop engine): each client's own copy of the model's buffers (engine/client_buffers.py).
    The vectorized engine runs no model whose buffers training moves (vmap refuses BatchNorm's updates)."""
    from fedsweep.engine.loop import LoopEngine
    from fedsweep.engine.vectorized import VectorizedEngine
    if name == "loop":
        return LoopEngine(fmodel, algorithm, data, buffers)
    return VectorizedEngine(fmodel, algorithm, data)
