"""The algorithms, one module (a family) each, registered through the same registry as a user's
(:mod:`fedsweep.config.registry`, whose ``BUILTINS`` lists these modules).

``register`` (= ``fedsweep.register_algorithm``), ``available`` and ``get_algorithm_class`` are
re-exported here, so the algorithm modules' ``from fedsweep.algorithms import register`` and callers'
lookups read as they always have.
"""
from __future__ import annotations

from fedsweep.config.registry import available, get_algorithm_class, register, register_algorithm

__all__ = ["available", "get_algorithm_class", "register", "register_algorithm"]
