"""Plugins: a user's own algorithms, models and datasets, imported before a config is validated.

A run config or a sweep file names them in ``plugins:`` (docs/extending.md):

- a path, relative to the file that names it (in ``--set`` or a Python dict: to the working folder),
  of a ``.py`` file (imported as the module named by its stem: ``mylab.py`` is ``mylab``) or of a
  package folder (a folder holding ``__init__.py``, imported as the folder's name); a bare name with
  such a file or folder beside the naming file means it;
- or a module name, imported from ``sys.path`` as Python would (an installed package).

Importing a plugin runs its ``@fedsweep.register_*`` decorators. Installed packages may declare the
entry-point group ``fedsweep.plugins`` (a module, imported, or a function, called): they are loaded
with the built-ins, without being named.

A config keeps its plugins resolved (absolute paths, module names) in ``RunConfig.plugins``, so a Ray
worker imports the same files the driver did; on a cluster node where such a path is not there, the
module the driver shipped through Ray's ``runtime_env`` (:func:`ship_paths`) is imported by its name.
Each plugin is recorded (:class:`Plugin`: module, file, content hash) beside every result.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fedsweep.util.errors import ConfigError, raised


@dataclass(frozen=True)
class Plugin:
    """A plugin as imported: its spec (a resolved path, a module name, or the entry point), the module
    it was imported as, its file (a package: its folder) and the SHA-256 of its source."""
    spec: str
    module: str
    file: str
    sha256: str
    origin: str = "plugins"          # "plugins" (named by a config) or "entry point <dist>"

    def record(self) -> dict:
        return asdict(self)


_loaded: dict[str, tuple[Plugin, tuple, float]] = {}   # spec -> (plugin, its sources' stat, when last checked)
RECHECK_SECONDS = 2.0   # a sweep validates thousands of configs naming one plugin: its files are looked at this often
_entry_points: dict[str, Plugin] = {}   # an installed plugin's record, by its entry point's value
_lock = threading.RLock()


def is_path(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or os.sep in spec or spec in (".", "..")


def resolve(specs, base: str | os.PathLike | None = None, key: str = "plugins") -> list[str]:
    """``specs`` (a config's ``plugins:``) with each path made absolute against ``base`` (default: the
    working folder), and a bare name made the path of the file or package beside ``base`` it names."""
    if specs is None:
        return []
    if isinstance(specs, str):
        specs = [specs]
    if not isinstance(specs, (list, tuple)):
        raise ConfigError(f"{key}: expected a list of module names or paths of .py files or package folders, "
                          f"got {specs!r}")
    base = Path(base) if base is not None else Path.cwd()
    out = []
    for spec in specs:
        if not isinstance(spec, str) or not spec.strip():
            raise ConfigError(f"{key}: {spec!r} is not a module name or a path of a .py file or a package folder")
        spec = spec.strip()
        if is_path(spec):
            out.append(str((base / os.path.expanduser(spec)).resolve()) if not os.path.isabs(spec)
                       else str(Path(spec).resolve()))
            continue
        beside = next((p for p in (base / f"{spec}.py", base / spec) if _is_plugin_path(p)), None)
        out.append(str(beside.resolve()) if beside is not None and "." not in spec else spec)
    return list(dict.fromkeys(out))


def _is_plugin_path(p: Path) -> bool:
    return p.is_file() and p.suffix == ".py" or (p / "__init__.py").is_file()


def load_plugins(specs: list[str], key: str = "plugins") -> list[Plugin]:
    """Import each resolved spec (once a process, again where its source changed since); one line
    naming ``key`` and the plugin for a file that is missing, an import that fails, a clash."""
    from fedsweep.config.registry import reading_as_recorded
    if reading_as_recorded():   # a reading command: the runs hold what the plugins were; run none of their code
        return []
    with _lock:
        return [_load(spec, key) for spec in specs]


def _load(spec: str, key: str) -> Plugin:
    cached = _loaded.get(spec)
    if cached is not None:
        if time.monotonic() - cached[2] < RECHECK_SECONDS:
            return cached[0]
        if _stat(cached[0].file) == cached[1]:
            _loaded[spec] = (cached[0], cached[1], time.monotonic())
            return cached[0]
    if is_path(spec):
        path = Path(spec)
        if not path.exists():
            shipped = _shipped(path)
            if shipped is None:
                raise ConfigError(f"{key}: {spec}: no such file or folder")
            plugin = shipped
        else:
            plugin = _import_path(path, key, reload=cached is not None)
    else:
        plugin = _import_module(spec, key)
    _loaded[spec] = (plugin, _stat(plugin.file), time.monotonic())
    return plugin


def module_name(path: Path) -> str:
    """The module a plugin path is imported as: a file's stem, a package folder's name."""
    return path.stem if path.suffix == ".py" else path.name


def _import_path(path: Path, key: str, reload: bool = False) -> Plugin:
    spec_text = str(path)
    if path.is_dir():
        init = path / "__init__.py"
        if not init.is_file():
            raise ConfigError(f"{key}: {path}: a folder plugin must be a package (hold an __init__.py)")
        file, locations = init, [str(path)]
    elif path.suffix != ".py":
        raise ConfigError(f"{key}: {path}: not a .py file or a package folder")
    else:
        file, locations = path, None
    name = module_name(path)
    if not name.isidentifier():
        raise ConfigError(f"{key}: {path}: {name!r} cannot be a module's name (letters, digits and _ only, not "
                          "starting with a digit); rename it")
    if name in sys.stdlib_module_names:   # imported as the standard library's, everywhere: refused by name
        raise ConfigError(f"{key}: {path}: {name!r} is the name of a module of Python's standard library, which "
                          f"every process imports as that; rename the file (e.g. {name}_plugin"
                          f"{'.py' if path.suffix == '.py' else ''})")
    present = sys.modules.get(name)
    if present is not None and not reload:
        where = _source_of(present)
        if where is not None and os.path.realpath(where) == os.path.realpath(path):
            return _plugin(str(path), present, "plugins")
        raise ConfigError(f"{key}: {path}: a module named {name!r} is already imported "
                          f"(from {where or 'built in'}); rename the file")
    spec = importlib.util.spec_from_file_location(name, file, submodule_search_locations=locations)
    module = importlib.util.module_from_spec(spec)
    before = {m: sys.modules.pop(m) for m in list(sys.modules) if m == name or m.startswith(name + ".")}
    sys.modules[name] = module   # a package's submodules are imported anew with it (their source may have changed)
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        for m in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[m]
        sys.modules.update(before)
        _forget(name)   # what it registered before the error: no half of a plugin stays
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise _import_error(key, spec_text, e) from None
    return _plugin(spec_text, module, "plugins")


def _forget(name: str) -> None:
    """Every registration made by module ``name`` or its submodules."""
    from fedsweep.config.registry import ALGORITHMS, DATASETS, MODELS
    for registry in (ALGORITHMS, MODELS, DATASETS):
        for entry in registry.entries():
            if entry.module == name or entry.module.startswith(name + "."):
                registry.remove(entry.name)


def _import_module(name: str, key: str) -> Plugin:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and name.startswith(e.name) and e.name.split(".")[0] == name.split(".")[0]:
            raise ConfigError(f"{key}: {name}: no module named {e.name!r} on this Python's path; a file or folder of "
                              "your own is named by its path, relative to the file that names it (mylab.py, "
                              "./mylab)") from None
        raise _import_error(key, name, e) from None
    except ConfigError as e:
        raise ConfigError(f"{key}: {name}: {e}") from None
    except Exception as e:  # noqa: BLE001 - any error of the user's code: one line, where it was raised
        raise _import_error(key, name, e) from None
    return _plugin(name, module, "plugins")


def _import_error(key: str, spec: str, e: BaseException) -> ConfigError:
    if isinstance(e, ConfigError):   # a registration refused (a clash, not an Algorithm, ...)
        return ConfigError(f"{key}: {spec}: {e}")
    return ConfigError(f"{key}: {spec}: importing it failed ({raised(e, skip=('importlib',), width=300)})"
                       .replace(": )", ")"))


def _source_of(module) -> str | None:
    """A module's file, or its package folder."""
    file = getattr(module, "__file__", None)
    if file is None:
        return None
    return os.path.dirname(file) if os.path.basename(file) == "__init__.py" else file


def _plugin(spec: str, module, origin: str) -> Plugin:
    where = _source_of(module) or ""
    return Plugin(spec, module.__name__, where, digest(where) if where else "", origin)


def _shipped(path: Path) -> Plugin | None:
    """On a node without the driver's files: the module Ray's runtime_env put on the path, if any."""
    name = module_name(path)
    if importlib.util.find_spec(name) is None:
        return None
    return _import_module(name, "plugins")


def _files(where: str) -> list[Path]:
    p = Path(where)
    if p.is_file():
        return [p]
    return sorted(f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc")


def digest(where: str) -> str:
    """SHA-256 of a plugin's source: a file's bytes, or every file of a package folder with its path."""
    h = hashlib.sha256()
    p = Path(where)
    for f in _files(where):
        if p.is_dir():
            h.update(str(f.relative_to(p)).encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


def _stat(where: str) -> tuple:
    try:
        return tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in _files(where)) if where else ()
    except OSError:
        return ()


def source_files(plugin: Plugin) -> list[tuple[str, Path]]:
    """(name under ``plugins/``, file) of each source file of ``plugin``, for a run's artifacts."""
    if not plugin.file:
        return []
    p = Path(plugin.file)
    if p.is_file():
        return [(p.name, p)]
    return [(f"{p.name}/{f.relative_to(p)}", f) for f in _files(plugin.file)]


# ---------------------------------------------------------------------------------------------
# Installed plugins, and what a run records
# ---------------------------------------------------------------------------------------------

def provenance(specs: list[str]) -> list[Plugin]:
    """The plugins a config's ``plugins`` name (loaded), then the installed ones."""
    from fedsweep.config.registry import load_builtins
    load_builtins()
    from fedsweep.config.registry import entry_points_loaded
    installed = [_entry_points.setdefault(value, _plugin(value, sys.modules[module], f"entry point {dist}"))
                 for value, module, dist in entry_points_loaded if module in sys.modules]
    return [*load_plugins(specs), *installed]


def ship_paths(specs: list[str]) -> list:
    """What Ray's ``runtime_env`` ``py_modules`` must carry for a cluster's nodes to import ``specs``:
    each plugin's file or package folder, and a named module's top-level package unless installed
    (under site-packages)."""
    shipped = []
    for plugin in load_plugins(specs):
        if is_path(plugin.spec):
            shipped.append(plugin.file)
            continue
        top = sys.modules[plugin.module.split(".")[0]]
        where = _source_of(top) or ""
        if where and "site-packages" not in Path(where).parts and "dist-packages" not in Path(where).parts:
            shipped.append(where)
    return list(dict.fromkeys(shipped))


def check_unchanged(saved: list[dict], key: str) -> None:
    """The plugins a run or sweep recorded (``saved``: :meth:`Plugin.record`) have the same source now;
    else one line naming ``key``, the plugin and both hashes."""
    for rec in saved or []:
        if rec.get("origin", "plugins") != "plugins":
            continue
        spec = rec["spec"]
        # a path's source is hashed where it is, without importing it (it would run the changed code);
        # on a cluster node without the driver's files, the copy Ray shipped is what runs
        if is_path(spec) and os.path.exists(spec):
            now = digest(spec)
        else:
            try:
                now = load_plugins([spec])[0].sha256
            except ConfigError:
                now = "missing"
        if now != rec.get("sha256"):
            said = "is gone" if now == "missing" else f"changed (sha256 {str(rec.get('sha256'))[:12]} then, {now[:12]} now)"
            raise ConfigError(f"{key}: plugin {rec['module']} ({rec['file']}) {said} since it started, so the rest "
                              "would be trained by other code than the start; put the file back as it was, or "
                              "start over")


def records(specs: list[str]) -> list[dict]:
    """What a run keeps of its plugins (:func:`provenance`), as plain data for checkpoints and payloads."""
    return [p.record() for p in provenance(specs)]


def plugin_tags(recorded: list[dict]) -> dict[str, str]:
    """A run's MLflow tags of its plugins: ``fedsweep.plugins`` (their modules), and per plugin
    ``fedsweep.plugin.<module>.file``, ``.sha256`` and (an installed one) ``.origin``."""
    if not recorded:
        return {}
    tags = {"fedsweep.plugins": ", ".join(r["module"] for r in recorded)}
    for r in recorded:
        tags[f"fedsweep.plugin.{r['module']}.file"] = r["file"]
        tags[f"fedsweep.plugin.{r['module']}.sha256"] = r["sha256"]
        if r.get("origin", "plugins") != "plugins":
            tags[f"fedsweep.plugin.{r['module']}.origin"] = r["origin"]
    return tags
