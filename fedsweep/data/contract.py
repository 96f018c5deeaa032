"""What a dataset function returns (``fedsweep.Source``) and the check of it: every dataset, fedsweep's
and a user's, is checked as it is made (:func:`check_source`), so a dataset that returns floats as
labels, lengths that differ or a label outside its classes is one line naming ``data.name`` before any
training, not a crash inside a round."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedsweep.util.errors import ConfigError
from fedsweep.util.lazy import torch


@dataclass
class Source:
    """A dataset before partitioning, what a dataset function returns (``fedsweep.Source``).

    ``x_train``, ``x_test``: float samples, one a row, shape (n, d) or (n, C, H, W); ``y_train``,
    ``y_test``: integer labels 0..``num_classes`` − 1; numpy arrays or torch tensors (made float32 and
    int64). ``client_indices``: only for data with a natural split, one integer array a client of its
    training rows (each client at least one, no row twice); None: ``data.partition`` splits them.
    ``client_test_indices``: with ``client_indices``, each client's own rows of the test split (LEAF's
    per-user test samples; a client may have none), what per-client evaluation reads
    (``eval.client_test: natural``); None: a client's test set is drawn to match its labels."""
    x_train: np.ndarray | torch.Tensor
    y_train: np.ndarray | torch.Tensor
    x_test: np.ndarray | torch.Tensor
    y_test: np.ndarray | torch.Tensor
    num_classes: int
    client_indices: list[np.ndarray] | None = None
    client_test_indices: list[np.ndarray] | None = None


def check_source(src, name: str, strict: bool = True) -> Source:
    """``src`` as a :class:`Source` of float32 samples and int64 labels, or one line naming ``data.name``
    and what is wrong: its type, an array's type, dtype or shape, lengths that differ, a label outside
    0..num_classes − 1, an empty split. ``strict`` (a dataset of the user's): also every sample finite
    and a natural split's clients non-empty, in range and disjoint. Arrays already of the right dtype
    are kept as they are (no copy)."""
    where = f"data.name: dataset {name!r}"
    if not isinstance(src, Source):
        raise ConfigError(f"{where} returned a {type(src).__name__}, not a fedsweep.Source(x_train, y_train, x_test, "
                          "y_test, num_classes, client_indices=None)")
    c = src.num_classes
    if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 2:
        raise ConfigError(f"{where}: num_classes must be an integer of at least 2, got {c!r}")
    arrays = {}
    for key in ("x_train", "y_train", "x_test", "y_test"):
        a = getattr(src, key)
        if isinstance(a, (list, tuple)):
            a = np.asarray(a)
        if not isinstance(a, np.ndarray) and not _is_tensor(a):
            raise ConfigError(f"{where}: {key} is a {type(a).__name__}, not a numpy array or a torch tensor")
        arrays[key] = a
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if _kind(x) != "f":
            raise ConfigError(f"{where}: x_{split} holds {x.dtype} values; samples must be floats (e.g. pixels / 255)")
        if x.ndim < 2:
            raise ConfigError(f"{where}: x_{split} has shape {tuple(x.shape)}; samples are rows: (n, d) or (n, C, H, W)")
        if _kind(y) not in "iu" or y.ndim != 1:
            what = f"holds {y.dtype} values" if _kind(y) not in "iu" else f"has shape {tuple(y.shape)}"
            raise ConfigError(f"{where}: y_{split} {what}; labels must be one integer class id a sample, 0..{c - 1} "
                              "(e.g. y.astype(int))")
        if len(x) != len(y):
            raise ConfigError(f"{where}: x_{split} has {len(x)} samples but y_{split} {len(y)} labels")
        if len(y) == 0:
            raise ConfigError(f"{where}: the {split} split is empty")
        low, high = int(y.min()), int(y.max())
        if low < 0 or high >= c:
            raise ConfigError(f"{where}: y_{split} holds label {low if low < 0 else high}, outside 0..{c - 1} "
                              f"(num_classes {c})")
        if strict and not _all_finite(x):
            raise ConfigError(f"{where}: x_{split} holds NaN or infinite values")
    if tuple(arrays["x_train"].shape[1:]) != tuple(arrays["x_test"].shape[1:]):
        raise ConfigError(f"{where}: train samples have shape {tuple(arrays['x_train'].shape[1:])} but test samples "
                          f"{tuple(arrays['x_test'].shape[1:])}")
    parts = src.client_indices
    if parts is not None and strict:
        parts = _check_parts(parts, len(arrays["y_train"]), where)
    tests = src.client_test_indices
    if tests is not None and strict:
        tests = _check_test_parts(tests, parts, len(arrays["y_test"]), where)
    converted = {k: _as(v, "float32" if k.startswith("x") else "int64") for k, v in arrays.items()}
    if all(converted[k] is getattr(src, k) for k in converted) and parts is src.client_indices and \
            tests is src.client_test_indices and type(c) is int:
        return src
    return Source(**converted, num_classes=int(c), client_indices=parts, client_test_indices=tests)


def _is_tensor(a) -> bool:
    return type(a).__module__.startswith("torch") and hasattr(a, "dtype") and hasattr(a, "shape")


def _kind(a) -> str:
    """numpy's dtype kind (f, i, u, b, ...) of an array or a tensor."""
    if isinstance(a, np.ndarray):
        return a.dtype.kind
    return "f" if a.dtype.is_floating_point else "b" if a.dtype == torch.bool else \
        "c" if a.dtype.is_complex else "u" if a.dtype == torch.uint8 else "i"


def _all_finite(x) -> bool:
    return bool(np.isfinite(x).all()) if isinstance(x, np.ndarray) else bool(torch.isfinite(x).all())


def _as(a, dtype: str):
    if isinstance(a, np.ndarray):
        return a if a.dtype == dtype else a.astype(dtype)
    want = getattr(torch, dtype)
    return a if a.dtype == want else a.to(want)


def _check_test_parts(tests, parts, n: int, where: str) -> list[np.ndarray]:
    """Each client's test rows: one integer array a client of ``client_indices``, within 0..n − 1, no
    row twice in one client (empty allowed: a client without test samples is not scored)."""
    if parts is None:
        raise ConfigError(f"{where}: client_test_indices needs client_indices (a natural split): each client's "
                          "test rows belong to the clients it names")
    if isinstance(tests, np.ndarray) or not hasattr(tests, "__len__") or len(tests) != len(parts):
        raise ConfigError(f"{where}: client_test_indices must be a list of index arrays, one for each of the "
                          f"{len(parts)} clients of client_indices")
    out = []
    for i, p in enumerate(tests):
        p = np.asarray(p.cpu() if _is_tensor(p) else p)
        if p.ndim != 1 or (len(p) and p.dtype.kind not in "iu"):
            raise ConfigError(f"{where}: client_test_indices[{i}] must be a 1-d array of integer test-row indices")
        if len(p) and (p.min() < 0 or p.max() >= n):
            raise ConfigError(f"{where}: client_test_indices[{i}] holds row "
                              f"{int(p.max() if p.max() >= n else p.min())}, outside the {n} test samples")
        if len(np.unique(p)) < len(p):
            raise ConfigError(f"{where}: client_test_indices[{i}] holds a test row twice")
        out.append(p.astype(np.int64, copy=False))
    return out


def _check_parts(parts, n: int, where: str) -> list[np.ndarray]:
    """A natural split: one non-empty integer array a client, within 0..n − 1, no row twice."""
    if isinstance(parts, (np.ndarray,)) or not hasattr(parts, "__len__") or len(parts) == 0:
        raise ConfigError(f"{where}: client_indices must be a list of index arrays, one a client")
    out, seen = [], np.zeros(n, dtype=bool)
    for i, p in enumerate(parts):
        p = np.asarray(p.cpu() if _is_tensor(p) else p)
        if p.ndim != 1 or p.dtype.kind not in "iu" or len(p) == 0:
            raise ConfigError(f"{where}: client_indices[{i}] must be a non-empty 1-d array of integer row indices")
        if p.min() < 0 or p.max() >= n:
            raise ConfigError(f"{where}: client_indices[{i}] holds row {int(p.max() if p.max() >= n else p.min())}, "
                              f"outside the {n} training samples")
        if seen[p].any() or len(np.unique(p)) < len(p):
            raise ConfigError(f"{where}: client_indices[{i}] holds a training row another client (or itself) holds too")
        seen[p] = True
        out.append(p.astype(np.int64, copy=False))
    return out
