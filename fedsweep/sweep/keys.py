"""What a key means in a sweep's ``grid:``, a method's own grid and ``search.space``: config values
its trials take, each set in one place, a mapping merging into its section (docs/sweeps.md, "What a
key means in a grid"). :func:`build_config_of` applies a trial's keys to ``base``; :func:`check_keys`
refuses what a key cannot mean.

Each of these ran other trials than the file says, silently, and is refused before anything runs,
in one line naming where:

- ``algorithm.name`` (dotted, or as ``name`` in an ``algorithm:`` mapping): a trial's algorithm is
  its method, which names its run, its ``fedsweep.method`` tag and its report row; a grid that set
  another would run FedProx under FedAvg's name. In a method's own grid the method's name itself is
  allowed (it says what the method does anyway).
- ``seed``: every config runs once per entry of ``seeds:``, which would override it.
- ``mlflow.*``: the driver logs every trial to the sweep's one store and experiment and names each run
  by the keys the sweep varies, so no trial's mlflow keys are used.
- a key given twice across ``grid``, a method's grid and ``search.space``, or a key and its section
  (``local`` and ``local.lr``): a trial would take one of the two, by the order they are applied.
- with ``searcher: optuna``, a ``choice`` of mappings naming different keys: a slot's config holds
  the first choice until its values are drawn, and a drawn mapping sets only the keys it names.
"""
from __future__ import annotations

from typing import Any

from fedsweep.config.schema import ConfigError, RunConfig, copy_tree, flatten, set_dotted, validate_raw

METHODS_RULE = ("a sweep's algorithms are its methods, one entry each under `methods:` (e.g. methods: {fedavg: {}, "
                "fedprox: {algorithm.mu: [0.1, 1.0]}}); the method names each trial's run, tag and report row")
ONCE_RULE = "a config key may be given once across grid, methods and search.space (a trial would take only one)"


def base_method(sweep) -> str:
    """The method of a sweep without ``methods:``: base's algorithm."""
    return (sweep.base.get("algorithm") or {}).get("name", "fedavg")


def method_names(sweep) -> list[str]:
    return list(sweep.methods or {base_method(sweep): {}})


def _given(sweep, method: str) -> list[tuple[str, str]]:
    """``(where, key)`` of every key that sets values of ``method``'s trials, in the order expand
    applies them: ``grid``, the method's own entry (``methods.<method>``), ``search.space``."""
    given = [("grid", k) for k in sweep.grid]
    given += [(f"methods.{method}", k) for k in (sweep.methods or {}).get(method) or {}]
    return given + [("search.space", k) for k in (sweep.search.space if sweep.search is not None else {})]


def key_places(sweep, method: str) -> dict[str, str]:
    """Each key of ``method``'s trials -> where the file gives it (after :func:`check_keys`, one place)."""
    return {key: where for where, key in _given(sweep, method)}


def build_config_of(sweep, method: str, overrides: dict[str, Any], source: str, places: dict[str, str]) -> RunConfig:
    """A trial's config: ``base`` with ``overrides`` set (a mapping merges into its section), validated;
    base's algorithm-specific keys belong to base's algorithm. An error names where the file gives the
    key at fault (``places``: key -> ``grid``, ``methods.x``, ``search.space``)."""
    raw = copy_tree(sweep.base)
    if method != base_method(sweep):
        raw["algorithm"] = {k: v for k, v in (sweep.base.get("algorithm") or {}).items() if k in ("weighting",)}
    try:
        for key, value in overrides.items():
            set_dotted(raw, key, value)
        return validate_raw(raw)
    except ConfigError as e:
        raise ConfigError(f"{source}: {_where(str(e), overrides, places)}{e}") from None


def _where(error: str, overrides: dict[str, Any], places: dict[str, str]) -> str:
    """``grid: `` (and the key, when the error names a key inside it) for an error about a key the
    file gives in a grid, methods or search.space; '' for one about base."""
    named = error.split(":", 1)[0]
    key = next((k for k in overrides if named == k or named.startswith(k + ".")), None)
    if key is None:
        return ""
    where = {"algorithm.name": "methods", "seed": "seeds"}.get(key) or places[key]
    return f"{where}: " if key == named else f"{where}: {key}: "


def _values(spec: Any) -> list[Any]:
    """The values a grid entry (a list) or a distribution (a mapping) may give; numbers drawn from a
    range are never mappings or names, so they are left out."""
    if isinstance(spec, list):
        return spec
    return list(spec.get("choice", [])) if isinstance(spec, dict) else []


def _entries(sweep) -> list[tuple[str, str | None, str, Any]]:
    """``(where, method, key, spec)`` of every key in grid, each method's entry (its method named) and
    search.space."""
    entries = [("grid", None, k, v) for k, v in sweep.grid.items()]
    for method, spec in (sweep.methods or {}).items():
        entries += [(f"methods.{method}", method, k, v) for k, v in (spec or {}).items()]
    if sweep.search is not None:
        entries += [("search.space", None, k, v) for k, v in sweep.search.space.items()]
    return entries


def check_keys(sweep, source: str) -> None:
    """Refuse what would run other trials than written (the module's docstring), in one line each."""
    for where, method, key, spec in _entries(sweep):
        _check_meaning(source, where, method, key, _values(spec))
    for method in method_names(sweep):
        _check_once(source, _given(sweep, method))
    if sweep.search is not None and sweep.search.searcher == "optuna":
        for where, _, key, spec in _entries(sweep):
            if isinstance(spec, dict):
                _check_choice_keys(source, where, key, _values(spec))


def _names_given(key: str, values: list[Any]) -> list[Any]:
    if key == "algorithm.name":
        return values
    if key == "algorithm":
        return [v["name"] for v in values if isinstance(v, dict) and "name" in v]
    return []


def _check_meaning(source: str, where: str, method: str | None, key: str, values: list[Any]) -> None:
    """``key`` as given at ``where`` (a method's own entry: ``method``), with the ``values`` it may take."""
    names = _names_given(key, values)
    if names and method is None:
        what = "" if key == "algorithm.name" else "its `name` "
        raise ConfigError(f"{source}: {where}: {key}: {what}would choose the algorithm; {METHODS_RULE}")
    other = next((n for n in names if n != method), None)
    if other is not None:
        raise ConfigError(f"{source}: {where}: {key}: {other!r} is not this method's algorithm; {METHODS_RULE}")
    if key == "seed":
        raise ConfigError(f"{source}: {where}: seed: repeats of every config go under `seeds:` (e.g. seeds: "
                          "[0, 1, 2]), which would override a seed set here")
    if key == "mlflow" or key.startswith("mlflow."):
        raise ConfigError(f"{source}: {where}: {key}: no trial uses its mlflow keys: the driver logs every trial to "
                          "the sweep's one MLflow store and experiment (its top-level `mlflow:`), names each run by "
                          "the keys the sweep varies and logs no model")


def _inside(key: str, section: str) -> bool:
    return key.startswith(section + ".")


def _check_once(source: str, given: list[tuple[str, str]]) -> None:
    """No key in ``given`` (``(where, key)``) twice, nor a key and its section."""
    for i, (where, key) in enumerate(given):
        for other_where, other in given[:i]:
            if key == other:
                raise ConfigError(f"{source}: {key} is given in both {other_where} and {where}; {ONCE_RULE}")
            for (inner, inner_where), (outer, outer_where) in (((key, where), (other, other_where)),
                                                               ((other, other_where), (key, where))):
                if inner.startswith(outer + "."):
                    raise ConfigError(f"{source}: {inner} ({inner_where}) is inside {outer} ({outer_where}), which "
                                      f"sets the keys of that section; {ONCE_RULE}, counting a section as every key "
                                      "in it")


def _check_choice_keys(source: str, where: str, key: str, choices: list[Any]) -> None:
    mappings = [sorted(flatten(c)) for c in choices if isinstance(c, dict)]
    odd = next((m for m in mappings if m != mappings[0]), None)
    if odd is not None:
        raise ConfigError(f"{source}: {where}: {key}: with `searcher: optuna` every mapping of a choice names the same "
                          f"keys (one names {', '.join(mappings[0])}, another {', '.join(odd)}): a slot's config holds "
                          "the first choice until its values are drawn, and a drawn mapping sets only the keys it "
                          "names; give each mapping every key, or use `searcher: random`")
