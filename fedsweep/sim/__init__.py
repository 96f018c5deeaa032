"""The simulation contract's pieces below the engines: counter-based random draws (``rng``), the
round plan of who trains how much (``heterogeneity``) and the models (``models``).
Imports :mod:`fedsweep.config` and :mod:`fedsweep.util` only (docs/design.md §2)."""
