"""Checks that an output location can be written, made before any work starts (they write nothing).

Each raises :class:`~fedsweep.config.schema.ConfigError` with one line naming the option, e.g.
``--output-json out/x/a.json: cannot write there: /abs/out/x is a file, not a folder``.
A missing folder is fine when it can be created: its nearest existing ancestor must be a writable
folder (the caller creates it when it writes). Permission checks use :func:`os.access`, so they
are advisory for root and on network file systems; a regular file in the way is always caught.
"""
from __future__ import annotations

import os
from pathlib import Path

from fedsweep.config.schema import ConfigError


def _dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot be (made) a writable folder, or None if it can."""
    if path.exists():
        if not path.is_dir():
            return f"{path} is a file, not a folder"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"folder {path} is not writable"
        return None
    parent = path
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():   # a regular file (or a dangling link) where a folder must go
        return f"{parent} is {'a file' if parent.exists() else 'a broken link'}, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"folder {parent} is not writable"
    return None


def check_writable_dir(path: str | os.PathLike, key: str) -> None:
    """``path`` is a writable folder, or one that can be created; ``key`` names the option in the error
    (e.g. ``"--checkpoint-dir"``, ``"--storage"``). Creates nothing."""
    problem = _dir_problem(Path(os.path.abspath(os.path.expanduser(path))))
    if problem:
        raise ConfigError(f"{key} {path}: {problem}")


def check_writable_file(path: str | os.PathLike, key: str) -> None:
    """``path`` can be written as a file: not a folder, writable if it exists, and its folder exists
    or can be created (the writer should ``mkdir(parents=True, exist_ok=True)`` it). Creates nothing."""
    p = Path(os.path.abspath(os.path.expanduser(path)))
    if p.is_dir():
        raise ConfigError(f"{key} {path}: is a folder; give a file name")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise ConfigError(f"{key} {path}: the file exists and is not writable")
        return
    problem = _dir_problem(p.parent)
    if problem:
        raise ConfigError(f"{key} {path}: cannot write there: {problem}")
