"""Counter-based randomness: every draw derives from ``(seed, round, purpose)``.

Nothing in fedsweep uses the global RNG for simulation draws; a model's dropout masks are hashed
from :func:`batch_keys` (:mod:`fedsweep.engine.dropout`). A run resumed at round t therefore
continues exactly like the uninterrupted run (Lightning checkpoints do not restore global RNG state),
and the loop and vectorized engines see the same client samples, straggler draws and batches.
"""
from __future__ import annotations

import hashlib

import numpy as np

from fedsweep.util.lazy import torch


def derive_seed(seed: int, round: int, purpose: str) -> int:
    """A 63-bit seed that is a pure function of ``(seed, round, purpose)``."""
    digest = hashlib.blake2b(f"{seed}/{round}/{purpose}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def generator(seed: int, round: int, purpose: str) -> torch.Generator:
    """A CPU ``torch.Generator`` for one purpose of one round (draw on CPU, then move the result)."""
    return torch.Generator().manual_seed(derive_seed(seed, round, purpose))


def np_rng(seed: int, round: int, purpose: str) -> np.random.Generator:
    """A NumPy generator for one purpose of one round (round -1 for run-level draws such as partitions)."""
    return np.random.default_rng(derive_seed(seed, round, purpose))


_M32 = 0xFFFFFFFF


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche hash of int64 tensors holding values in [0, 2^32): ``lowbias32``'s finalizer
    (C. Wellons, "Prospecting for hash functions", 2018); every product stays below 2^63, so it is
    exact in int64 on every device and under ``vmap`` (the masks of seeded dropout layers)."""
    x = ((x >> 16) ^ x) * 0x21F0AAAD & _M32
    x = ((x >> 15) ^ x) * 0x735A2D97 & _M32
    return (x >> 15) ^ x


def batch_keys(seed: int, round: int, purpose: str, clients: torch.Tensor, steps: int) -> torch.Tensor:
    """The dropout keys (K, ``steps``) int64 of K clients' batches in round ``round``: from
    ``(seed, round, purpose + "/dropout")``, each client's id and the step."""
    base = derive_seed(seed, round, purpose + "/dropout")
    b = int(mix32(torch.tensor((base ^ (base >> 31)) & _M32)))       # the 63 bits folded to 32
    per_client = mix32(b ^ clients.to(torch.int64).view(-1, 1).cpu())
    return mix32(per_client ^ torch.arange(steps, dtype=torch.int64).view(1, -1))


# -- random numbers in client hooks --------------------------------------------------------------

def _salt(purpose: str) -> int:
    """32 bits of ``purpose``: two draws of one batch with other purposes are apart."""
    return int.from_bytes(hashlib.blake2b(purpose.encode(), digest_size=4).digest(), "little")


def client_uniform(batch, like, purpose: str = "") -> torch.Tensor:
    """Uniform numbers in (0, 1) shaped like ``like`` (its dtype and device), for a client hook of an
    algorithm that declares ``random = True`` (so its batches carry their key: ``(x, y, weight, key)``):
    a counter-based hash of the batch's key, ``purpose`` and each number's position, so they derive
    from ``(seed, round, client, local step)`` and are the same on the loop and the vectorized engine,
    under ``vmap``, in a resumed run, whoever else is sampled. Row-wise code (``batch`` of K stacked
    clients, key (K,)) gets a row of its own per client: ``like`` (K, ...)."""
    if len(batch) < 4:
        raise TypeError("client_uniform: the batch carries no key; an algorithm whose client hooks draw random "
                        "numbers declares `random = True` (docs/extending.md)")
    key = batch[3]
    rows = like.shape[:key.dim()]
    position = torch.arange(like[(0,) * key.dim()].numel() if key.dim() else like.numel(), dtype=torch.int64,
                            device=key.device).view(like.shape[key.dim():])
    k = key.reshape(*rows, *([1] * (like.dim() - key.dim())))
    u = mix32(mix32(k ^ _salt(purpose)) ^ position)
    return ((u.to(torch.float64) + 0.5) / 2.0 ** 32).to(like.dtype)


def client_normal(batch, like, purpose: str = "") -> torch.Tensor:
    """Standard normal numbers shaped like ``like``, as :func:`client_uniform` draws (Box–Muller on two of
    its uniforms: ``purpose + "/1"``, ``"/2"``)."""
    u1 = client_uniform(batch, like, purpose + "/1").to(torch.float64)
    u2 = client_uniform(batch, like, purpose + "/2").to(torch.float64)
    return (torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * torch.pi * u2)).to(like.dtype)
