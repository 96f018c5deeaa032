"""The typed configuration (``schema``: pydantic models, one line per user error), the algorithm
registry (``registry``), the dataset catalogue (``catalog``) and the generated option reference
(``reference``: ``python -m fedsweep.config.reference > docs/config.md``).

Imports only :mod:`fedsweep.util` at module level; algorithms are found by name, at the first lookup
(``registry``), so every other layer can import the config without importing torch.
"""
