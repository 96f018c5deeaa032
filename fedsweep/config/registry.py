"""Algorithm registry: name -> Algorithm class. Adding an algorithm = one file + one line in MODULES.

Layers run one way: ``errors`` <- ``registry`` <- ``config`` <- (heterogeneity, data, ...) <-
``algorithms.*``. This module imports only :mod:`fedsweep.util.errors` at import time; the algorithm
modules (which import ``fedsweep.config.schema`` through ``algorithms.base``) are imported lazily, on the
first lookup, so ``fedsweep.config.schema`` can import this module at its top.
"""
from __future__ import annotations

import functools
import importlib

from fedsweep.util.errors import ConfigError

_REGISTRY: dict[str, type] = {}

# The algorithm modules (in fedsweep/algorithms/), imported for their @register side effect.
MODULES = (
    "fedavg",
    "fedlga",
    "scaffold",
    "feddyn",
    "fedprox",
    "fednova",
    "fedcm",
    "mimelite",
    "fedsam",
    "hybrid",
    "lossaware",
)


def register(cls):
    _REGISTRY[cls.name] = cls
    return cls


@functools.cache
def _load_all() -> None:
    """Import the algorithm modules, once: a sweep looks an algorithm up twice per trial it validates,
    and re-asking the import system for 11 modules each time was a third of that validation. (An import
    that fails is not cached: the next lookup tries again and raises again.)"""
    for module in MODULES:
        importlib.import_module(f"fedsweep.algorithms.{module}")


def get_algorithm_class(name: str) -> type:
    _load_all()
    if name not in _REGISTRY:
        raise ConfigError(f"algorithm.name: unknown algorithm {name!r}; allowed: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def available() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def description(name: str) -> str:
    """The first paragraph of the algorithm's module docstring, on one line (what `fedsweep
    algorithms` and docs/config.md show)."""
    import sys
    module = sys.modules[get_algorithm_class(name).__module__]
    return " ".join((module.__doc__ or "").strip().split("\n\n")[0].split())
