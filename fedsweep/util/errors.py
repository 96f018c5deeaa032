"""The user-error type every layer raises: imported by config, the registry, data and the CLI alike.

It lives in its own module, below everything else, so that no layer has to import another just to
raise it (``fedsweep.config.schema`` re-exports it, so ``from fedsweep.config.schema import ConfigError`` works).
"""
from __future__ import annotations


class ConfigError(Exception):
    """A user error in a config: the message is one line naming the key and what is allowed.

    Not a ValueError on purpose: pydantic would wrap a ValueError raised in a validator into a
    ValidationError and prefix it; this one propagates with its message intact."""


def raised(e: BaseException, skip: tuple[str, ...] = (), width: int = 200) -> str:
    """``Type: its first line at file:line`` of an exception from a user's code (a plugin, a model, a
    dataset function), for a one-line error: the place is the innermost frame whose file holds none of
    ``skip`` (torch's own frames, say), so the line points at the user's code."""
    import traceback
    if isinstance(e, SyntaxError) and e.filename:   # where the mistake is, not where the file was loaded
        return f"{type(e).__name__}: {(e.msg or '')[:width]} at {e.filename}:{e.lineno}"
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not any(s in f.filename for s in skip)]
    at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:width]}{at}"


def user_frame(e: BaseException):
    """The innermost frame of ``e``'s traceback, if it is in a user's code: a file outside fedsweep, the
    installed packages and Python's own library (a plugin's hook, a model, a dataset function); else None."""
    import os
    import sysconfig
    import traceback
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return None
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the fedsweep package
    system = {os.path.realpath(p) for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                            sysconfig.get_paths()["platlib"])}
    last = frames[-1]
    path = os.path.realpath(last.filename)
    if last.filename.startswith("<") or path.startswith(os.path.realpath(here) + os.sep) or \
            any(path.startswith(p + os.sep) for p in system) or "site-packages" in path.split(os.sep):
        return None
    return last
