"""LEAF's federated datasets (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018) as
their natural split: one client per user (a FEMNIST writer, a synthetic-task device).

LEAF's ``preprocess.sh`` writes ``data/<dataset>/data/train/*.json`` and ``.../test/*.json``, each file
``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}`` (a
``"hierarchies"`` key, where there is one, is not read). ``data.root`` is that ``data/`` folder (the
one holding ``train/`` and ``test/``) or the ``<dataset>`` folder above it.

* Clients are the users of the train files, sorted by id, so the split does not depend on how LEAF
  cut them into files. ``data.num_clients`` N of U users: all of them (N = U), or N drawn from
  ``np_rng(seed, -1, "leaf_users")`` (N < U). The test set is the chosen users' test samples, and
  each client's own (``client_test_indices``) are its user's: per-client evaluation reads them.
* Samples are numeric lists: 784 of them (FEMNIST's 28×28 images) make shape (1, 28, 28), any other
  length d shape (d,); float32, as LEAF wrote them (no normalization). Labels are class ids; the
  number of classes is the largest label of all users, train and test, + 1, so it is the same for
  every N and seed.
* Tasks whose samples or labels are strings (Shakespeare, Sent140, CelebA's image file names,
  Reddit) are refused: fedsweep's models take numeric features, and no encoding of ours would be
  LEAF's benchmark.

Numpy only, as :func:`fedsweep.data.split_federated` is for every dataset made without torch (no
torch at import). The files are parsed once a process while they stay as they are (names, sizes and
times are the key): a sweep's worker loads the dataset for every trial, and FEMNIST's JSON takes
a minute or more to parse (~13,000 samples a second). The arrays are shared, hence read-only.
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass

import numpy as np

from fedsweep.config.schema import ConfigError
from fedsweep.data.sources import Source
from fedsweep.sim.rng import np_rng

SPLITS = ("train", "test")
ROOT_NEEDED = ("data.root: dataset 'leaf' reads LEAF's JSON files; set data.root to the folder holding their train/ "
               "and test/ folders (LEAF's data/<dataset>/data, which its preprocess.sh writes)")
IMAGE_SIDE = 28   # FEMNIST's images: 784 = 28·28 values a sample
HOW = ("LEAF's preprocess.sh writes them, e.g. ./preprocess.sh -s niid --sf 1.0 -k 0 -t sample in "
       "leaf/data/femnist makes data/femnist/data/{train,test}")
NOT_NUMERIC = ("fedsweep's models take numeric features (LEAF's FEMNIST and synthetic load); text and "
               "image-file tasks (Shakespeare, Sent140, CelebA, Reddit) need a sequence model or the image "
               "files, which fedsweep does not have")


def load_leaf(root: str, num_clients: int, seed: int) -> Source:
    """The LEAF data under ``root`` split over ``num_clients`` of its users (module docstring)."""
    folder = leaf_folder(root)
    stamp = files_stamp(folder)
    data = _parsed(folder, stamp)
    chosen = choose_users(len(data.users), num_clients, seed, folder)
    src = _source(folder, stamp, None if chosen is None else tuple(chosen.tolist()))
    if len(src.y_test) == 0:
        raise _no_test_samples(folder, num_clients, len(data.users), seed)
    return Source(src.x_train, src.y_train, src.x_test, src.y_test, src.num_classes,
                  client_indices=list(src.client_indices), client_test_indices=list(src.client_test_indices))


def _no_test_samples(folder: str, n_clients: int, n_users: int, seed: int) -> ConfigError:
    """A run with no test sample could not be scored: the chosen users (all, or N drawn) hold none."""
    where = os.path.join(folder, "test")
    if n_clients == n_users:
        return ConfigError(f"data.root: no user has a test sample under {where}; preprocess LEAF's data with -t sample")
    return ConfigError(f"data.num_clients: the {n_clients} users drawn at seed {seed} have no test sample under "
                       f"{where}; allowed 1..{n_users}: draw more of them")


def leaf_folder(root: str | None) -> str:
    """The folder holding ``train/`` and ``test/``: ``data.root`` itself, or its ``data/`` (LEAF's
    ``data/<dataset>`` folder), whichever has both."""
    if not root:
        raise ConfigError(ROOT_NEEDED)
    root = os.path.abspath(os.path.expanduser(root))
    for folder in (root, os.path.join(root, "data")):
        if all(os.path.isdir(os.path.join(folder, s)) for s in SPLITS):
            return folder
    if not os.path.isdir(root):
        raise ConfigError(f"data.root: {root} is not a folder; point it at LEAF's data/<dataset>/data, which "
                          f"holds train/ and test/ ({HOW})")
    missing = [s for s in SPLITS if not os.path.isdir(os.path.join(root, s))]
    raise ConfigError(f"data.root: no {' and '.join(m + '/' for m in missing)} folder under {root} (nor "
                      f"train/ and test/ under {os.path.join(root, 'data')}); LEAF's data/<dataset>/data holds "
                      f"train/*.json and test/*.json ({HOW})")


def files_stamp(folder: str) -> tuple:
    """((split, name, size, mtime), ...) of every ``.json`` file of ``train/`` and ``test/``, sorted:
    the cache key of their parse. A split without one is refused."""
    stamp = []
    for split in SPLITS:
        path = os.path.join(folder, split)
        names = sorted(n for n in os.listdir(path) if n.endswith(".json"))
        if not names:
            raise ConfigError(f"data.root: {path} holds no .json files; expected LEAF's {split} split as "
                              f"{split}/*.json ({HOW})")
        for n in names:
            st = os.stat(os.path.join(path, n))
            stamp.append((split, n, st.st_size, st.st_mtime_ns))
    return tuple(stamp)


def choose_users(n_users: int, n_clients: int, seed: int, folder: str) -> np.ndarray | None:
    """Sorted positions of the users that become clients (None: all of them)."""
    if n_clients > n_users:
        raise ConfigError(f"data.num_clients: {n_clients} exceeds the {n_users} users of the LEAF data under "
                          f"{folder}; allowed 1..{n_users} (one client a user)")
    if n_clients == n_users:
        return None
    return np.sort(np_rng(seed, -1, "leaf_users").choice(n_users, size=n_clients, replace=False))


# ---------------------------------------------------------------------------------------------
# The parse, once a process
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LeafData:
    """Every user's samples, users sorted by id: user i's training rows are
    ``train_offsets[i]:train_offsets[i + 1]`` of ``x_train``, its test rows likewise."""
    users: tuple[str, ...]
    x_train: np.ndarray
    y_train: np.ndarray
    train_offsets: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    test_offsets: np.ndarray
    num_classes: int


@functools.lru_cache(maxsize=1)
def _parsed(folder: str, stamp: tuple) -> LeafData:
    """The files of ``stamp`` parsed, checked and joined; kept for the next call with the same files."""
    split = {s: _read_split(folder, s, [n for sp, n, _, _ in stamp if sp == s]) for s in SPLITS}
    train, test = split["train"], split["test"]
    _check_test_users(folder, train, test)
    users = tuple(sorted(train))
    dim = _feature_dim(folder, users, train, test)
    x_tr, y_tr, off_tr = _join([train[u] for u in users], dim)
    x_te, y_te, off_te = _join([test.get(u) for u in users], dim)
    labels = np.concatenate([y_tr, y_te])
    if labels.min() < 0:
        raise ConfigError(f"data.root: the LEAF data under {folder} has a negative label ({int(labels.min())}); "
                          "labels are class ids 0..C-1")
    distinct = len(np.unique(labels))
    if labels.max() >= MAX_CLASSES and labels.max() >= 10 * distinct:   # a model of that many outputs: not a class id
        raise ConfigError(f"data.root: the LEAF data under {folder} has a label {int(labels.max()):,} among its "
                          f"{distinct:,} distinct labels; labels are class ids 0..C-1 (C = the largest + 1: "
                          f"{int(labels.max()) + 1:,} classes here), so renumber them")
    shape = (1, IMAGE_SIDE, IMAGE_SIDE) if dim == IMAGE_SIDE * IMAGE_SIDE else (dim,)
    arrays = [x_tr.reshape(-1, *shape), y_tr, off_tr, x_te.reshape(-1, *shape), y_te, off_te]
    for a in arrays:
        a.flags.writeable = False
    return LeafData(users, *arrays[:3], *arrays[3:], num_classes=int(labels.max()) + 1)


@functools.lru_cache(maxsize=1)
def _source(folder: str, stamp: tuple, chosen: tuple[int, ...] | None) -> Source:
    """The chosen users' samples (all: the parse's own arrays, no copy), one client a user in sorted
    order; kept, as the parse is, for the next trial of the same set-up."""
    d = _parsed(folder, stamp)
    if chosen is None:
        x_tr, y_tr, off_tr, x_te, y_te, off_te = d.x_train, d.y_train, d.train_offsets, d.x_test, d.y_test, d.test_offsets
    else:
        rows_tr, off_tr = _rows(d.train_offsets, chosen)
        rows_te, off_te = _rows(d.test_offsets, chosen)
        x_tr, y_tr, x_te, y_te = d.x_train[rows_tr], d.y_train[rows_tr], d.x_test[rows_te], d.y_test[rows_te]
    clients = [np.arange(off_tr[i], off_tr[i + 1], dtype=np.int64) for i in range(len(off_tr) - 1)]
    tests = [np.arange(off_te[i], off_te[i + 1], dtype=np.int64) for i in range(len(off_te) - 1)]
    for a in (x_tr, y_tr, x_te, y_te, *clients, *tests):
        a.flags.writeable = False
    return Source(x_tr, y_tr, x_te, y_te, num_classes=d.num_classes, client_indices=clients,
                  client_test_indices=tests)


def _rows(offsets: np.ndarray, chosen: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(the rows of the chosen users, in their order; their offsets in the rows taken)."""
    rows = [np.arange(offsets[i], offsets[i + 1], dtype=np.int64) for i in chosen]
    return np.concatenate(rows), np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Reading the files
# ---------------------------------------------------------------------------------------------

UserData = tuple[np.ndarray, np.ndarray, str]   # (x (n, d) float32, y (n,) int64, file it came from)


def _read_split(folder: str, split: str, names: list[str]) -> dict[str, UserData]:
    """Every user of one split's files; a user in two of them is refused (which to take is unclear)."""
    users: dict[str, UserData] = {}
    for name in names:
        path = os.path.join(folder, split, name)
        for user, (x, y) in _read_file(path).items():
            if user in users:
                raise ConfigError(f"data.root: user {user!r} is in both {users[user][2]} and {path}; a LEAF split "
                                  "holds each user in one file")
            users[user] = (x, y, path)
    return users


def _read_file(path: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """One LEAF JSON file as numpy arrays, user by user (a file's Python floats are dropped before
    the next file is read: all of FEMNIST's at once would take ~20 GB)."""
    doc = _load_json(path)
    users, counts, data = doc.get("users"), doc.get("num_samples"), doc.get("user_data")
    if not isinstance(users, list) or not isinstance(counts, list) or not isinstance(data, dict) \
            or len(users) != len(counts):
        raise ConfigError(f"data.root: {path} is not a LEAF file: expected 'users' and 'num_samples' (lists of "
                          "equal length) and 'user_data' (an object: user -> {x, y})")
    out = {}
    for user, n in zip(users, counts):
        user = str(user)
        if user in out:
            raise ConfigError(f"data.root: {path} lists user {user!r} twice in 'users'")
        entry = data.get(user)
        if not isinstance(entry, dict) or not isinstance(entry.get("x"), list) or not isinstance(entry.get("y"), list):
            raise ConfigError(f"data.root: {path} lists user {user!r} in 'users' but 'user_data' has no x and y "
                              "lists for it")
        x, y = entry["x"], entry["y"]
        if not (n == len(x) == len(y)):
            raise ConfigError(f"data.root: {path}, user {user!r}: num_samples says {n} but x has {len(x)} "
                              f"and y {len(y)} samples")
        out[user] = (_features(path, user, x), _labels(path, user, y))
    return out


def _load_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError(f"data.root: {path} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); "
                          f"expected a LEAF file ({HOW})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"data.root: could not read {path} ({type(e).__name__}: {e})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"data.root: {path} is not a LEAF file: expected an object with users, num_samples "
                          "and user_data")
    return doc


def _features(path: str, user: str, x: list) -> np.ndarray:
    """float32 (n, d) of one user's samples: equal-length lists of numbers; strings are refused."""
    if x and isinstance(_first_leaf(x[0]), str):
        raise ConfigError(f"data.root: {path} holds samples that are strings (user {user!r}: text, or image "
                          f"file names); {NOT_NUMERIC}")
    if not x:
        return np.empty((0, 0), np.float32)
    try:
        a = np.asarray(x, dtype=np.float32)
    except (ValueError, TypeError):
        a = None
    if a is None or a.ndim != 2:
        raise ConfigError(f"data.root: {path}, user {user!r}: each sample x must be a flat list of numbers, "
                          "all of one length")
    return a


#: Labels from here on, ten times more than the distinct labels seen, are ids of something else (a
#: model of 2·10^9 outputs would be built for them): refused, saying so.
MAX_CLASSES = 100_000


def _labels(path: str, user: str, y: list) -> np.ndarray:
    """int64 (n,) class ids; string labels (Shakespeare's next character) are refused."""
    if y and isinstance(_first_leaf(y[0]), str):
        raise ConfigError(f"data.root: {path} holds labels that are strings (user {user!r}); {NOT_NUMERIC}")
    a = np.asarray(y)
    if len(y) and (a.ndim != 1 or a.dtype.kind not in "iu"):
        raise ConfigError(f"data.root: {path}, user {user!r}: labels y must be integers (class ids)")
    return a.astype(np.int64).reshape(len(y))


def _first_leaf(value):
    """The first non-list inside ``value`` (a sample may nest lists, as Sent140's and Reddit's do)."""
    while isinstance(value, list) and value:
        value = value[0]
    return value


def _check_test_users(folder: str, train: dict[str, UserData], test: dict[str, UserData]) -> None:
    """Every test user is a client: a user with test samples and no training ones is refused."""
    only = sorted(set(test) - set(train))
    if not only:
        return
    named = ", ".join(repr(u) for u in only[:3]) + (f" and {len(only) - 3} more" if len(only) > 3 else "")
    raise ConfigError(f"data.root: users {named} have test samples ({test[only[0]][2]}) but none under "
                      f"{os.path.join(folder, 'train')}; every user is a client that trains on its own samples "
                      "(LEAF's -t user split holds whole users out: preprocess with -t sample)")


def _feature_dim(folder: str, users: tuple[str, ...], train: dict[str, UserData],
                 test: dict[str, UserData]) -> int:
    """The one sample length of every user; a user without training samples is refused."""
    for user in users:
        if len(train[user][0]) == 0:
            raise ConfigError(f"data.root: user {user!r} in {train[user][2]} has no training samples; every user "
                              "is a client and needs at least one (LEAF's -k sets the minimum)")
    dim = train[users[0]][0].shape[1]
    for table in (train, test):
        for user, (x, _, path) in sorted(table.items()):
            if len(x) and x.shape[1] != dim:
                raise ConfigError(f"data.root: {path}, user {user!r}: samples of {x.shape[1]} values, where "
                                  f"{users[0]!r}'s have {dim}; every sample must have the same length")
    return dim


def _join(parts: list[UserData | None], dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x (n, dim), y (n,), offsets (users + 1,)) of the users' samples in order (None: none)."""
    xs = [p[0].reshape(-1, dim) if p is not None else np.empty((0, dim), np.float32) for p in parts]
    ys = [p[1] if p is not None else np.empty(0, np.int64) for p in parts]
    offsets = np.concatenate([[0], np.cumsum([len(y) for y in ys])]).astype(np.int64)
    return np.concatenate(xs), np.concatenate(ys), offsets
