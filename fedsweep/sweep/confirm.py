"""The confirm stage (``confirm: {seeds: [...]}`` in a sweep file; docs/sweeps.md, "Confirm stage").

The best of several configs, picked on some seeds, looks better on those seeds than it is (the
winner's curse: it was picked partly for its seeds' luck). So once every tuning trial has ended, the
driver picks each method's config per setting as ``fedsweep report`` does (:mod:`fedsweep.reports.trials`:
on the validation split where the trials have one) and runs it again on fresh seeds, each a trial
of its own (tagged ``fedsweep.stage=confirm``, continuing the sweep's trial numbers); the report
scores and compares methods on those runs only. The confirm trials are planned here, from the
tuning trials' records in MLflow, and kept in the sweep's trials file, so ``--resume`` runs exactly
them.
"""
from __future__ import annotations

import copy
from typing import Any

from fedsweep.config.names import short
from fedsweep.config.schema import ConfigError, RunConfig
from fedsweep.sweep.spec import SweepConfig, Trial, config_label, seed_order  # noqa: F401 - seed_order: here too

#: A Tune experiment of its own for the confirm trials, inside the sweep's folder of the storage (a
#: sequential stage's later looks: ``confirm-2``, ``confirm-3``, ...).
EXPERIMENT = "confirm"


def look_experiment(look: int) -> str:
    """The Tune experiment of look ``look`` (1-based) of the confirm stage."""
    return EXPERIMENT if look <= 1 else f"{EXPERIMENT}-{look}"


def looks(sweep: SweepConfig) -> list[int] | None:
    """How many confirm seeds each look of a sequential stage has seen (``seeds``, then ``step`` more
    at a time up to ``max_seeds``); None for a confirm stage of fixed seeds."""
    confirm = sweep.confirm
    if confirm is None or confirm.max_seeds is None or confirm.max_seeds == len(confirm.seeds):
        return None
    return list(range(len(confirm.seeds), confirm.max_seeds, confirm.step)) + [confirm.max_seeds]


def confirm_record(sweep: SweepConfig):
    """What the trials file keeps of ``confirm:`` (a resumed sweep must have the same)."""
    if sweep.confirm is None:
        return None
    if looks(sweep) is None:
        return sweep.confirm.seeds
    return {"seeds": sweep.confirm.seeds, "max_seeds": sweep.confirm.max_seeds, "step": sweep.confirm.step}


def confirm_size(sweep: SweepConfig, trials: list[Trial]) -> int:
    """How many confirm trials the sweep will run: one per seed of ``confirm.seeds`` for each method
    under each combination of the ``report.settings`` values it takes (a method without a setting key,
    FedAvg without a temperature, is one config for every value of it). 0 without ``confirm:``."""
    if sweep.confirm is None:
        return 0
    return len({selection_group(sweep, t) for t in trials}) * len(sweep.confirm.seeds)


def most_confirm_trials(sweep: SweepConfig, trials: list[Trial]) -> int:
    """The confirm trials of the worst case: every selected config on ``max_seeds`` seeds."""
    if sweep.confirm is None:
        return 0
    return len({selection_group(sweep, t) for t in trials}) * len(seed_order(sweep))


def selection_group(sweep: SweepConfig, trial: Trial) -> tuple:
    """The (method, setting values) a trial's config is selected within: one config of each is confirmed."""
    flat = trial.config.flat()
    return trial.method, tuple((k, str(flat[k])) for k in sweep.report.settings if k in flat)


def plan_confirm(sweep: SweepConfig, payloads: list[dict], uri: str, experiment: str) -> list[dict]:
    """The confirm trials' payloads (as ``sweep/tune.py`` makes the tuning ones), numbered after
    ``payloads``: each method's selected config per setting (read from the tuning trials' runs in
    MLflow, by the report's own rule) on each of ``confirm.seeds``. Raises ConfigError if a method has
    no scored tuning trial to select from."""
    from fedsweep.reports.trials import selected_configs
    from fedsweep.sweep.checks import reference_method
    chosen = selected_configs(uri, experiment, sweep.name, sweep.report.settings,
                              reference_method(sweep, (p["method"] for p in payloads)), sweep.report.relative_target,
                              sweep.report.metric, sweep.report.mode)
    by_config = {p["config_id"]: p for p in payloads}
    planned, seen = [], set()
    for _, row in chosen.iterrows():
        if row["config_id"] in seen:
            continue
        seen.add(row["config_id"])
        template = by_config.get(row["config_id"]) or _drawn(payloads, row, uri)
        for seed in sweep.confirm.seeds:
            planned.append(_reseeded(template, seed, len(payloads) + len(planned)))
    return planned


def plan_look(sweep: SweepConfig, payloads: list[dict], uri: str, experiment: str, look: int,
              resolution: float) -> tuple[list[dict], int]:
    """The trials of look ``look`` (2-based on) of a sequential confirm stage: the next ``step`` seeds
    for the selected config of each method, and of the reference, in a comparison the looks so far
    left open, read from MLflow by the report's own rules (:func:`fedsweep.reports.write.sweep_tables`);
    numbered after ``payloads``. Returns (the trials, the comparisons still open); no trials where
    every comparison is answered."""
    from fedsweep.reports.stats import _key
    from fedsweep.reports.write import sweep_tables
    from fedsweep.sweep.checks import reference_method
    plan, order = looks(sweep), seed_order(sweep)
    reference = reference_method(sweep, (p["method"] for p in payloads))
    t = sweep_tables(uri, experiment, sweep.name, sweep.report.settings, reference, sweep.report.relative_target,
                     resolution, sweep.report.margin.model_dump(), plan, order, sweep.report.metric,
                     sweep.report.mode)
    open_rows = t.comparisons[t.comparisons["stop_reason"] == "open"]
    config_of = {_key(r, t.best.attrs["settings"]): r["config_id"] for _, r in t.best.iterrows()}
    wanted = list(dict.fromkeys(config_of[(r["setting"], who)] for _, r in open_rows.iterrows()
                                for who in (r["method"], r["reference"])))
    template = {}
    for p in payloads:
        if p.get("stage") == "confirm":
            template.setdefault(p["config_id"], p)
    seeds = order[plan[look - 2]:plan[look - 1]]
    planned = []
    for config_id in wanted:
        for seed in seeds:
            planned.append(_reseeded(template[config_id], seed, len(payloads) + len(planned)))
    return planned, len(open_rows)


def confirm_units(sweep: SweepConfig, planned: list[dict], slots: int) -> list[list[int]]:
    """The confirm trials as Tune trials, packed as the tuning trials are (``pack:``; same numbers as
    one by one, docs/sweeps.md "Packed trials"): ``seeds`` packs each selected config's confirm seeds;
    a number N packs up to N, but into at least ``slots`` packs (the trials the sweep's resources run
    at once) where there are that many trials, so that a stage of 30 runs keeps every CPU busy
    instead of being one pack of 30."""
    from types import SimpleNamespace

    from fedsweep.sweep.units import pack_units
    if sweep.pack in (None, 1):
        return [[p["index"]] for p in planned]
    trials = [SimpleNamespace(index=p["index"], config=RunConfig(**p["run"]), config_id=p["config_id"])
              for p in planned]
    if sweep.pack == "seeds":
        return pack_units(sweep, trials)
    size = max(1, min(sweep.pack, -(-len(planned) // max(1, slots))))
    return pack_units(sweep.model_copy(update={"pack": size}), trials)


def concurrent_slots(sweep: SweepConfig) -> int:
    """How many trials the Ray cluster the sweep runs on takes at once (its CPUs, and GPUs where a
    trial asks for them, over a trial's share), at most ``max_concurrent``."""
    import ray
    have = ray.cluster_resources()
    slots = [have.get("CPU", 1.0) / sweep.resources.cpu] if sweep.resources.cpu else []
    if sweep.resources.gpu:
        slots.append(have.get("GPU", 0.0) / sweep.resources.gpu)
    n = max(1, int(min(slots))) if slots else 1
    return min(n, sweep.max_concurrent) if sweep.max_concurrent else n


def _drawn(payloads: list[dict], row, uri: str) -> dict:
    """The payload of a config ``searcher: optuna`` drew (its slot's payload holds placeholders until
    then): the slot's, with the config its first run trained, from the run's ``config.yaml``."""
    import os
    import tempfile

    import yaml
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(row["run_ids"][0])
    slot = payloads[int(run.data.tags["fedsweep.trial"])]
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with tempfile.TemporaryDirectory(prefix="fedsweep-") as tmp:
        trained = yaml.safe_load(open(client.download_artifacts(run.info.run_id, "config.yaml", tmp)).read())
    return {**slot, "run": {**slot["run"], **{k: trained[k] for k in trained if k != "mlflow"}},
            "config_id": row["config_id"], "name": run.info.run_name}


def _reseeded(template: dict, seed: int, index: int) -> dict[str, Any]:
    run = copy.deepcopy(template["run"])
    run["seed"] = seed
    try:
        RunConfig(**run)
    except Exception as e:  # noqa: BLE001 - a seed the config cannot take (a synthetic split, say)
        raise ConfigError(f"confirm.seeds: {seed} cannot run {template['label']}: {e}") from None
    method_and_keys = template["label"].rsplit(" seed=", 1)[0]
    name = config_label(template)
    if template.get("stage") == "confirm":    # a later look's template is a confirm run: its label ends so already
        name = name.removesuffix(" confirm")
    return {**{k: v for k, v in template.items() if k not in ("drawn", "varying", "overrides", "draw")},
            "run": run, "seed": seed, "index": index, "stage": "confirm",
            "label": f"{method_and_keys} seed={seed} (confirm)", "name": f"{name} {short('seed', seed)} confirm"}
