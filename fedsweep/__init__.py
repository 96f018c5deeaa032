"""fedsweep: simulate system-heterogeneous federated learning and sweep its hyperparameters.

The public API, imported on first use so that ``import fedsweep`` stays cheap:

- runs, sweeps and reports from Python (docs/api.md): :func:`run` (one config; a :class:`RunResult`
  with its summary, metric history and model), :func:`tune` (a sweep on Ray Tune; its trials as a
  pandas DataFrame; :class:`SweepError` where it did not end whole) and :func:`report` (a sweep's
  report; a :class:`ReportResult` with its tables);
- your own components, used by name in any config or sweep file once the file that registers them
  is named in ``plugins:`` (docs/extending.md): :func:`register_algorithm` (a subclass of
  :class:`Algorithm`), :func:`register_model` (an ``nn.Module`` class or factory),
  :func:`register_dataset` (a function returning a :class:`Source`).
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "register_algorithm": "fedsweep.config.registry",
    "register_model": "fedsweep.config.registry",
    "register_dataset": "fedsweep.config.registry",
    "Algorithm": "fedsweep.algorithms.base",
    "ModelOps": "fedsweep.algorithms.base",
    "RoundPlan": "fedsweep.sim.heterogeneity",
    "SetupContext": "fedsweep.algorithms.base",
    "client_uniform": "fedsweep.sim.rng",
    "client_normal": "fedsweep.sim.rng",
    "generator": "fedsweep.sim.rng",
    "Source": "fedsweep.data.contract",
    "ConfigError": "fedsweep.util.errors",
    "run": "fedsweep.api",
    "tune": "fedsweep.api",
    "report": "fedsweep.api",
    "RunResult": "fedsweep.api",
    "SweepError": "fedsweep.api",
    "ReportResult": "fedsweep.reports.write",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedsweep' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
