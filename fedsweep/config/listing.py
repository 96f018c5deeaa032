"""``fedsweep algorithms | models | datasets [FILE]``: what is registered, fedsweep's and the plugins
of FILE, with each one's options and where it comes from. Reads the registries, imports no torch
(a plugin's own imports aside)."""
from __future__ import annotations

import textwrap
from pathlib import Path

from fedsweep.config.registry import ALGORITHMS, DATASETS, MODELS, Entry
from fedsweep.util.errors import ConfigError

REGISTRIES = {"algorithms": (ALGORITHMS, "algorithm."), "models": (MODELS, "model.options."),
              "datasets": (DATASETS, "data.options.")}


def load_file_plugins(path: str, key: str = "FILE") -> list:
    """Import the plugins ``path`` names: a plugin itself (a ``.py`` file or a package folder), or a run
    config or sweep file whose ``plugins:`` (a sweep's top-level and its base's) are imported, relative
    to it. Only the plugins: the rest of the file is not validated."""
    from fedsweep.config.plugins import load_plugins, resolve
    from fedsweep.config.schema import load_yaml, with_plugins
    p = Path(path)
    if p.suffix == ".py" or p.is_dir():
        if not p.exists():
            raise ConfigError(f"{key} {path}: no such file or folder")
        return load_plugins(resolve([str(p)]), key)
    raw = load_yaml(p) or {}
    specs = with_plugins(raw, p).get("plugins", [])
    if isinstance(raw.get("base"), dict):
        specs += with_plugins(raw["base"], p).get("plugins", [])
    try:
        return load_plugins(list(dict.fromkeys(specs)))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def list_components(kind: str, path: str | None = None, width: int = 100) -> str:
    """The listing of ``kind`` (``algorithms``, ``models``, ``datasets``): fedsweep's, then those of the
    plugins ``path`` names (each with its module and file)."""
    if path is not None:
        load_file_plugins(path)
    registry, prefix = REGISTRIES[kind]
    entries = registry.entries()
    own = [e for e in entries if e.builtin]
    other = [e for e in entries if not e.builtin]
    lines = [line for e in own for line in _lines(e, prefix, width)]
    if other:
        lines += ["", f"{kind} of plugins:"] + [line for e in other for line in _lines(e, prefix, width)]
    return "\n".join(lines) + "\n"


def _lines(e: Entry, prefix: str, width: int) -> list[str]:
    lines = textwrap.wrap(e.description() or "(no docstring)", width=width, initial_indent=f"{e.name:<14} ",
                          subsequent_indent=" " * 15, break_on_hyphens=False)
    if not e.builtin:
        lines.append(f"    from {e.where()}")
    for key, field in e.options.model_fields.items():
        default = "required" if field.is_required() else f"default {field.get_default(call_default_factory=True)!r}"
        about = f": {field.description}" if field.description else ""
        lines.append(f"    {prefix}{key} ({default}){about}")
    for name in e.takes if not e.builtin else ():
        if name != "seed":
            lines.append(f"    data.{name}: passed as its `{name}`")
    return lines
