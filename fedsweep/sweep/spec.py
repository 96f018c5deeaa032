"""Sweep files: a base run config, a grid crossed with per-method grids and seeds -> trials.

Everything here runs in the driver before Ray starts, so a bad key or value in any trial is
reported in one line naming the key (docs/sweeps.md has the file format).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from fedsweep.config.names import short
from fedsweep.config.plugins import load_plugins
from fedsweep.config.schema import (ConfigError, RunConfig, copy_tree, format_validation_error, load_yaml,
                                    register_models, set_dotted, with_plugins)
from fedsweep.runs.summary import CLIENT_KINDS_TEXT
from fedsweep.sweep.metrics import METRICS_TEXT, TUNE_METRICS, VAL_METRICS, reported
from fedsweep.sweep.keys import build_config_of, check_keys, key_places, method_names
from fedsweep.sweep.search import SearchConfig, extremes, method_space, samples


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SchedulerConfig(_Strict):
    kind: Literal["asha"] = Field("asha", description="ASHA (async successive halving) early stopping.")
    metric: str = Field("test/accuracy", description="Metric ASHA compares at its rungs, as of the last "
                        "evaluation: " + ", ".join(TUNE_METRICS[:4]) + ", per-client evaluation's "
                        "`" + CLIENT_KINDS_TEXT + "/accuracy_<mean|weighted|p10|min|std>` (docs/run.md), and "
                        "their validation twins " + ", ".join(VAL_METRICS[:4]) + ", `<model>/val_accuracy_<stat>`. "
                        "Where the trials have a validation split "
                        "(`data.validation_fraction`) selection reads it: the default becomes val/accuracy, and a "
                        "test metric is refused (test only scores). Or an algorithm's own metric, which every "
                        "trial's algorithm declares in its `metrics` (q-FFL's `qffl/mean_Fq`, with `mode: min`).")
    mode: Literal["max", "min"] = Field("max", description="Whether larger `metric` is better.")
    grace_period: int = Field(10, ge=1, description="Rounds before a trial may be stopped: ASHA's first rung "
                              "(the others at grace_period × η^k, up to the most rounds of any trial).")
    reduction_factor: float = Field(3.0, gt=1, description="ASHA's η: keep the top 1/η at each rung.")


class ResourcesConfig(_Strict):
    cpu: float = Field(1.0, gt=0, description="CPUs per trial, on one node.")
    gpu: float = Field(0.0, ge=0, description="GPUs per trial, on one node; fractional shares one GPU (e.g. "
                       "0.25). More than any node has: refused on a local Ray instance, waited for on a cluster.")


class SweepMlflowConfig(_Strict):
    tracking_uri: str | None = Field(None, description="MLflow store (default as for `fedsweep run`).")
    experiment: str | None = Field(None, description="Experiment name (default: the sweep's name).")


class MarginConfig(_Strict):
    accuracy: float = Field(0.01, ge=0, le=1, description="Accuracy differences inside ±this are none (0.01: one "
                            "point); 0: `equivalent` never called.")
    rounds: float = Field(2.0, ge=0, description="Rounds-to-target differences inside ±this many rounds are none; "
                          "0: `equivalent` never called.")
    metric: float = Field(0.0, ge=0, description="Differences of an algorithm's own `report.metric` inside ±this "
                          "are none; 0 (the default: fedsweep cannot know its scale): `equivalent` never called.")


class ReportConfig(_Strict):
    settings: list[str] = Field(
        ["heterogeneity.rho"], description="Config keys under which methods are compared rather than tuned: "
        "`fedsweep report` picks each method's best config per value of these keys, tabulates rounds to "
        "target per value and draws one curve per value (e.g. `server_data.fraction` for an m_s ablation).")
    reference: str | None = Field(
        None, description="Method the rounds-to-target speed-ups are relative to (FedCLG Table I: "
        "`clg_sgd`) and every other method is compared with, paired by seed (`comparisons.csv`: difference, "
        "95% CI, Holm-adjusted p, verdict); default `fedavg` when the sweep has it, else neither.")
    relative_target: float | None = Field(
        None, gt=0, le=1, description="Count rounds to this fraction of the reference method's final accuracy "
        "(under the same settings) instead of `eval.target_accuracy`: 0.9 gives the FedSoftMax paper's R90.")
    metric: str | None = Field(
        None, description="What configs are selected, scored and compared by, instead of test accuracy (and "
        "rounds to target): a per-client accuracy (`eval.clients`, docs/run.md) `" + CLIENT_KINDS_TEXT + "/"
        "accuracy_<mean|weighted|p10|min>`, e.g. `served/accuracy_p10` for the worst 10% of clients under "
        "the model each is served (its personal one where the method has them, else the global one). Each run's is its best over the evaluations, or with a validation split the "
        "metric at the round of its validation twin's best (`personal/val_accuracy_p10`), which selection "
        "reads; verdicts compare it paired by seed, margin `report.margin.accuracy`. Or an algorithm's own metric "
        "(what its `round_metrics` logs and its `metrics` declares, e.g. `qffl/mean_Fq`; every trial's algorithm "
        "must declare it): each run's value at its last round, measured on training data, so selection and scoring "
        "both read it; margin `report.margin.metric`, direction `report.mode`. Unset: test accuracy.")
    mode: Literal["max", "min"] = Field(
        "max", description="Whether a larger `report.metric` is better: `min` for a loss-like metric of an "
        "algorithm's own (`qffl/mean_Fq`); per-client accuracies are always `max`.")
    margin: MarginConfig = Field(
        default_factory=lambda: MarginConfig(), description="Equivalence margins: a comparison whose adjusted "
        "interval lies inside ±margin reads `equivalent` (docs/sweeps.md, Intervals and verdicts).")


class ConfirmConfig(_Strict):
    seeds: list[StrictInt] = Field(
        ..., min_length=1, description="Fresh seeds (none of `seeds`) on which, once every tuning trial has "
        "ended, each method's selected config per setting is run again (a trial each, tagged "
        "`fedsweep.stage=confirm`); `fedsweep report` scores and compares methods on these runs only, free of "
        "the luck of the seeds a config was picked on.")
    max_seeds: int | None = Field(
        None, ge=2, description="Seeds until answered: after `seeds`, add `step` seeds at a time to the configs of "
        "every comparison still `inconclusive`, until each is `better`, `worse` or `equivalent` or it has this many "
        "(docs/sweeps.md, Seeds until answered). The seeds added are the next integers after the largest of "
        "`seeds` that no other stage uses. Default: `seeds` only.")
    step: int = Field(4, ge=1, description="Seeds added at each look (with `max_seeds`).")


class SweepConfig(_Strict):
    plugins: list[str] = Field(
        default_factory=list, description="Your own algorithms, models and datasets for every trial (docs/extending.md): "
        "paths of `.py` files or package folders relative to this file, or module names; imported before the trials "
        "are made, in the driver and in every Ray worker (on a cluster, shipped to its nodes).")
    name: str | None = Field(
        None, description="Sweep name (default: the file name without .yaml): one path component of letters, "
        "digits, `.`, `_` and `-`, starting with a letter or digit (it names the sweep's folder under --storage, "
        "its lock and its MLflow experiment).")
    base: dict[str, Any] = Field(default_factory=dict, description="A full run config.")
    grid: dict[str, list[Any]] = Field(
        default_factory=dict, description="Dotted config keys -> values, crossed. A mapping given for a section "
        "(`local: [{lr: 0.1, steps: 5}, {lr: 0.05, steps: 10}]`) sets only the keys it names, so its keys vary "
        "together. Not `algorithm.name` (methods go under `methods:`), `seed` (repeats go under `seeds:`) nor "
        "`mlflow.*`; a key may be given once across grid, methods and search.space.")
    methods: dict[str, dict[str, list[Any] | dict[str, list[Any]]]] | None = Field(
        None, description="Algorithm name -> its own grid, crossed with `grid` (a list of values per key, as in "
        "`grid`; `algorithm.name` only as the method's own), and with `search:` its own sampled keys (a distribution "
        "per key, as in `search.space`).")
    search: SearchConfig | None = Field(
        None, description="Sampled configs beside the grid: a distribution per key and a budget per method "
        "(docs/sweeps.md, Search).")
    seeds: list[StrictInt] | None = Field(
        None, min_length=1, description="Repeats of every config (default: [base.seed]); not empty. The one place for "
        "seeds: `seed` in a grid is refused.")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    max_concurrent: int | None = Field(None, ge=1, description="Trials at once (default: what resources allow).")
    max_failures: int = Field(1, ge=0, description="Retries of a crashed trial, from its last checkpoint (an exception "
                              "raised in your own code, a plugin's, is not retried: it fails the same way again).")
    checkpoint_every: int = Field(1, ge=1, description=(
        "Evaluations between trial checkpoints, at least, without a scheduler: a checkpoint goes with a report to "
        "Tune, and a trial reports at most once a second (a shorter trial writes only its final one). With a "
        "scheduler every report (at ASHA's rungs, and at most once a second) carries one: a stopped run's "
        "artifacts are made from it."))
    scheduler: SchedulerConfig | None = None
    confirm: ConfirmConfig | None = Field(
        None, description="A confirm stage after the tuning trials (docs/sweeps.md, Confirm stage).")
    pack: int | Literal["seeds"] | None = Field(
        None, description="Train several configs in one trial (docs/sweeps.md, Packed trials): `seeds` packs the "
        "seeds of each config, a number N packs up to N configs that share model, data source and rounds (say "
        "trials ÷ concurrent trials). Each config stays its own MLflow run; not with `scheduler`.")
    mlflow: SweepMlflowConfig = Field(default_factory=SweepMlflowConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)


# The name becomes a folder under --storage (deleted by --restart) and a lock file: one path
# component, never `..`, `/` or a leading dot.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
NAME_RULE = "allowed: 1-100 letters, digits, '.', '_' and '-', starting with a letter or digit"

register_models(SweepConfig, ConfirmConfig, SearchConfig, SchedulerConfig, ResourcesConfig, SweepMlflowConfig, ReportConfig,
                MarginConfig)


@dataclass
class Trial:
    index: int
    method: str
    seed: int
    overrides: dict[str, Any]   # the dotted keys this trial sets on top of `base` (seed included)
    config: RunConfig
    # `searcher: optuna`: the keys drawn when the trial starts (at a placeholder until then), its study
    # (method and grid point) and which of the study's configs it is
    sampled: tuple[str, ...] = ()
    study: str = ""
    sample: int = 0

    @property
    def config_id(self) -> str:
        """Short hash of the resolved config without seed and tracking: equal across seeds."""
        flat = {k: v for k, v in self.config.flat().items() if k != "seed" and not k.startswith("mlflow.")}
        return hashlib.sha1(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:10]

    @property
    def label(self) -> str:
        varying = [f"{k}={'~' if k in self.sampled else v}" for k, v in self.overrides.items()
                   if k not in ("seed", "algorithm.name")]
        return " ".join([self.method, *varying, f"seed={self.seed}"])


def varying_keys(trials: list[Trial]) -> list[str]:
    """The keys a sweep varies, in the order its file gives them: those that take more than one value
    among the trials that set them (a method's one-value grid, such as SCAFFOLD's option, is not)."""
    values: dict[str, set[str]] = {}
    for t in trials:
        for key, value in t.overrides.items():
            values.setdefault(key, set()).add(json.dumps(value, sort_keys=True, default=str))
    drawn = {k for t in trials for k in t.sampled}   # one placeholder value each until drawn
    return [k for k, v in values.items() if k != "algorithm.name" and (len(v) > 1 or k in drawn)]


def run_name(trial: Trial, varying: list[str]) -> str:
    """The MLflow run name: the method, then only the keys the sweep varies, short (``fedlga ρ0.9
    ηl0.1 ηg1 s2``), so that the runs table tells configs apart within the width it shows."""
    partition = trial.config.data.partition.model_dump()   # whole: its label needs its kind, maybe from base
    parts = [short(k, _with_partition(k, trial.overrides[k], partition)) for k in varying
             if k in trial.overrides and k != "seed"]
    if "seed" in varying:
        parts.append(short("seed", trial.seed))
    return " ".join([trial.method, *parts])


def config_label(payload: dict) -> str:
    """A trial's config in words, without its seed (its run name less the seed: ``fedlga ρ0.5 ηl0.1
    ηg1``; a confirm run's ends in ``confirm``): the ``fedsweep.config`` tag, which the MLflow UI's
    Group by turns into one row per config with the mean over its seeds."""
    seed = short("seed", payload["run"].get("seed", 0))
    return " ".join(w for w in payload.get("name", payload["label"]).split(" ") if w != seed)


def _with_partition(key: str, value: Any, partition: dict) -> Any:
    """``value`` of ``key`` with ``data.partition`` whole, as the trial resolved it: a mapping given for
    it (or for ``data``) sets only some of its keys."""
    if key == "data.partition":
        return partition
    if key == "data" and isinstance(value, dict) and "partition" in value:
        return {**value, "partition": partition}
    return value


def _product(grid: dict[str, list]) -> list[dict[str, Any]]:
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def sweep_source(path: str | Path | dict) -> str:
    """What messages call a sweep: its file, or ``sweep`` for a mapping given from Python."""
    return "sweep" if isinstance(path, dict) else str(path)


def sweep_record(path: str | Path | dict) -> bytes:
    """The sweep as its MLflow parent run keeps it (``sweep.yaml``): the file's bytes, or the mapping
    as YAML (what YAML cannot write is one line, before anything runs)."""
    if not isinstance(path, dict):
        return Path(path).read_bytes()
    try:
        return yaml.safe_dump(path, sort_keys=False, allow_unicode=True).encode()
    except yaml.YAMLError as e:
        value = e.args[-1] if len(e.args) == 2 else e   # RepresenterError("cannot represent an object", value)
        raise ConfigError(f"sweep: {value!r} ({type(value).__name__}) cannot be written as YAML, the sweep's record "
                          "on its MLflow parent run (sweep.yaml); give plain mappings, lists, strings and numbers") \
            from None


def load_sweep(path: str | Path | dict) -> SweepConfig:
    """A sweep file (or, from Python, its mapping: paths in it relative to the working folder) read and
    checked; its plugins imported and given to every trial's config (``base.plugins``)."""
    if isinstance(path, dict):
        raw, path = copy_tree(path), "sweep"
        if not raw.get("name"):
            raise ConfigError("sweep: name: a sweep given as a mapping needs a `name` (it names the sweep's folder, "
                              "its lock and its MLflow experiment)")
        base_file = None
    else:
        raw, base_file = load_yaml(path), path
    if raw is not None and isinstance(raw.get("base"), dict):
        try:
            raw["plugins"] = with_plugins(raw, base_file).get("plugins", [])
            load_plugins(raw["plugins"])
            raw["base"] = with_plugins(raw["base"], base_file, also=raw["plugins"], key="base.plugins")
            load_plugins(raw["base"].get("plugins", []), key="base.plugins")
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
    if raw is None:
        raise ConfigError(f"{path}: the file is empty (or holds only comments); a sweep file needs a `base:` run "
                          "config (and usually a `grid:`, docs/sweeps.md)")
    if "base" not in raw:
        raise ConfigError(f"{path}: a sweep file needs a `base:` run config (and usually a `grid:`); "
                          f"to run a single config use `fedsweep run {path}`")
    try:
        sweep = SweepConfig(**raw)
    except ValidationError as e:
        raise ConfigError(f"{path}: {format_validation_error(e)}") from None
    if sweep.name is None:
        sweep.name = Path(path).stem
        if not SAFE_NAME.fullmatch(sweep.name):
            raise ConfigError(f"{path}: name: the file name {sweep.name!r} cannot name a sweep folder; set `name:` "
                              f"({NAME_RULE})")
    elif not SAFE_NAME.fullmatch(sweep.name):
        raise ConfigError(f"{path}: name: {sweep.name!r} is not allowed; {NAME_RULE}")
    for key, values in {**sweep.grid, **{k: v for g in (sweep.methods or {}).values() for k, v in g.items()}}.items():
        if not values:
            raise ConfigError(f"{path}: grid key {key}: empty list of values")
    check_keys(sweep, str(path))
    if sweep.confirm is not None:
        tuning = set(sweep.seeds if sweep.seeds is not None else [int(sweep.base.get("seed", 0))])
        reused = sorted(tuning & set(sweep.confirm.seeds))
        if reused:
            raise ConfigError(f"{path}: confirm.seeds: {', '.join(map(str, reused))} also tune the configs (seeds:); "
                              "a confirm run must not share the seed its config was picked on")
        if len(set(sweep.confirm.seeds)) < len(sweep.confirm.seeds):
            raise ConfigError(f"{path}: confirm.seeds: a seed is given twice")
        if sweep.confirm.max_seeds is not None and sweep.confirm.max_seeds < len(sweep.confirm.seeds):
            raise ConfigError(f"{path}: confirm.max_seeds: {sweep.confirm.max_seeds} is fewer than the "
                              f"{len(sweep.confirm.seeds)} seeds of confirm.seeds")
    if isinstance(sweep.pack, int) and sweep.pack < 1:
        raise ConfigError(f"{path}: pack: {sweep.pack} is not allowed; allowed: a number ≥ 1, `seeds`, or no `pack`")
    if sweep.pack not in (None, 1) and sweep.scheduler is not None:
        raise ConfigError(f"{path}: pack: a scheduler stops trials one by one, and a packed trial trains several "
                          f"configs in one process; remove `scheduler` or `pack`")
    if sweep.scheduler is not None and not reported(sweep.scheduler.metric):
        # Ray would only refuse it in every trial, after the sweep has started
        raise ConfigError(f"{path}: scheduler.metric: {sweep.scheduler.metric!r} is not a metric trials report; "
                          f"allowed: {METRICS_TEXT}")
    if sweep.search is not None:
        _check_searcher(sweep, path)
    return sweep


def _check_searcher(sweep: SweepConfig, path) -> None:
    """What ``searcher: optuna`` needs, before anything runs: a metric the trials report, no packs
    (a pack's configs are fixed before any trial starts, and optuna draws each when its trial starts)
    and the optuna package; and no optuna-only keys for ``random``."""
    search = sweep.search
    if search.searcher == "random":
        given = sorted(search.model_fields_set & {"metric", "mode", "random_first"})
        if given:
            raise ConfigError(f"{path}: search.{given[0]}: only `searcher: optuna` learns from results; "
                              "`random` draws every config before any trial runs (remove it, or use optuna)")
        return
    if not reported(search.metric):
        raise ConfigError(f"{path}: search.metric: {search.metric!r} is not a metric trials report; "
                          f"allowed: {METRICS_TEXT}")
    if search.metric in ("rounds_to_target", "val_rounds_to_target") and \
            (sweep.base.get("eval") or {}).get("target_accuracy") is None:
        raise ConfigError(f"{path}: search.metric: {search.metric} needs base.eval.target_accuracy")
    if sweep.pack not in (None, 1):
        raise ConfigError(f"{path}: pack: optuna draws each config when its trial starts, and a pack's configs "
                          "are fixed before any trial does; remove `pack`, or use `searcher: random`")
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise ConfigError(f"{path}: search.searcher: optuna needs the optuna package, not installed here: "
                          "pip install 'fedsweep[optuna]'") from None


def trial_count(sweep: SweepConfig) -> int:
    """How many trials :func:`expand` makes, from the sizes of the grids alone (instantly, for any size)."""
    seeds = len(sweep.seeds) if sweep.seeds is not None else 1
    draws = sweep.search.num_samples if sweep.search is not None else 1
    grid = math.prod(len(v) for v in sweep.grid.values())
    own = [math.prod(len(v) for v in ((sweep.methods or {}).get(m) or {}).values() if isinstance(v, list))
           for m in method_names(sweep)]
    return grid * sum(own) * draws * seeds


def expand(sweep: SweepConfig, source: str = "sweep") -> list[Trial]:
    """Every trial, validated: product(grid) × (method × product(method grid) × its search samples) × seeds."""
    return list(iter_trials(sweep, source))


def iter_trials(sweep: SweepConfig, source: str = "sweep", progress=None) -> Iterator[Trial]:
    """:func:`expand`'s trials one at a time (``fedsweep tune --dry-run`` keeps only those it prints);
    ``progress(trials so far)`` is called after each config's seeds. With ``searcher: optuna`` a sampled
    key is validated at each end of its distribution (every choice), as a drawn value is known only
    once its trial starts.

    Each config is validated once, for its first seed; its other seeds are copies with ``seed`` set
    (``model_copy`` skips validation, and the seed is the one key that differs), except that every
    distinct seed value is validated once, in full, the first time it occurs (a seed's only rule is
    its own: ≥ 0)."""
    seeds = sweep.seeds if sweep.seeds is not None else [int(sweep.base.get("seed", 0))]
    later = sweep.search is not None and sweep.search.searcher == "optuna"
    index, checked_seeds = 0, set()
    for method in method_names(sweep):
        method_grid = {k: v for k, v in ((sweep.methods or {}).get(method) or {}).items() if isinstance(v, list)}
        places = key_places(sweep, method)
        try:
            space, drawn = method_space(sweep, method), samples(sweep, method)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        first_trial = None
        for point in _product(sweep.grid):
            for method_point in _product(method_grid):
                study = " ".join([method, *(f"{k}={v}" for k, v in {**point, **method_point}.items())])
                for number, sample in enumerate(drawn):
                    first = None
                    for seed in seeds:
                        overrides = {"algorithm.name": method, **point, **method_point, **sample, "seed": seed}
                        if first is None or seed not in checked_seeds:
                            cfg = build_config_of(sweep, method, overrides, source, places)
                            checked_seeds.add(seed)
                            first = cfg if first is None else first
                        else:
                            cfg = first.model_copy(update={"seed": seed})
                        trial = Trial(index, method, seed, overrides, cfg, tuple(space) if later else (),
                                      study if later else "", number)
                        if first_trial is None and index == 0 and sweep.confirm is not None:
                            _check_confirm_seeds(sweep, method, overrides, source, places)
                        first_trial, index = first_trial or trial, index + 1
                        yield trial
                    if progress is not None:
                        progress(index)
        if later:   # the other ends of each distribution, on the method's first trial
            for key, dist in space.items():
                for value in extremes(*dist)[1:]:
                    build_config_of(sweep, method, {**first_trial.overrides, key: value}, source, places)


def seed_order(sweep: SweepConfig) -> list[int]:
    """The confirm seeds in the order they run: ``confirm.seeds``, then (with ``max_seeds``) the next
    integers after the largest of them that the tuning stage does not use, up to ``max_seeds``."""
    seeds = list(sweep.confirm.seeds)
    taken = set(seeds) | set(sweep.seeds if sweep.seeds is not None else [int(sweep.base.get("seed", 0))])
    candidate = max(seeds) + 1
    while len(seeds) < (sweep.confirm.max_seeds or 0):
        if candidate not in taken:
            seeds.append(candidate)
        candidate += 1
    return seeds


def _check_confirm_seeds(sweep: SweepConfig, method: str, overrides: dict, source: str, places) -> None:
    """The confirm stage's seeds (those ``max_seeds`` adds included) built into a trial's config now,
    before any trial runs, not once every tuning trial has: the seed is the one key a confirm trial
    changes, so one config shows each seed's fate."""
    for seed in seed_order(sweep):
        try:
            build_config_of(sweep, method, {**overrides, "seed": seed}, source, places)
        except ConfigError as e:
            detail = str(e).rsplit(": ", 1)[-1]   # the seed's own rule, without the key path build_config_of names
            raise ConfigError(f"{source}: confirm.seeds: seed {seed}: {detail}") from None


def drawn_payload(payload: dict, values: dict[str, Any] | None) -> dict:
    """A trial's payload (sweep/tune.py) with the values ``searcher: optuna`` drew for it (``values``,
    from its Tune trial's config) in its config, config id, label and run name; as it is without."""
    if not values or payload.get("drawn") == values:
        return payload
    overrides = {**payload["overrides"], **values}
    run = copy_tree(payload["run"])
    for key, value in values.items():
        set_dotted(run, key, value)
    trial = Trial(payload["index"], payload["method"], payload["seed"], overrides, RunConfig(**run))
    return {**payload, "run": run, "drawn": values, "config_id": trial.config_id, "label": trial.label,
            "name": run_name(trial, payload["varying"])}
