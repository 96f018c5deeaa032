"""The registries: one per kind of component (algorithms, models, datasets), name -> what builds it.

fedsweep's own components register exactly as a user's plugin does, through
:func:`register_algorithm`, :func:`register_model` and :func:`register_dataset` (exported as
``fedsweep.register_*``): the modules of :data:`BUILTINS` are imported at the first lookup, as pytest
imports its built-in plugins, then every installed package's ``fedsweep.plugins`` entry point, then
the plugins a config names (:mod:`fedsweep.config.plugins`). A name registered from two modules is
refused in one line naming both.

A model or a dataset takes its own options (``model.options``, ``data.options``) as keyword
arguments: they are read from its signature (:func:`options_model`), so an unknown or missing option
is one line naming the allowed ones, before anything runs, and ``docs/config.md`` lists each one's.

This module imports only :mod:`fedsweep.util.errors` at import time; the built-in modules are
imported at the first lookup, so ``fedsweep.config.schema`` can import this one at its top and a
command that trains nothing never imports torch (the built-ins' registrations import none).
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib
import inspect
import sys
import threading
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from fedsweep.util.errors import ConfigError

#: The modules whose import registers fedsweep's own algorithms, models and datasets.
BUILTINS = (
    "fedsweep.algorithms.fedavg",
    "fedsweep.algorithms.fedlga",
    "fedsweep.algorithms.scaffold",
    "fedsweep.algorithms.feddyn",
    "fedsweep.algorithms.fedprox",
    "fedsweep.algorithms.fednova",
    "fedsweep.algorithms.fedcm",
    "fedsweep.algorithms.mimelite",
    "fedsweep.algorithms.fedsam",
    "fedsweep.algorithms.hybrid",
    "fedsweep.algorithms.lossaware",
    "fedsweep.algorithms.personal",
    "fedsweep.algorithms.fairness",
    "fedsweep.sim.zoo",
    "fedsweep.data.builtin",
)
ENTRY_POINT_GROUP = "fedsweep.plugins"

#: What a dataset function may take by name besides its options: fedsweep passes the config's values.
DATASET_CONTEXT = ("seed", "num_clients", "test_fraction", "root", "download")


@dataclass
class Entry:
    """One registered component: ``obj`` (the class or function), the module that registered it,
    its options (a pydantic model; an algorithm's ``Params``) and what else it declared."""
    kind: str
    name: str
    obj: Any
    module: str
    options: Any = None
    takes: tuple[str, ...] = ()          # dataset: the DATASET_CONTEXT names its function takes
    extra: dict = field(default_factory=dict)

    @property
    def builtin(self) -> bool:
        return self.module in BUILTINS

    def where(self) -> str:
        """The registering module, with its file where it is not one of fedsweep's own."""
        return _module_where(self.module)

    def description(self) -> str:
        """The first paragraph of its docstring (a class without one: its module's), on one line."""
        doc = self.obj.__dict__.get("__doc__") if inspect.isclass(self.obj) else self.obj.__doc__
        if not doc:
            doc = getattr(sys.modules.get(self.module), "__doc__", None) or ""
        return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


class Registry:
    def __init__(self, kind: str, key: str):
        self.kind, self.key = kind, key          # key: the config key that names one (model.name)
        self._entries: dict[str, Entry] = {}

    def add(self, entry: Entry) -> None:
        old = self._entries.get(entry.name)
        if old is not None and old.module != entry.module:
            raise ConfigError(f"{self.kind} {entry.name!r} is registered twice: by {old.where()} and by "
                              f"{_module_where(entry.module)}; rename one of them")
        self._entries[entry.name] = entry    # the same module again (a re-run notebook cell): the newer

    def remove(self, name: str) -> None:
        """Forget ``name`` (a test's or a check's component registered for a while); no error if absent."""
        self._entries.pop(name, None)

    def get(self, name: str) -> Entry:
        load_builtins()
        if isinstance(name, str) and name not in self._entries and _as_recorded.get():
            return self._recorded(name)
        if not isinstance(name, str) or name not in self._entries:
            failed = f"; {'; '.join(broken)}, and may register it" if broken else ""
            raise ConfigError(f"{self.key}: unknown {self.kind} {name!r}; allowed: {', '.join(self.names())}"
                              f"{_PLUGIN_HINT}{failed}")
        return self._entries[name]

    def _recorded(self, name: str) -> Entry:
        """A stand-in for a component no registry holds, read under :func:`as_recorded`: any options, no
        checks of its own (the runs that used it hold what it was)."""
        from pydantic import ConfigDict, create_model
        options = create_model(f"{name} options (as recorded)", __config__=ConfigDict(extra="allow"))
        obj: Any = lambda **kwargs: None   # noqa: E731 - never called: a reading command builds nothing
        if self is ALGORITHMS:
            obj = type(f"Recorded_{name}", (_BASE[0],), {"name": name, "Params": options,
                                                         "__doc__": "(as recorded: not imported)"})
        return Entry(self.kind, name, obj, "(as recorded)", options, takes=DATASET_CONTEXT)

    def names(self) -> list[str]:
        load_builtins()
        return sorted(self._entries)

    def entries(self) -> list[Entry]:
        return [self._entries[n] for n in self.names()]


_PLUGIN_HINT = (" (your own: name its file in `plugins:` of the config, or give it to `fedsweep check` and `bench` "
                "as `--plugins FILE`; docs/extending.md)")

ALGORITHMS = Registry("algorithm", "algorithm.name")
MODELS = Registry("model", "model.name")
DATASETS = Registry("dataset", "data.name")


_as_recorded: contextvars.ContextVar[bool] = contextvars.ContextVar("fedsweep_as_recorded", default=False)


@contextlib.contextmanager
def as_recorded():
    """What reading commands (``fedsweep report``, ``ui``) read a sweep or run config under: no plugin is
    imported (:func:`fedsweep.config.plugins.load_plugins` imports nothing), and a name no registry
    holds stands for what the runs recorded. Reading a colleague's results runs none of their code,
    and works where their plugin file is gone."""
    token = _as_recorded.set(True)
    try:
        yield
    finally:
        _as_recorded.reset(token)


def reading_as_recorded() -> bool:
    """Whether this is read under :func:`as_recorded`."""
    return _as_recorded.get()


def _module_where(module: str) -> str:
    file = getattr(sys.modules.get(module), "__file__", None)
    return f"{module} ({file})" if file and module not in BUILTINS else module


# ---------------------------------------------------------------------------------------------
# Loading: the built-ins, then the installed plugins (entry points)
# ---------------------------------------------------------------------------------------------

_state = {"loaded": False, "loading": False}
_lock = threading.RLock()   # a Ray worker validates configs in its trials' threads


def load_builtins() -> None:
    """Import the built-in modules and the installed packages' ``fedsweep.plugins`` entry points,
    once a process (a module that fails to import is tried again at the next lookup, and fails again).
    A lookup made while they load (by one of them) sees what has registered so far."""
    if _state["loaded"]:
        return
    with _lock:
        if _state["loaded"] or _state["loading"]:
            return
        _state["loading"] = True
        try:
            for module in BUILTINS:
                importlib.import_module(module)
            load_entry_points()
            _state["loaded"] = True
        finally:
            _state["loading"] = False


#: Set (to anything but 0) to skip installed plugins, as PYTEST_DISABLE_PLUGIN_AUTOLOAD does for pytest.
NO_ENTRY_POINTS = "FEDSWEEP_DISABLE_PLUGIN_AUTOLOAD"

#: One line per installed plugin that failed to load: said once as a warning, and again where a config
#: names something fedsweep does not know (what it registers may be that).
broken: list[str] = []

#: (entry point's value, its module, its distribution) of each installed plugin loaded: what a run records
#: of them (:func:`fedsweep.config.plugins.provenance`).
entry_points_loaded: list[tuple[str, str, str]] = []


def load_entry_points() -> None:
    """Every installed package's ``fedsweep.plugins`` entry points, once (with the built-ins). One that
    fails to load is one warning line on stderr, not an error: the commands that do not use what it
    registers go on, and one that does names it (:data:`broken`). ``$FEDSWEEP_DISABLE_PLUGIN_AUTOLOAD``
    skips them all."""
    import os
    from importlib.metadata import entry_points
    if os.environ.get(NO_ENTRY_POINTS, "").strip() not in ("", "0"):
        return
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "?"
        what = f"installed plugin {ep.name!r} ({dist}: {ep.value})"
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, type(sys)):
                obj()
        except Exception as e:  # noqa: BLE001 - one line naming the package, not a traceback
            first = (str(e).strip().splitlines() or [""])[0][:300]
            broken.append(f"{what} failed to load ({type(e).__name__}: {first})")
            print(f"fedsweep: warning: {broken[-1]}; what it registers is unavailable: uninstall or fix it "
                  f"({NO_ENTRY_POINTS}=1 skips installed plugins)", file=sys.stderr, flush=True)
            continue
        if ep.module in sys.modules:
            entry_points_loaded.append((ep.value, ep.module, dist))


# ---------------------------------------------------------------------------------------------
# Registering
# ---------------------------------------------------------------------------------------------

#: ``fedsweep.Algorithm``, given by its module when it is defined (:func:`algorithm_base`): the registry,
#: a floor below the algorithms, checks subclasses of it without importing them.
_BASE: list[type] = []


def algorithm_base(cls: type) -> type:
    """Mark ``cls`` as the class every registered algorithm subclasses (``fedsweep.Algorithm``)."""
    _BASE[:] = [cls]
    return cls


def register_algorithm(cls):
    """Register an algorithm: a subclass of ``fedsweep.Algorithm`` with a ``name`` (what
    ``algorithm.name`` and a sweep's ``methods:`` call it) and optionally ``Params``, a pydantic model
    of its parameters (set under ``algorithm:`` beside ``name``). Used bare, as a class decorator."""
    from pydantic import BaseModel
    what = getattr(cls, "__qualname__", repr(cls))
    if not (inspect.isclass(cls) and _BASE and issubclass(cls, _BASE[0])):
        raise ConfigError(f"register_algorithm: {what} is not a subclass of fedsweep.Algorithm")
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"register_algorithm: {what} needs a class attribute `name`, a Python identifier "
                          f"(what `algorithm.name` calls it), got {name!r}")
    if not (inspect.isclass(cls.Params) and issubclass(cls.Params, BaseModel)):
        raise ConfigError(f"register_algorithm: {what}.Params must be a pydantic BaseModel of its parameters")
    _first_builtins()
    ALGORITHMS.add(Entry("algorithm", name, cls, cls.__module__, options=cls.Params))
    return cls


def register_model(name: str, *, input_shape: tuple[int, ...] | None = None):
    """Register a model under ``name``: an ``nn.Module`` class or a factory, called as
    ``f(input_shape, num_classes, **model.options)``; its keyword parameters are its options.
    ``input_shape``: the input it is made for, (C, H, W) or (d,), where ``fedsweep bench`` and
    ``fedsweep check`` time or try it (default (1, 8, 8))."""
    _check_name("register_model", name)

    def decorate(obj):
        what = getattr(obj, "__qualname__", repr(obj))
        if not callable(obj):
            raise ConfigError(f"register_model({name!r}): {what} is not a class or a function")
        if inspect.isclass(obj):
            from fedsweep.util.lazy import torch
            if not issubclass(obj, torch.nn.Module):
                raise ConfigError(f"register_model({name!r}): {what} is a class but not a torch.nn.Module")
        params = _parameters(obj)
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in params):
            raise ConfigError(f"register_model({name!r}): {what} must take (input_shape, num_classes, **options); "
                              f"it takes ({', '.join(p.name for p in params)})")
        skip = {p.name for p in positional[:2]}
        _first_builtins()
        MODELS.add(Entry("model", name, obj, obj.__module__, options=options_model(obj, f"model {name!r}", skip),
                         extra={"input_shape": tuple(input_shape) if input_shape else None}))
        return obj
    return decorate


def register_dataset(name: str, *, preflight: bool = True, check: Callable | None = None,
                     check_files: Callable | None = None):
    """Register a dataset under ``name``: a function called as ``f(seed=seed, **data.options)`` that
    returns a ``fedsweep.Source``; its keyword parameters are its options, except these, which it gets
    from the config when it names them: ``num_clients``, ``test_fraction``, ``root``, ``download``.

    ``preflight``: a sweep's driver makes it (and its split over the clients) once per distinct set-up
    before Ray starts, so a split that cannot be made is one line before any trial runs; False for data
    that is slow to load or lives only on a cluster's nodes. ``check(data_config)``: more checks of the
    config that need no data (a ConfigError naming the key). ``check_files(data_config)``: what a sweep
    run on this machine checks before Ray, without loading (its files are there)."""
    _check_name("register_dataset", name)

    def decorate(fn):
        what = getattr(fn, "__qualname__", repr(fn))
        if not callable(fn) or inspect.isclass(fn):
            raise ConfigError(f"register_dataset({name!r}): {what} is not a function")
        takes = tuple(p.name for p in _parameters(fn) if p.name in DATASET_CONTEXT)
        _first_builtins()
        DATASETS.add(Entry("dataset", name, fn, fn.__module__,
                           options=options_model(fn, f"dataset {name!r}", set(DATASET_CONTEXT)), takes=takes,
                           extra={"preflight": preflight, "check": check, "check_files": check_files,
                                  "root_required": _required(fn, "root")}))
        return fn
    return decorate


def _first_builtins() -> None:
    """A plugin's registration waits for the built-ins, so a clash with one is seen whatever loads first."""
    if not _state["loading"]:
        load_builtins()


def _check_name(where: str, name) -> None:
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise ConfigError(f"{where}: the name must be a non-empty string without spaces, got {name!r} "
                          f"(use it as @{where}('my_name'))")


def _parameters(obj) -> list[inspect.Parameter]:
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return []
    return params[1:] if inspect.isclass(obj) and params and params[0].name == "self" else params


def _required(fn, name: str) -> bool:
    p = next((p for p in _parameters(fn) if p.name == name), None)
    return p is not None and p.default is inspect.Parameter.empty


def options_model(obj, title: str, skip: set[str] = frozenset()):
    """A pydantic model of ``obj``'s keyword parameters but ``skip``: each parameter's annotation (an
    ``Annotated[..., Field(...)]`` gives its bounds and description) and default; one without a
    default is required. Unknown keys are refused, unless ``obj`` takes ``**kwargs``."""
    from pydantic import ConfigDict, create_model
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: that parameter takes anything
        hints = {}
    fields, extra = {}, "forbid"
    for p in _parameters(obj):
        if p.kind is p.VAR_KEYWORD:
            extra = "allow"
        if p.name in skip or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            continue
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (hints.get(p.name, Any), default)
    # protected_namespaces=(): an option may well be called model_size
    return create_model(f"{title} options", __config__=ConfigDict(extra=extra, allow_inf_nan=False,
                                                                  arbitrary_types_allowed=True,
                                                                  protected_namespaces=()), **fields)


def check_options(entry: Entry, options: dict, key: str) -> dict:
    """``options`` as ``entry`` takes them, defaults filled in, or a ConfigError naming ``key``'s bad one."""
    from pydantic import ValidationError
    if not isinstance(options, dict):
        raise ConfigError(f"{key}: expected a mapping of the {entry.kind}'s options, got {options!r}")
    try:
        return entry.options(**options).model_dump()
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden" and entry.kind == "dataset" and loc in DATASET_CONTEXT:
            if loc == "seed":
                raise ConfigError(f"{key}.seed: not an option: fedsweep hands every dataset that takes it the run's "
                                  "seed (the top-level key seed; a sweep's seeds:)") from None
            raise ConfigError(f"{key}.{loc}: not an option but a key of the data section itself, which fedsweep "
                              f"hands to every dataset that takes it; set data.{loc} (not under data.options)") from None
        if err["type"] == "extra_forbidden":
            raise ConfigError(f"{key}.{loc}: unknown option of {entry.kind} {entry.name!r}; "
                              f"{option_list(entry)}") from None
        if err["type"] == "missing":
            raise ConfigError(f"{key}.{loc}: {entry.kind} {entry.name!r} needs it; {option_list(entry)}") from None
        msg = err["msg"].removeprefix("Value error, ")
        raise ConfigError(f"{key}.{loc}: {msg} (got {err.get('input')!r})") from None


def option_list(entry: Entry) -> str:
    """``allowed: width (required), depth (default 2)`` for messages."""
    shown = [f"{n} (required)" if f.is_required() else f"{n} (default {f.default!r})"
             for n, f in entry.options.model_fields.items()]
    return f"allowed: {', '.join(shown)}" if shown else f"{entry.kind} {entry.name!r} takes no options"


# ---------------------------------------------------------------------------------------------
# The algorithm lookups the rest of fedsweep has always used
# ---------------------------------------------------------------------------------------------

register = register_algorithm


def get_algorithm_class(name: str) -> type:
    return ALGORITHMS.get(name).obj


def available() -> list[str]:
    return ALGORITHMS.names()


def description(name: str) -> str:
    """An algorithm's description (``fedsweep algorithms``, docs/config.md)."""
    return ALGORITHMS.get(name).description()
