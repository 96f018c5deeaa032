"""torch imported on its first use, for the modules that code which trains nothing reads.

``fedsweep config``, ``algorithms`` and ``report`` read the algorithms' declarations (their
``Params``, in the algorithm modules) and the run plan's types; a sweep's driver also splits its
trials' data (numpy) and summarizes, formats and logs their results (``fedsweep.runs.run``'s helpers).
None of them trains, and importing torch was ~0.8 s of each (of 1.2 s for ``config``; of the
driver's start-up, before Ray starts). So those modules (``rng``, ``heterogeneity``, ``run``,
``algorithms/*``, ``data``) name torch through :data:`torch` below, which imports it at the first
attribute read: in a trial, as soon as it builds anything.

Not ``importlib.util.LazyLoader`` in ``sys.modules``: on Python 3.11 any other module's
``import torch`` reads the lazy module's ``__spec__``, which loads it at once. This object is only
these modules' name for torch; everyone else imports torch as usual.
"""
from __future__ import annotations

import importlib


class LazyModule:
    """Module ``name``, imported at the first attribute read. Each attribute read is kept on this
    object, so a later read of it is a plain attribute read, as from the module itself."""

    def __init__(self, name: str):
        self._lazy_name = name

    def __getattr__(self, attr: str):
        value = getattr(importlib.import_module(self._lazy_name), attr)
        setattr(self, attr, value)
        return value

    def __repr__(self) -> str:
        return f"<{self._lazy_name}, imported on first use>"


torch = LazyModule("torch")
