"""``search:`` in sweep files: configs drawn per key from a distribution, the same budget for every method.

Two searchers (docs/sweeps.md, Search):

- ``random`` draws every config here, before Ray starts, from ``search.seed`` and the method's name:
  the trials are then fixed up front, like a grid's (packs, ``--resume`` by trial list, ``--dry-run``
  shows every value);
- ``optuna`` (Optuna's TPE through Ray Tune's ``OptunaSearch``, :mod:`fedsweep.sweep.searcher`) draws a
  config when its first trial starts, from the results its study has so far. Its trials are known up
  front too, as slots (method, grid point, seed and draw number), with each sampled key at a
  placeholder (its distribution's low end or first choice) until drawn.
"""
from __future__ import annotations

import math
import zlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fedsweep.config.schema import ConfigError
from fedsweep.runs.summary import CLIENT_KINDS_TEXT

DISTRIBUTIONS = ("loguniform", "uniform", "quniform", "randint", "choice")


class SearchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    space: dict[str, dict[str, list[Any]]] = Field(
        default_factory=dict, description="Dotted keys -> a distribution, each key drawn anew for every sample: "
        "`{loguniform: [low, high]}` (0 < low < high), `{uniform: [low, high]}`, `{quniform: [low, high, q]}` "
        "(multiples of q), `{randint: [low, high]}` (an integer, high excluded), `{choice: [v1, v2, ...]}` (a "
        "mapping chosen merges into its section, as in `grid`; with `optuna` every mapping names the same keys). "
        "A method may add its own keys: a distribution in place of a list in its `methods:` entry.")
    num_samples: int = Field(
        ..., ge=1, description="Configs drawn per method: every method gets the same number of tries (each is "
        "crossed with `grid`, the method's own grid and every seed).")
    searcher: Literal["random", "optuna"] = Field(
        "random", description="How configs are drawn. `random`: from `seed`, before any trial runs, so the same "
        "file draws the same configs and `--resume` runs the ones it drew. `optuna`: Optuna's TPE through Ray "
        "Tune's OptunaSearch, one study per method and grid point, each config drawn when its first trial starts "
        "from its study's results so far (`metric`, `mode`, `random_first`); needs `pip install "
        "'fedsweep[optuna]'`; not with `pack:`.")
    metric: str = Field(
        "best/test_accuracy", description="`optuna`: what a study learns from: a config's mean over its seeds of "
        "this metric in its trials' last reports (under ASHA, as of where ASHA stopped them); one of "
        "test/accuracy, test/loss, best/test_accuracy, rounds_to_target (the first evaluated round at "
        "`eval.target_accuracy`, else rounds + 1; with `mode: min`) and, for trials with a validation split "
        "(`data.validation_fraction`), their validation twins val/accuracy, val/loss, best/val_accuracy, "
        "val_rounds_to_target: there the default becomes best/val_accuracy and a test metric is refused; with "
        "`eval.clients`, per-client evaluation's `" + CLIENT_KINDS_TEXT + "/accuracy_<mean|weighted|p10|min|std>` "
        "and their twins `<model>/val_accuracy_<stat>` (docs/run.md, Per-client evaluation); or an algorithm's "
        "own metric, declared in every trial's algorithm's `metrics` (`qffl/mean_Fq`, with `mode: min`).")
    mode: Literal["max", "min"] = Field("max", description="`optuna`: whether a larger `metric` is better.")
    random_first: int | None = Field(
        None, ge=1, description="`optuna`: configs of each study drawn at random before TPE models the results "
        "(Optuna's n_startup_trials); default min(10, num_samples // 2), at least 1.")
    seed: int = Field(0, description="The draws' seed; each method's draws (each study's, with `optuna`) derive "
                      "from it and the method's name, so adding a method leaves the others' draws as they were.")

    def startup(self) -> int:
        """Random draws of each Optuna study before its model acts (``random_first``, or its default)."""
        return self.random_first if self.random_first is not None else max(1, min(10, self.num_samples // 2))


def check_distribution(where: str, dist: dict[str, list[Any]]) -> tuple[str, list[Any]]:
    """``(kind, args)`` of one distribution, or a ConfigError naming ``where`` and what is allowed."""
    if len(dist) != 1 or next(iter(dist)) not in DISTRIBUTIONS:
        raise ConfigError(f"{where}: a distribution is one of {', '.join(DISTRIBUTIONS)} with its arguments, "
                          f"e.g. {{loguniform: [0.01, 1.0]}}; got {dist}")
    kind, args = next(iter(dist.items()))
    numbers = all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args)
    rule = {"loguniform": (len(args) == 2 and numbers and 0 < args[0] < args[1], "[low, high] with 0 < low < high"),
            "uniform": (len(args) == 2 and numbers and args[0] < args[1], "[low, high] with low < high"),
            "quniform": (len(args) == 3 and numbers and args[0] < args[1] and args[2] > 0,
                         "[low, high, q] with low < high and q > 0"),
            "randint": (len(args) == 2 and all(isinstance(a, int) for a in args) and args[0] < args[1],
                        "[low, high], integers, low < high (high excluded)"),
            "choice": (len(args) >= 1, "a non-empty list of values")}[kind]
    if not rule[0]:
        raise ConfigError(f"{where}: {kind} takes {rule[1]}; got {args}")
    return kind, args


def value_of(kind: str, args: list[Any], raw):
    """A drawn value as a trial uses it: ``raw`` is a choice's index, an integer, or a float, of which
    continuous draws keep 4 significant digits (a learning rate of 0.01234, not 0.0123400912) and
    ``quniform`` the nearest multiple of q."""
    if kind == "choice":
        return args[int(raw)]
    if kind == "randint":
        return int(raw)
    if kind == "quniform":
        return round(round(raw / args[2]) * args[2], 10)
    return float(f"{raw:.4g}")


def _draw(rng, kind: str, args: list[Any]):
    if kind == "choice":
        return value_of(kind, args, rng.integers(len(args)))
    if kind == "randint":
        return value_of(kind, args, rng.integers(args[0], args[1]))
    if kind == "loguniform":
        return value_of(kind, args, math.exp(rng.uniform(math.log(args[0]), math.log(args[1]))))
    return value_of(kind, args, rng.uniform(args[0], args[1]))


def extremes(kind: str, args: list[Any]) -> list[Any]:
    """The values a config must accept for every draw of the distribution to: its ends (a config key's
    bounds are an interval), or every choice. The first is an undrawn slot's placeholder."""
    if kind == "choice":
        return list(args)
    if kind == "randint":
        return [args[0], args[1] - 1]
    return [value_of(kind, args, args[0]), value_of(kind, args, args[1])]


def own_space(sweep, method: str) -> dict[str, dict[str, list[Any]]]:
    """The keys ``method``'s ``methods:`` entry samples: those given a distribution, not a list."""
    return {k: v for k, v in ((sweep.methods or {}).get(method) or {}).items() if isinstance(v, dict)}


def method_space(sweep, method: str) -> dict[str, tuple[str, list[Any]]]:
    """``method``'s sampled keys (the sweep's space and its own), each as checked ``(kind, args)``, in
    sorted order; a distribution without a ``search:`` section is a ConfigError."""
    own = own_space(sweep, method)
    if sweep.search is None:
        if own:
            raise ConfigError(f"methods.{method}.{next(iter(own))}: a distribution needs a `search:` section "
                              "(its num_samples)")
        return {}
    space = {**sweep.search.space, **own}
    return {k: check_distribution(f"search.space.{k}" if k not in own else f"methods.{method}.{k}", space[k])
            for k in sorted(space)}


def samples(sweep, method: str) -> list[dict[str, Any]]:
    """The configs ``search:`` draws for ``method``: ``num_samples`` dicts of its space's keys (the sweep's
    space and the method's own). ``random``: from a generator seeded by ``search.seed`` and the method's
    name; ``optuna``: placeholders, drawn when each config's first trial starts."""
    space = method_space(sweep, method)
    if sweep.search is None:
        return [{}]
    if sweep.search.searcher == "optuna":
        return [{k: extremes(*space[k])[0] for k in space} for _ in range(sweep.search.num_samples)]
    import numpy as np
    rng = np.random.default_rng([sweep.search.seed, zlib.crc32(method.encode())])
    return [{k: _draw(rng, *space[k]) for k in space} for _ in range(sweep.search.num_samples)]


def sampled_keys(sweep) -> list[str]:
    """The keys ``search:`` draws, the sweep's and the methods' own, in order."""
    if sweep.search is None:
        return []
    keys = list(sweep.search.space)
    for method in sweep.methods or {}:
        keys += [k for k in own_space(sweep, method) if k not in keys]
    return keys


def _spaces_text(space: dict[str, dict[str, list[Any]]]) -> str:
    return ", ".join(f"{k} ~ {kind}({', '.join(map(str, args))})" for k, d in space.items() for kind, args in d.items())


def search_summary(sweep) -> str:
    """The sampled space and its budget in one line: ``search: random, 8 configs per method (seed 0):
    local.lr ~ loguniform(0.01, 1); fedprox: algorithm.mu ~ loguniform(0.001, 1)``."""
    search = sweep.search
    spaces = [_spaces_text(search.space)] if search.space else []
    spaces += [f"{method}: {_spaces_text(own)}" for method in sweep.methods or {}
               if (own := own_space(sweep, method))]
    how = search.searcher
    if how == "optuna":
        how += f" ({search.mode} {search.metric}, {search.startup()} random first)"
    per = "per method" if how == "random" else "per method and grid point"
    return (f"search: {how}, {search.num_samples} configs {per} (seed {search.seed})"
            + (": " + "; ".join(spaces) if spaces else ""))
