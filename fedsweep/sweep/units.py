"""How a sweep's trials become Ray Tune trials ("units"): one trial each, or packs of configs that can
train together in one process (``pack:``, :mod:`fedsweep.sweep.pack`); what a pack may share."""
from __future__ import annotations

import json

from fedsweep.config.schema import RunConfig
from fedsweep.sweep.spec import SweepConfig, Trial


# Data keys packed configs may set apart: they only change which samples are whose.
_PER_MEMBER_DATA = ("partition", "num_clients", "train_size", "validation_fraction", "validation")


def pack_key(cfg: RunConfig) -> str:
    """Configs with equal keys can train in one pack (fedsweep/sweep/pack.py): same model, data source,
    round count, engine, device and matmul precision."""
    data = {k: v for k, v in cfg.data.model_dump(mode="json").items() if k not in _PER_MEMBER_DATA}
    return json.dumps({"rounds": cfg.rounds, "model": cfg.model.model_dump(mode="json"), "data": data,
                       "engine": cfg.engine, "device": cfg.device, "matmul_precision": cfg.matmul_precision},
                      sort_keys=True)


def client_code(cfg: RunConfig) -> str:
    """What a config's clients run: its algorithm and that algorithm's parameters. Client functions
    read nothing else of the algorithm (``self.params`` only; ``weighting`` is the server's), so
    configs with equal codes can share one engine call (fedsweep/sweep/pack.py)."""
    algorithm = {k: v for k, v in cfg.algorithm.model_dump(mode="json").items() if k != "weighting"}
    return json.dumps(algorithm, sort_keys=True)


def pack_units(sweep: SweepConfig, trials: list[Trial]) -> list[list[int]]:
    """The trials' indices as Tune trials ("units"): one each, or packs (``sweep.pack``).

    Packs only join configs with equal :func:`pack_key`: ``seeds`` packs the seeds of each config,
    a number N deals the configs of a key round-robin into ceil(count / N) packs."""
    if sweep.pack in (None, 1):
        return [[t.index] for t in trials]
    keyed: dict[str, list[Trial]] = {}
    for t in trials:
        key = pack_key(t.config) + (t.config_id if sweep.pack == "seeds" else "")
        keyed.setdefault(key, []).append(t)
    units = []
    for members in keyed.values():
        if sweep.pack == "seeds":
            units.append([t.index for t in members])
            continue
        # Dealt round-robin in client-code order: packs of equal size and mix (so of similar cost),
        # each holding runs of members with the same client code.
        members.sort(key=lambda t: (client_code(t.config), t.config.local.lr, t.index))
        n = -(-len(members) // sweep.pack)
        units += [[t.index for t in members[j::n]] for j in range(n)]
    return units
