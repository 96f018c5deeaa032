"""Counter-based randomness: every draw derives from ``(seed, round, purpose)``.

Nothing in fedsweep uses the global RNG for simulation draws. A run resumed at round t therefore
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
