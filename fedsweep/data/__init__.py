"""The federated dataset: all samples as tensors (on the device once) plus per-client index tables.

``load_federated(cfg.data, seed, cfg.server_data)`` = a source (:mod:`fedsweep.data.sources`), minus the
hybrid-FL server pool (:mod:`fedsweep.data.server`) where there is one, minus a central validation split
(:mod:`fedsweep.data.validation`) where asked, + a partition (:mod:`fedsweep.data.partition`), + each
client's own validation samples where the split is federated: a pure function of ``(cfg, seed)``. No
DataLoader is involved: engines index ``x_train[client_indices[i][batch]]`` directly (docs/design.md §1.5).

The split itself (:func:`split_federated`) is numpy: a sweep's driver makes it for each of its trials'
data set-ups before Ray starts (``sweep.checks.check_data``) without importing torch, which it would
otherwise import for nothing else (~0.8 s of its start-up).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from fedsweep.config.schema import ConfigError, DataConfig, ServerDataConfig
from fedsweep.data.partition import describe_partition, partition
from fedsweep.data.server import server_size, split_pool
from fedsweep.data.sources import Source, load_source
from fedsweep.data.validation import central_holdout, central_holdout_natural, federated_holdout
from fedsweep.util.lazy import torch
from fedsweep.sim.client_index import ClientIndex
from fedsweep.sim.rng import np_rng

__all__ = ["FederatedData", "Source", "Split", "load_federated", "partition", "split_federated"]


@dataclass
class FederatedData:
    """Train/test tensors and each client's indices into ``x_train``.

    ``client_indices`` (a :class:`~fedsweep.sim.client_index.ClientIndex`: one array for all clients, read
    like a list of per-client tensors; a list given here is made one) are int64, non-empty, pairwise disjoint (together: every training sample in use
    not in ``server_pool`` or the validation split). ``scheme`` is a short label of how the clients
    were formed (e.g. ``classes P=2``), for describe(). ``server_pool`` (hybrid FL, None without server
    data) holds the sorted int64 indices into ``x_train`` of the server's pool, disjoint from every
    client; ``server_size`` is m_s, the samples the server uses per round
    (:func:`fedsweep.data.server.round_server_indices`).
    ``validation`` (``data.validation``, '' without a split): ``central`` has its samples in ``x_val``,
    ``y_val``; ``federated`` has each client's in ``val_indices`` (int64 indices into ``x_train``, empty
    for a client of one sample), disjoint from ``client_indices``. ``client_test`` (None unless the
    dataset gives them: LEAF's users, a natural split's ``client_test_indices``): each client's own
    indices into ``x_test``, which per-client evaluation reads (``eval.client_test``).
    """
    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    client_indices: ClientIndex
    num_classes: int
    input_shape: tuple[int, ...]
    scheme: str = ""
    server_pool: torch.Tensor | None = None
    server_size: int = 0
    validation: str = ""
    validation_fraction: float = 0.0
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None
    val_indices: ClientIndex | None = None
    client_test: ClientIndex | None = None

    def __post_init__(self):
        self.client_indices = ClientIndex.from_parts(self.client_indices)
        if self.val_indices is not None:
            self.val_indices = ClientIndex.from_parts(self.val_indices)
        if self.client_test is not None:
            self.client_test = ClientIndex.from_parts(self.client_test)

    def to(self, device: torch.device | str) -> "FederatedData":
        """A copy with every tensor on ``device`` (a no-op copy where it already is)."""
        return dataclasses.replace(
            self,
            x_train=self.x_train.to(device), y_train=self.y_train.to(device),
            x_test=self.x_test.to(device), y_test=self.y_test.to(device),
            client_indices=self.client_indices.to(device),
            server_pool=None if self.server_pool is None else self.server_pool.to(device),
            x_val=None if self.x_val is None else self.x_val.to(device),
            y_val=None if self.y_val is None else self.y_val.to(device),
            val_indices=None if self.val_indices is None else self.val_indices.to(device),
            client_test=None if self.client_test is None else self.client_test.to(device))

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    @property
    def client_sizes(self) -> torch.Tensor:
        """int64 (N,) n_i, on the device of the data."""
        return self.client_indices.sizes

    def describe(self) -> str:
        sizes = self.client_indices.sizes
        scheme = f" ({self.scheme})" if self.scheme else ""
        text = (f"{self.name}: {len(self.y_train)} train / {len(self.y_test)} test, {self.num_classes} classes, "
                f"{self.num_clients} clients{scheme}, sizes {int(sizes.min())}..{int(sizes.max())}")
        if self.server_pool is not None:
            per_round = ("fixed" if len(self.server_pool) == self.server_size
                         else f"m_s {self.server_size}/round")
            text += f", server pool {len(self.server_pool)} ({per_round})"
        if self.validation:
            held = len(self.y_val) if self.y_val is not None else self.val_indices.values.numel()
            text += f", validation {100 * self.validation_fraction:g}% {self.validation} ({held})"
        return text


def load_federated(cfg: DataConfig, seed: int, server: ServerDataConfig | None = None) -> FederatedData:
    """Load ``cfg.name`` and split its training set over ``cfg.num_clients`` clients.

    Tensors stay on the CPU; call ``.to(device)`` once. ``synthetic`` brings its own per-client split
    and ignores ``cfg.partition``; every other dataset is split by :func:`partition`.
    User errors (missing files, impossible partitions) raise ``ConfigError`` naming the key.

    ``server`` (hybrid FL) with m_s > 0: the server pool (:func:`~fedsweep.data.server.split_pool`) is
    taken out of the training set *before* the clients are formed, and only the remaining indices are
    partitioned (client indices still index ``x_train``, which is unchanged). For ``synthetic`` the
    pool is taken the same way from all clients' training samples together, except one random sample
    per client that is reserved so every client keeps ≥ 1; each client then keeps its other samples.
    Without ``server`` (or with m_s = 0) the result is exactly that of the plain call.

    ``cfg.validation_fraction`` > 0: the validation split (:mod:`fedsweep.data.validation`), held out
    after the server pool and before the partition (``central``), or out of each client's samples
    after it (``federated``); with 0 every draw and index is what it is without the option.
    """
    s = split_federated(cfg, seed, server)
    src = s.source
    x_train, y_train = _tensor(src.x_train), _tensor(src.y_train)
    central = torch.from_numpy(s.val) if s.val is not None else None
    return FederatedData(
        name=cfg.name,
        x_train=x_train, y_train=y_train,
        x_test=_tensor(src.x_test), y_test=_tensor(src.y_test),
        client_indices=ClientIndex.from_parts(s.parts),
        num_classes=src.num_classes,
        input_shape=tuple(src.x_train.shape[1:]),
        scheme=s.scheme,
        server_pool=None if s.pool is None else torch.from_numpy(s.pool),
        server_size=s.server_size,
        validation=cfg.validation if cfg.validation_fraction > 0 else "",
        validation_fraction=cfg.validation_fraction,
        x_val=x_train[central] if central is not None else None,
        y_val=y_train[central] if central is not None else None,
        val_indices=None if s.val_parts is None else ClientIndex.from_parts(s.val_parts),
        client_test=None if src.client_test_indices is None else ClientIndex.from_parts(src.client_test_indices),
    )


def _tensor(a) -> "torch.Tensor":
    """``torch.as_tensor`` without a copy, also of a source's read-only arrays (cached ones are made
    read-only so that no run changes another's data; fedsweep only reads them, and every use indexes or
    moves them, which copies), without torch's warning about writing to them."""
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return torch.as_tensor(a)


@dataclass
class Split:
    """What :func:`load_federated` makes before its tensors: the source, each client's int64 indices
    into its training samples (``parts``), the server pool's (``pool``, None without one), how the
    clients were formed (``scheme``), m_s (``server_size``) and the validation split: its indices
    (``val``, central) or each client's (``val_parts``, federated), None without one."""
    source: Source
    parts: list[np.ndarray]
    pool: np.ndarray | None
    scheme: str
    server_size: int
    val: np.ndarray | None = None
    val_parts: list[np.ndarray] | None = None


def split_federated(cfg: DataConfig, seed: int, server: ServerDataConfig | None = None) -> Split:
    """The source of ``cfg`` and its split over the clients (and the server pool), as
    :func:`load_federated` makes them, with the same errors; numpy only for ``digits`` and
    ``synthetic`` (torchvision's sources are loaded as tensors)."""
    src = load_source(cfg, seed)
    labels = np.asarray(src.y_train)
    keep = np.arange(len(labels))          # the training samples in use (data.train_size)
    if cfg.train_size is not None:
        if src.client_indices is not None:
            raise ConfigError(f"data.train_size: {cfg.name!r} comes split over clients already; unset train_size")
        if cfg.train_size > len(labels):
            raise ConfigError(f"data.train_size: {cfg.train_size} exceeds the {len(labels)} training samples of "
                              f"{cfg.name!r}; allowed 1..{len(labels)}")
        keep = np.sort(np_rng(seed, -1, "train_subset").permutation(len(labels))[:cfg.train_size])
    m_s = server_size(server, len(keep)) if server is not None else 0
    pool = None
    if src.client_indices is not None:
        parts, scheme = src.client_indices, "natural split"
        if len(parts) != cfg.num_clients:
            raise ConfigError(f"data.num_clients: N={cfg.num_clients}, but dataset {cfg.name!r} comes split over "
                              f"{len(parts)} clients (its client_indices); set data.num_clients: {len(parts)}")
        if m_s > 0:
            parts, pool = _split_natural(labels, parts, server, src.num_classes, seed)
        parts, val = central_holdout_natural(labels, parts, cfg, seed)
    else:
        allowed = keep
        if m_s > 0:
            allowed, pool = split_pool(labels[keep], server, src.num_classes, seed)
            allowed, pool = keep[allowed], keep[pool]
        allowed, val = central_holdout(labels, allowed, cfg, seed)
        parts = [allowed[p] for p in partition(labels[allowed], cfg.num_clients, cfg.partition, seed)]
        scheme = describe_partition(cfg.partition)
    parts, val_parts = federated_holdout(labels, parts, cfg, seed)
    return Split(src, parts, pool, scheme, m_s, val, val_parts)


def _split_natural(labels: np.ndarray, parts: list[np.ndarray], server: ServerDataConfig, num_classes: int,
                   seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """The server pool out of a natural split: one random sample per client is reserved (so each keeps
    ≥ 1), the pool is drawn from the rest like :func:`split_pool` does, each client keeps the rest."""
    rng = np_rng(seed, -1, "server_reserve")
    reserved = np.array([rng.choice(p) for p in parts], dtype=np.int64)
    allowed, pool = split_pool(labels, server, num_classes, seed, reserved=reserved)
    keep = np.zeros(len(labels), dtype=bool)
    keep[allowed] = True
    return [p[keep[p]] for p in parts], pool
