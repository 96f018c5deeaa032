"""Datasets of one's own as a fedsweep plugin: functions called as ``f(seed=seed, **data.options)``
(plus what they name of ``num_clients``, ``test_fraction``, ``root``, ``download``) that return a
``fedsweep.Source``: float samples, integer labels, a test split, the number of classes.

- ``breast_cancer``: from arrays (scikit-learn's, offline); fedsweep's partitions split it.
- ``csv_table``: any CSV file of numeric features and a label column (``wine.csv`` beside this file:
  UCI's wine data, 178 wines of 3 cultivars, as scikit-learn ships it); fedsweep's partitions split it.
- ``wine_by_cultivar_shift``: the same file with a natural split of its own (``client_indices``): each
  client holds wines of one cultivar, so ``data.partition`` is not used.

What a function returns is checked as it is made (dtypes, shapes, labels within the classes, lengths,
the natural split): a mistake is one line naming ``data.name`` before anything trains.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import Field

import fedsweep

HERE = Path(__file__).resolve().parent


def _split(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) row indices: a random ``test_fraction`` held out, drawn from the seed."""
    perm = np.random.default_rng(seed).permutation(n)
    n_test = max(1, int(round(test_fraction * n)))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _standardized(x_train: np.ndarray, x_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each feature to mean 0 and standard deviation 1, on the training rows' statistics."""
    mean, std = x_train.mean(0), x_train.std(0) + 1e-8
    return ((x_train - mean) / std).astype(np.float32), ((x_test - mean) / std).astype(np.float32)


@fedsweep.register_dataset("breast_cancer")
def breast_cancer(seed: int, test_fraction: float):
    """scikit-learn's Wisconsin breast cancer data from arrays: 569 tumours, 30 features, 2 classes; offline."""
    from sklearn.datasets import load_breast_cancer
    x, y = load_breast_cancer(return_X_y=True)
    train, test = _split(len(y), test_fraction, seed)
    x_train, x_test = _standardized(x[train], x[test])
    return fedsweep.Source(x_train, y[train], x_test, y[test], num_classes=2)


def read_csv(path: str, label: str) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) of a CSV file with a header row: every column numeric, ``label`` the class id."""
    file = Path(path) if Path(path).is_absolute() else HERE / path
    with open(file, newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], np.array(rows[1:], dtype=np.float64)
    if label not in header:
        raise fedsweep.ConfigError(f"data.options.label: {label!r} is not a column of {file}; its columns: "
                                   f"{', '.join(header)}")
    at = header.index(label)
    return np.delete(body, at, axis=1), body[:, at].astype(np.int64)


@fedsweep.register_dataset("csv_table")
def csv_table(seed: int, test_fraction: float,
              path: Annotated[str, Field(description="The CSV file (relative: to this plugin's folder).")] = "wine.csv",
              label: Annotated[str, Field(description="The column holding each row's class id.")] = "cultivar"):
    """A CSV file of numeric features and an integer label column, a random test split, standardized."""
    x, y = read_csv(path, label)
    train, test = _split(len(y), test_fraction, seed)
    x_train, x_test = _standardized(x[train], x[test])
    return fedsweep.Source(x_train, y[train], x_test, y[test], num_classes=int(y.max()) + 1)


@fedsweep.register_dataset("wine_by_cultivar")
def wine_by_cultivar(seed: int, num_clients: int, test_fraction: float):
    """wine.csv split by nature: each client holds wines of one cultivar only (clients dealt to the 3
    cultivars in turn, each cultivar's training wines shared out among its clients)."""
    x, y = read_csv("wine.csv", "cultivar")
    train, test = _split(len(y), test_fraction, seed)
    x_train, x_test = _standardized(x[train], x[test])
    y_train = y[train]
    rng = np.random.default_rng(seed)
    clients: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * num_clients
    for c in range(3):
        mine = list(range(c, num_clients, 3))                 # the clients of cultivar c
        rows = rng.permutation(np.flatnonzero(y_train == c))
        for k, part in zip(mine, np.array_split(rows, len(mine)) if mine else []):
            clients[k] = np.sort(part)
    return fedsweep.Source(x_train, y_train, x_test, y[test], num_classes=3, client_indices=clients)
