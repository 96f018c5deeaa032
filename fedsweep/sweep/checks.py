"""Checks of a sweep's trials made in the driver before Ray starts (docs/sweeps.md, "Checked before
anything runs"): the ``report:`` keys, what selection reads (the validation split where the trials have
one), and what a trial would otherwise find only once Ray runs it, after every retry."""
from __future__ import annotations

import json

from fedsweep.config.schema import ConfigError
from fedsweep.runs.summary import CLIENT_KINDS_TEXT, own_metric
from fedsweep.sweep.metrics import ON_VALIDATION
from fedsweep.sweep.spec import SweepConfig, Trial


def select_on_validation(sweep: SweepConfig, trials: list[Trial], source: str = "sweep") -> None:
    """What ASHA and optuna select trials by reads the validation split where the trials have one:
    a metric left at its default becomes its validation twin (:data:`ON_VALIDATION`), and a test metric
    given is refused, as is a validation metric for trials without that split, and ASHA or optuna over
    trials some of which have a validation split and some not (they compare trials on one metric). An
    algorithm's own metric (``qffl/mean_Fq``) is measured on training data: read as it is, on any split."""
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
        if own_metric(holder.metric):
            pass
        elif validation and holder.metric in ON_VALIDATION:
            if given:
                raise ConfigError(f"{source}: {key}: {holder.metric!r} reads the test split, which only scores runs; "
                                  f"with a validation split selection reads {ON_VALIDATION[holder.metric]!r}")
            holder.metric = ON_VALIDATION[holder.metric]
        elif not validation and holder.metric not in ON_VALIDATION:
            raise ConfigError(f"{source}: {key}: {holder.metric!r} needs a validation split; set "
                              "base.data.validation_fraction (e.g. 0.1), or select on a test metric")
        check_client_metric(key, holder.metric, trials, source)


def check_client_metric(key: str, metric: str, trials: list[Trial], source: str) -> None:
    """A per-client metric (``<model>/accuracy_<stat>``) is reported only by trials that evaluate per
    client (``eval.clients``), fine-tuned ones only with ``eval.finetune_steps``, personal ones only by
    algorithms with personal models; an algorithm's own metric only by trials whose algorithm declares it
    (``Algorithm.metrics``): refused, naming the first trial that would never report it."""
    from fedsweep.algorithms import get_algorithm_class
    from fedsweep.runs.summary import CLIENT_KINDS
    kind = metric.partition("/")[0]
    if own_metric(metric):
        for t in trials:
            declared = get_algorithm_class(t.config.algorithm.name).metrics
            if metric not in declared:
                raise ConfigError(f"{source}: {key}: {metric!r} is not a metric algorithm {t.config.algorithm.name!r} "
                                  f"declares (its `metrics`: {', '.join(declared) or 'none'}), so trial {t.method} "
                                  f"{t.config_id} would never report it; every trial's algorithm must log it")
        return
    if kind not in CLIENT_KINDS:
        return
    for t in trials:
        ev = t.config.eval
        why = ("sets no eval.clients" if ev.clients is None else
               "sets no eval.finetune_steps" if kind == "finetuned" and not ev.finetune_steps else
               f"runs {t.config.algorithm.name}, which has no personal models" if kind == "personal" and
               not get_algorithm_class(t.config.algorithm.name).has_personal_models() else
               "sets no eval.unseen_clients" if kind.startswith("unseen") and not ev.unseen_clients else
               "sets no eval.finetune_steps" if kind == "unseen_finetuned" and not ev.finetune_steps else None)
        if why:
            raise ConfigError(f"{source}: {key}: {metric!r} is measured per client, and trial {t.method} "
                              f"{t.config_id} {why}, so it would never report it")


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
    metric = sweep.report.metric
    if metric is None and sweep.report.mode == "min":
        raise ConfigError(f"{source}: report.mode: min needs report.metric (an algorithm's own metric where a lower "
                          "value is better); unset, configs are ranked by test accuracy, higher better")
    if metric is not None:
        from fedsweep.sweep.metrics import REPORT_METRICS
        if metric not in REPORT_METRICS and not own_metric(metric):
            raise ConfigError(f"{source}: report.metric: {metric!r} is not a metric configs can be scored by; allowed: "
                              f"{CLIENT_KINDS_TEXT}/accuracy_<mean|weighted|p10|min> (e.g. "
                              "clients/accuracy_p10), an algorithm's own metric (its `metrics`, e.g. qffl/mean_Fq), "
                              "or unset for test accuracy")
        if metric in REPORT_METRICS and sweep.report.mode == "min":
            raise ConfigError(f"{source}: report.mode: min would rank a lower {metric} better; allowed for a "
                              "per-client accuracy: max (the default)")
        if sweep.report.relative_target is not None:
            raise ConfigError(f"{source}: report.relative_target counts rounds to a share of test accuracy, and "
                              f"report.metric {metric!r} scores configs by another metric; unset one of them")
        check_client_metric("report.metric", metric, trials, source)


def check_importable(trials: list[Trial], source: str = "sweep") -> None:
    """Every algorithm, model and dataset a trial uses is one a Ray worker can import: fedsweep's, an
    installed plugin's, or from a module the trial's ``plugins`` name (a worker imports those, and only
    those). One defined in a notebook or a script (``__main__``), or in a module imported by hand, is
    refused in one line saying to put it in a file named in ``plugins:``."""
    from fedsweep.config.plugins import provenance
    from fedsweep.config.registry import ALGORITHMS, DATASETS, MODELS
    covered: dict[tuple, set[str]] = {}
    for t in trials:
        specs = tuple(t.config.plugins)
        if specs not in covered:   # an installed plugin's whole package: every process loads its entry point
            covered[specs] = {p.module if p.origin == "plugins" else p.module.split(".")[0]
                              for p in provenance(list(specs))}
        for registry, name in ((ALGORITHMS, t.config.algorithm.name), (MODELS, t.config.model.name),
                               (DATASETS, t.config.data.name)):
            entry = registry.get(name)
            if entry.builtin or any(entry.module == m or entry.module.startswith(m + ".") for m in covered[specs]):
                continue
            where = ("is defined in __main__ (a notebook, or the script that runs the sweep)" if entry.module == "__main__"
                     else f"comes from module {entry.module}, which the sweep's plugins: do not name")
            raise ConfigError(f"{source}: {registry.key} {name!r} {where}; a sweep's trials run in Ray workers, which "
                              f"import only the plugins the sweep names: put it in a .py file and add that file to "
                              f"plugins: (trial {t.label})")


def check_runnable(sweep: SweepConfig, trials: list[Trial], source: str = "sweep", local: bool = True) -> None:
    """What a trial would otherwise find only once Ray runs it, after every retry: a ``device: cuda``
    trial given no GPU (``resources.gpu: 0`` hides every GPU from it), a split of the data it cannot
    make (:func:`check_data`) and, for a sweep run on this machine (``local``; a cluster's nodes hold
    their own files), a torchvision dataset's missing files."""
    check_importable(trials, source)
    shapes = check_data(trials, source)
    if local:
        check_state_memory(sweep, trials, shapes, source)
    if sweep.resources.gpu == 0:
        cuda = next((t for t in trials if t.config.device == "cuda"), None)
        if cuda is not None:
            raise ConfigError(f"{source}: device: 'cuda' (trial {cuda.label}) needs resources.gpu > 0; a trial "
                              f"sees only the GPUs Ray gave it")
    if local:
        from fedsweep.data.sources import check_files
        _check_each_distinct(trials, lambda t: t.config.data.model_dump_json(), lambda t: check_files(t.config.data),
                             source)


def check_state_memory(sweep: SweepConfig, trials: list[Trial], shapes: dict[int, tuple],
                       source: str = "sweep") -> None:
    """What a trial checks once it starts (:func:`fedsweep.runs.memory.check_state_fits`), here before
    Ray: the per-client state its algorithm may grow to (SCAFFOLD's c_i, FedDyn's ∇L_i), summed over
    the trials one process trains (a pack's members), fits the memory free on this machine; else one
    line naming the pack, instead of every trial failing alike. Only CPU trials of a dataset
    :func:`check_data` made (``shapes``: its inputs and classes give the model's size) are checked; a
    GPU's memory is the trials' own."""
    from fedsweep.config.registry import get_algorithm_class

    def stateful(t: Trial) -> bool:
        return bool(get_algorithm_class(t.config.algorithm.name).client_rows) and t.config.device != "cuda" and \
            t.index in shapes
    if not any(stateful(t) for t in trials):
        return   # (the driver of a sweep without per-client state imports no torch)
    import torch

    from fedsweep.runs.memory import check_state_fits, state_bound
    from fedsweep.sim.models import build_model
    from fedsweep.sweep.units import pack_units

    def checked(t: Trial) -> bool:   # on this machine's CPU: `auto` without a GPU here
        return stateful(t) and (t.config.device == "cpu" or not torch.cuda.is_available())
    dims: dict[str, int] = {}

    def dim(t: Trial) -> int:
        key = json.dumps([t.config.model.model_dump(mode="json"), shapes[t.index]])
        if key not in dims:
            model = build_model(t.config.model, *shapes[t.index])
            dims[key] = sum(p.numel() for p in model.parameters())
        return dims[key]
    by_index = {t.index: t for t in trials}
    for unit in pack_units(sweep, trials):
        members = [by_index[i] for i in unit if checked(by_index[i])]
        if not members:
            continue
        try:
            check_state_fits([(t.config, state_bound(t.config, dim(t))) for t in members], "cpu")
        except ConfigError as e:
            what = f"trial {members[0].label}" if len(unit) == 1 else \
                f"a pack of {len(unit)} trials, {members[0].label} the first"
            fewer = ", or pack fewer trials together (pack:)" if len(unit) > 1 else ""
            raise ConfigError(f"{source}: {e}{fewer} ({what})") from None


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


def check_data(trials: list[Trial], source: str = "sweep") -> dict[int, tuple]:
    """Each distinct data set-up of the trials (``data``, ``server_data``) of a dataset registered with
    ``preflight`` (the default; fedsweep's ``digits``, ``mnist_5k``, ``synthetic``) made and split over its
    clients here, as its first trial will make it: a split that cannot be made (``classes_per_client``
    above the number of classes, more clients than samples, a ``train_size`` or server pool too large,
    a dataset of the user's returning labels that are not class ids ...) is refused in one line naming
    the key and the trial, instead of failing every trial that uses it once Ray runs them. A dataset
    whose function takes ``seed`` is made for each seed (synthetic's clients' sizes are drawn from it).
    Datasets that load from files (torchvision's, LEAF's) are not made here: loading one takes
    seconds, and a cluster's nodes hold their own files; their trials find such errors when they load.

    Where a trial's model or dataset is a plugin's, its model is built here too for the data's inputs
    (torch is imported for it: the plugin's code imports it anyway), so a model whose output does not
    fit the classes, or that the chosen engine cannot run, is one line before Ray. Returns each
    trial's (input shape, classes) where its data was made here."""
    from fedsweep.config.registry import DATASETS, MODELS
    from fedsweep.data import split_federated
    shapes: dict[str, tuple] = {}

    def setup(t: Trial) -> str | None:
        cfg = t.config
        entry = DATASETS.get(cfg.data.name)
        if not entry.extra.get("preflight", True):
            return None
        return cfg.data.model_dump_json() + cfg.server_data.model_dump_json() + \
            (str(cfg.seed) if "seed" in entry.takes else "")

    def split(t: Trial) -> None:
        s = split_federated(t.config.data, t.config.seed, server=t.config.server_data)
        shapes[setup(t)] = (tuple(s.source.x_train.shape[1:]), int(s.source.num_classes))
    _check_each_distinct(trials, setup, split, source)

    def model_setup(t: Trial) -> str | None:
        cfg = t.config
        if MODELS.get(cfg.model.name).builtin and DATASETS.get(cfg.data.name).builtin:
            return None
        shape = shapes.get(setup(t) or "")
        return None if shape is None else json.dumps([cfg.model.model_dump(mode="json"), shape, cfg.engine])

    def build(t: Trial) -> None:
        from fedsweep.engine import engine_choice
        from fedsweep.sim.models import build_model
        input_shape, classes = shapes[setup(t)]
        engine_choice(t.config.engine, build_model(t.config.model, input_shape, classes), "cpu", input_shape)
    _check_each_distinct(trials, model_setup, build, source)
    return {t.index: shapes[k] for t in trials if (k := setup(t)) in shapes}


def reference_method(sweep: SweepConfig, methods) -> str | None:
    """``report.reference``, else ``fedavg`` if among ``methods``, else None."""
    return sweep.report.reference or ("fedavg" if "fedavg" in set(methods) else None)
