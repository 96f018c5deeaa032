"""A process's start-up without Python's cyclic garbage collector, and what it imported frozen after.

Importing what training needs (torch; Lightning, which imports torchmetrics, torchvision, scipy and
matplotlib; Ray Tune) makes ~560,000 objects that live as long as the process, and no garbage. While
they are made, the collector's full pass runs again and again over all of them: six passes of 45 to
205 ms in a Ray worker's first trial (``gc.callbacks``), and ``import lightning, ray.tune,
fedsweep.runs.run`` takes 3.4 s with the collector on, 2.5 s with it off (2 CPU cores; benchmarks/README.md).

So the entry points, every ``fedsweep`` command but ``bench`` and a sweep's Ray worker, call
:func:`pause_collector` first, and :func:`end_startup` once the heavy imports are done (``config``,
``algorithms`` and ``datasets`` end right after theirs and never need to). It moves every object
alive then into the permanent generation (``gc.freeze``), which the collector never walks again,
and turns the collector back on for what the process makes after.
Objects are still freed by reference counting as before; only cycles made during start-up itself
(a few dozen objects, as the passes above found) stay.

Once per process: a second pause (a Ray worker's next trial) does nothing. A process that never
paused (a test, a notebook calling ``fedsweep.runs.run.train``) is left as it is, collector and all.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager

_paused = False   # the collector is off for start-up (and this module turned it off)
_ended = False    # start-up ended in this process: nothing more to pause or freeze


def pause_collector() -> None:
    """Turn the cyclic collector off for this process's start-up, unless start-up already ended here
    or something else turned it off."""
    global _paused
    if not _ended and not _paused and gc.isenabled():
        gc.disable()
        _paused = True


def end_startup() -> None:
    """If :func:`pause_collector` paused the collector: freeze what start-up made, turn it back on."""
    global _paused, _ended
    if _paused:
        gc.freeze()
        gc.enable()
        _paused = False
        _ended = True


@contextmanager
def startup_imports():
    """``with startup_imports(): import ...``: the imports inside without the collector, then
    :func:`end_startup` (also when an import fails)."""
    pause_collector()
    try:
        yield
    finally:
        end_startup()
