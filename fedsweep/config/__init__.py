"""The typed configuration (``schema``: pydantic models, one line per user error), the registries of
algorithms, models and datasets (``registry``), the plugins that add to them (``plugins``), their
listing (``listing``) and the generated option reference (``reference``: ``python -m
fedsweep.config.reference > docs/config.md``).

Imports only :mod:`fedsweep.util` at module level; components are found by name, at the first lookup
(``registry``), so every other layer can import the config without importing torch.
"""
