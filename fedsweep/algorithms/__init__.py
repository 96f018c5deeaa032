"""The algorithms, one module each (listed in ``fedsweep.config.registry.MODULES``).

The registry itself lives in :mod:`fedsweep.config.registry`; it is re-exported here so the algorithm
modules' ``from fedsweep.algorithms import register`` and callers' ``available`` /
``get_algorithm_class`` keep working.
"""
from __future__ import annotations

from fedsweep.config.registry import MODULES, available, get_algorithm_class, register

__all__ = ["MODULES", "available", "get_algorithm_class", "register"]
