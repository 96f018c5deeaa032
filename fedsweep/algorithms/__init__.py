"""Algorithm registry: name -> Algorithm class. Adding an algorithm = one file + one line here."""
from __future__ import annotations

from fedsweep.config import ConfigError

_REGISTRY: dict[str, type] = {}


def register(cls):
    _REGISTRY[cls.name] = cls
    return cls


# The algorithm modules, imported for their @register side effect: one entry per file.
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


def _load_all() -> None:
    import importlib
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
