"""Matplotlib's folder where HOME cannot be written.

Matplotlib keeps its settings and font cache in ~/.config/matplotlib and ~/.cache/matplotlib
(``$XDG_CONFIG_HOME``, ``$XDG_CACHE_HOME``). Where it cannot make them (a read-only HOME, a HOME that
is not a folder) it uses a temporary folder, removed at exit, and says so in two warning lines every
time it is imported: in every `fedsweep run`, `tune` and `report`, whose Lightning imports it
(through torchmetrics) before fedsweep's own plots do. :func:`use_writable_config_dir` gives it such
a folder first, through ``MPLCONFIGDIR``: the same outcome without the warnings. Ray's processes that a
sweep starts afterwards inherit the variable, so its workers share the one folder (matplotlib locks its
font cache for that) while the driver lives.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def _default_dirs_writable() -> bool:
    """Whether matplotlib can make and write its default folders (what it tries on import, Linux)."""
    try:
        home = Path.home()
    except RuntimeError:   # no HOME and no password entry: matplotlib falls back to a temporary folder
        return False
    for base in (os.environ.get("XDG_CONFIG_HOME") or home / ".config",
                 os.environ.get("XDG_CACHE_HOME") or home / ".cache"):
        folder = Path(base, "matplotlib")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return False
        if not (folder.is_dir() and os.access(folder, os.W_OK)):
            return False
    return True


def use_writable_config_dir() -> None:
    """Before matplotlib's first import: where its default folders cannot be written, set
    ``MPLCONFIGDIR`` to a new temporary folder, removed at exit. Nothing if ``MPLCONFIGDIR`` is set,
    the defaults work, or matplotlib was imported already."""
    if os.environ.get("MPLCONFIGDIR") or "matplotlib" in sys.modules:
        return
    if not sys.platform.startswith(("linux", "freebsd")) or _default_dirs_writable():   # elsewhere: ~/.matplotlib
        return
    import atexit
    import shutil
    import tempfile
    folder = tempfile.mkdtemp(prefix="fedsweep-matplotlib-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["MPLCONFIGDIR"] = folder
