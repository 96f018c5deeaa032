"""The user-error type every layer raises: imported by config, the registry, data and the CLI alike.

It lives in its own module, below everything else, so that no layer has to import another just to
raise it (``fedsweep.config.schema`` re-exports it, so ``from fedsweep.config.schema import ConfigError`` works).
"""
from __future__ import annotations


class ConfigError(Exception):
    """A user error in a config: the message is one line naming the key and what is allowed.

    Not a ValueError on purpose: pydantic would wrap a ValueError raised in a validator into a
    ValidationError and prefix it; this one propagates with its message intact."""
