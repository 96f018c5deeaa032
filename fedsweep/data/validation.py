"""The validation split (``data.validation_fraction``, ``data.validation``; docs/design.md §2.4).

Selecting a config by its test accuracy reports the test split's best draw, not the config's
accuracy; a validation split, disjoint from train and test, lets selection read other samples.

* ``central``: ⌈f·n⌉ of the n training samples left after ``train_size`` and the server pool are held
  out before the partition, stratified by class (each class's count within one sample of its share),
  drawn from ``np_rng(seed, -1, "validation")`` alone: the same samples for every method, algorithm
  and partition at a seed. For a natural split (``synthetic``) they are drawn from all clients'
  samples together, and each client keeps the rest of its own.
* ``federated``: after the partition, client i keeps ⌈f·n_i⌉ of its own n_i samples, stratified by its
  classes, as its local validation data, drawn from ``np_rng(seed, -1, "validation/<i>")``; a client
  of one sample keeps it for training. Evaluation pools the validation samples of the clients it
  samples (:mod:`fedsweep.runs.module`).

Numpy only, so the sweep's driver checks every split before Ray (``sweep.check_data``); a fraction
that leaves a class or a client without training samples, or makes no validation sample, is refused
in one line naming ``data.validation_fraction``.
"""
from __future__ import annotations

import math

import numpy as np

from fedsweep.config.schema import ConfigError, DataConfig
from fedsweep.data.sources import stratified_holdout
from fedsweep.sim.rng import np_rng

KEY = "data.validation_fraction"


def central_holdout(labels: np.ndarray, allowed: np.ndarray, cfg: DataConfig,
                    seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    """``(training, validation)`` indices out of the sorted candidates ``allowed``: the second None
    unless ``cfg`` asks for a central split; the first then keeps the order of ``allowed``."""
    if cfg.validation_fraction == 0 or cfg.validation != "central":
        return allowed, None
    held = stratified_holdout(labels[allowed], cfg.validation_fraction, np_rng(seed, -1, "validation"))
    _check_classes(labels, allowed, allowed[~held], cfg)
    return allowed[~held], allowed[held]


def central_holdout_natural(labels: np.ndarray, parts: list[np.ndarray], cfg: DataConfig,
                            seed: int) -> tuple[list[np.ndarray], np.ndarray | None]:
    """:func:`central_holdout` of a natural split: drawn from every client's samples together, each
    client keeping the rest of its own (in their order); a client left with none is refused."""
    if cfg.validation_fraction == 0 or cfg.validation != "central":
        return parts, None
    rest, val = central_holdout(labels, np.sort(np.concatenate(parts)), cfg, seed)
    kept = np.zeros(len(labels), dtype=bool)
    kept[rest] = True
    parts = [p[kept[p]] for p in parts]
    empty = next((i for i, p in enumerate(parts) if len(p) == 0), None)
    if empty is not None:
        raise ConfigError(f"{KEY}: {cfg.validation_fraction:g} takes every training sample of client {empty} of "
                          f"{cfg.name!r} into the central validation split; lower {KEY}, or use data.validation: "
                          "federated (a client of one sample keeps it)")
    return parts, val


def federated_holdout(labels: np.ndarray, parts: list[np.ndarray], cfg: DataConfig,
                      seed: int) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """``(training parts, validation parts)``: client i's ⌈f·n_i⌉ validation samples out of its own
    (none for a client of one sample), each part keeping its order; ``(parts, None)`` unless ``cfg``
    asks for a federated split."""
    f = cfg.validation_fraction
    if f == 0 or cfg.validation != "federated":
        return parts, None
    _check_client_sizes([len(p) for p in parts], f)
    train, val = [], []
    for i, p in enumerate(parts):
        held = (stratified_holdout(labels[p], f, np_rng(seed, -1, f"validation/{i}")) if len(p) >= 2
                else np.zeros(len(p), dtype=bool))
        train.append(p[~held])
        val.append(p[held])
    _check_classes(labels, np.concatenate(parts), np.concatenate(train), cfg)
    return train, val


def _check_client_sizes(sizes: list[int], f: float) -> None:
    """Every client keeps a training sample, and some client has a validation sample."""
    two = [n for n in sizes if n >= 2]
    if not two:
        raise ConfigError(f"{KEY}: every client holds one sample, which it keeps for training, so the federated "
                          "validation split would be empty; use data.validation: central, or fewer data.num_clients")
    n = min(two)
    if math.ceil(f * n) >= n:   # ⌈f·n⌉ ≤ n − 1 iff f ≤ (n − 1)/n
        raise ConfigError(f"{KEY}: {f:g} leaves a client of {n} samples with none to train on (it keeps "
                          f"⌈{f:g}·{n}⌉ = {math.ceil(f * n)} for validation); allowed up to {(n - 1) / n:.4g} here")


def _check_classes(labels: np.ndarray, before: np.ndarray, after: np.ndarray, cfg: DataConfig) -> None:
    """Every class among the candidates ``before`` keeps a training sample in ``after``."""
    lost = np.setdiff1d(np.unique(labels[before]), np.unique(labels[after]))
    if len(lost):
        c = int(lost[0])
        count = int((labels[before] == c).sum())
        raise ConfigError(f"{KEY}: {cfg.validation_fraction:g} takes every training sample of class {c} ({count} of "
                          f"them) into the validation split, leaving no client one to learn it from; lower {KEY}")
