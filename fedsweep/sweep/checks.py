"""Checks of a sweep's trials made in the driver before Ray starts (docs/sweeps.md, "Checked before
anything runs"): the ``report:`` keys, what selection reads (the validation split where the trials have
one), and what a trial would otherwise find only once Ray runs it, after every retry."""
from __future__ import annotations

from fedsweep.config.schema import ConfigError
from fedsweep.sweep.spec import ON_VALIDATION, SweepConfig, Trial


def select_on_validation(sweep: SweepConfig, trials: list[Trial], source: str = "sweep") -> None:
    """What ASHA and optuna select trials by reads the validation split where the trials have one:
    a metric left at its default becomes its validation twin (:data:`ON_VALIDATION`), and a test metric
    given is refused, as is a validation metric for trials without that split, and ASHA or optuna over
    trials some of which have a validation split and some not (they compare trials on one metric)."""
    readers = [("scheduler.metric", sweep.scheduler)] if sweep.scheduler is not None else []
    if sweep.search is not None and sweep.search.searcher == "optuna":
        readers.append(("search.metric", sweep.search))
    if not readers:
        return
    has = {t.config.data.validation_fraction > 0 for t in trials}
    if len(has) > 1:
        raise ConfigError(f"{source}: data.validation_fraction: some trials have a validation split and some not, "
                          f"and {readers[0][0]} compares them on one metric; give every trial the same split")
    validation = has == {True}
    for key, holder in readers:
        given = "metric" in holder.model_fields_set
        if validation and holder.metric in ON_VALIDATION:
            if given:
                raise ConfigError(f"{source}: {key}: {holder.metric!r} reads the test split, which only scores runs; "
                                  f"with a validation split selection reads {ON_VALIDATION[holder.metric]!r}")
            holder.metric = ON_VALIDATION[holder.metric]
        elif not validation and holder.metric not in ON_VALIDATION:
            raise ConfigError(f"{source}: {key}: {holder.metric!r} needs a validation split; set "
                              "base.data.validation_fraction (e.g. 0.1), or select on a test metric")


def check_report(sweep: SweepConfig, trials: list[Trial], source: str = "sweep") -> None:
    """``report.settings`` must be config keys and ``report.reference`` one of the sweep's methods."""
    # configs differ in their keys only by their algorithm's parameters, which their method fixes
    keys = set().union(*(t.config.flat() for t in {t.method: t for t in reversed(trials)}.values()))
    for key in sweep.report.settings:
        if key not in keys:
            varied = sorted({k for t in trials for k in t.overrides if k not in ("seed", "algorithm.name")})
            raise ConfigError(f"{source}: report.settings: {key!r} is not a config key; the keys this sweep "
                              f"varies are: {', '.join(varied) or 'none'}")
    methods = sorted({t.method for t in trials})
    ref = sweep.report.reference
    if ref is not None and ref not in methods:
        raise ConfigError(f"{source}: report.reference: {ref!r} is not a method of this sweep; "
                          f"allowed: {', '.join(methods)}")
    if sweep.report.relative_target is not None and reference_method(sweep, methods) is None:
        raise ConfigError(f"{source}: report.relative_target needs report.reference (one of: {', '.join(methods)})")


def check_runnable(sweep: SweepConfig, trials: list[Trial], source: str = "sweep", local: bool = True) -> None:
    """What a trial would otherwise find only once Ray runs it, after every retry: a ``device: cuda``
    trial given no GPU (``resources.gpu: 0`` hides every GPU from it), a split of the data it cannot
    make (:func:`check_data`) and, for a sweep run on this machine (``local``; a cluster's nodes hold
    their own files), a torchvision dataset's missing files."""
    check_data(trials, source)
    if sweep.resources.gpu == 0:
        cuda = next((t for t in trials if t.config.device == "cuda"), None)
        if cuda is not None:
            raise ConfigError(f"{source}: device: 'cuda' (trial {cuda.label}) needs resources.gpu > 0; a trial "
                              f"sees only the GPUs Ray gave it")
    if local:
        from fedsweep.data.sources import check_files
        _check_each_distinct(trials, lambda t: t.config.data.model_dump_json(), lambda t: check_files(t.config.data),
                             source)


def _check_each_distinct(trials: list[Trial], key, check, source: str) -> None:
    """``check(trial)`` for the first trial of each distinct ``key(trial)`` (a key of None: not
    checked); a ConfigError it raises comes back as one line naming ``source`` and that trial."""
    checked: set[str] = set()
    for t in trials:
        k = key(t)
        if k is None or k in checked:
            continue
        checked.add(k)
        try:
            check(t)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e} (trial {t.label})") from None


# Datasets made in memory (no files), in a fraction of a second: the ones check_data splits before Ray.
MADE_IN_MEMORY = ("digits", "mnist_5k", "synthetic")


def check_data(trials: list[Trial], source: str = "sweep") -> None:
    """Each distinct data set-up of the trials (``data``, ``server_data``) on ``digits``, ``mnist_5k``
    or ``synthetic`` made and split over its clients here, as its first trial will make it: a split that
    cannot be made (``classes_per_client`` above the number of classes, more clients than samples, a
    ``train_size`` or server pool too large, ...) is refused in one line naming the key and the trial,
    instead of failing every trial that uses it once Ray runs them. Digits' split errors depend on
    its sizes, not on the seed; synthetic's clients' sizes are drawn from the seed, so each of its
    seeds is made. Torchvision datasets are not made here: loading one takes seconds, and a cluster's
    nodes hold their own files; their trials find such errors when they load them."""
    from fedsweep.data import split_federated

    def setup(t: Trial) -> str | None:
        cfg = t.config
        if cfg.data.name not in MADE_IN_MEMORY:
            return None
        return cfg.data.model_dump_json() + cfg.server_data.model_dump_json() + \
            (str(cfg.seed) if cfg.data.name == "synthetic" else "")
    _check_each_distinct(trials, setup, lambda t: split_federated(t.config.data, t.config.seed,
                                                                  server=t.config.server_data), source)


def reference_method(sweep: SweepConfig, methods) -> str | None:
    """``report.reference``, else ``fedavg`` if among ``methods``, else None."""
    return sweep.report.reference or ("fedavg" if "fedavg" in set(methods) else None)
