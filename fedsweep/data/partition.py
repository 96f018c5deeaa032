"""Partitions of a labelled training set over N clients (docs/design.md §2.4, ``data.partition``).

Every scheme is a pure function of ``(labels, N, cfg, seed)``: it draws only from
``np_rng(seed, -1, "partition")``, never from a global RNG. Every scheme gives every client at least
one sample and puts every sample on exactly one client: none drops data. A request that cannot be met
(more clients than samples, P larger than the number of classes, ...) raises
:class:`~fedsweep.config.schema.ConfigError` naming the config key.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from fedsweep.config.schema import ConfigError, PartitionConfig
from fedsweep.sim.rng import np_rng

Scheme = Callable[[np.ndarray, int, PartitionConfig, np.random.Generator], list[np.ndarray]]


def partition(labels: np.ndarray, num_clients: int, cfg: PartitionConfig, seed: int) -> list[np.ndarray]:
    """Split ``range(len(labels))`` over ``num_clients`` clients by the scheme ``cfg.kind``.

    Returns one sorted int64 index array per client; each non-empty, pairwise disjoint, and together
    exactly ``0..len(labels)-1``.
    """
    labels = np.asarray(labels).reshape(-1)
    n = len(labels)
    if num_clients > n:
        raise ConfigError(f"data.num_clients: N={num_clients} clients but only {n} training samples; "
                          f"allowed 1..{n}")
    parts = _SCHEMES[cfg.kind](labels, num_clients, cfg, np_rng(seed, -1, "partition"))
    parts = [np.sort(p).astype(np.int64) for p in parts]
    # The contract every scheme must keep; cheap, and a broken scheme must not reach training.
    assert len(parts) == num_clients and min(map(len, parts)) >= 1 and sum(map(len, parts)) == n
    return parts


def describe_partition(cfg: PartitionConfig) -> str:
    """Short human label of a partition config, e.g. ``classes P=2`` (used by FederatedData.describe)."""
    return {
        "iid": "iid",
        "classes": f"classes P={cfg.classes_per_client}",
        "shards": f"shards of {cfg.shard_size}",
        "dirichlet": f"dirichlet α={cfg.alpha:g}",
        "quantity": f"quantity ξ={cfg.ratio:g}",
    }[cfg.kind]


# ---------------------------------------------------------------------------------------------
# Schemes
# ---------------------------------------------------------------------------------------------

def _iid(labels: np.ndarray, n_clients: int, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """IID: a random permutation cut into N parts whose sizes differ by at most one."""
    return np.array_split(rng.permutation(len(labels)), n_clients)


def _classes(labels: np.ndarray, n_clients: int, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """P classes per client on non-overlapping shards (FedLGA, Sec. V-A, after LG-FedAvg [72]).

    Each class c is shuffled and cut into s_c near-equal shards, with Σ_c s_c = N·P; every client
    receives P shards of P *different* classes, so it holds exactly P classes.

    * Clean case, N·P divisible by the number of classes C: every class is cut into N·P/C shards
      (N=50, P=2, C=10: ten shards per class, ~1/10 of a class each).
    * Otherwise the N·P mod C extra shards go to the largest classes (ties at random), so shard sizes
      stay as even as possible; shard sizes then differ between classes, client sizes a bit more.
    * N·P < C is an error: some class would get no shard and its samples would be lost.

    Assignment: dealing the class-sorted shards round-robin (shard j -> client j mod N) is always
    valid, since a class's s_c ≤ N consecutive shards land on distinct clients. That deal pairs
    classes rigidly, so it is then randomized by edge switching (swap two clients' shards whenever
    both keep P distinct classes), which keeps validity and mixes the class combinations.
    """
    p = cfg.classes_per_client
    classes, counts = np.unique(labels, return_counts=True)
    n_cls, n_shards = len(classes), n_clients * p
    if p > n_cls:
        raise ConfigError(f"data.partition.classes_per_client: P={p} but the training set has {n_cls} classes; "
                          f"allowed 1..{n_cls}")
    if n_shards < n_cls:
        raise ConfigError(f"data.partition.classes_per_client: N·P = {n_clients}·{p} = {n_shards} shards cannot "
                          f"cover all {n_cls} classes (a class without a shard would be lost); "
                          f"need N·P ≥ {n_cls}")
    per_class = np.full(n_cls, n_shards // n_cls)
    largest_first = np.lexsort((rng.random(n_cls), -counts))
    per_class[largest_first[: n_shards % n_cls]] += 1
    short = np.flatnonzero(per_class > counts)
    if len(short):
        c = short[0]
        raise ConfigError(f"data.num_clients: class {classes[c]} has {counts[c]} training samples, too few for "
                          f"its {per_class[c]} shards (N·P/C with N={n_clients}, P={p}); lower data.num_clients "
                          f"or data.partition.classes_per_client")

    shard_idx: list[np.ndarray] = []
    shard_cls: list[int] = []
    for ci, c in enumerate(classes):
        for shard in np.array_split(rng.permutation(np.flatnonzero(labels == c)), per_class[ci]):
            shard_idx.append(shard)
            shard_cls.append(ci)
    # Round-robin deal of the class-sorted shards: client i holds shards i, i+N, i+2N, ...
    held = np.arange(n_shards).reshape(p, n_clients).T.tolist()
    _switch_edges(held, shard_cls, rng)
    return [np.concatenate([shard_idx[s] for s in row]) for row in held]


def _switch_edges(held: list[list[int]], shard_cls: list[int], rng: np.random.Generator, sweeps: int = 10) -> None:
    """Randomize a valid shard assignment in place by swaps that keep every client's classes distinct."""
    n_clients, p = len(held), len(held[0])
    classes = [{shard_cls[s] for s in row} for row in held]
    tries = sweeps * n_clients * p
    a_s, b_s = rng.integers(n_clients, size=tries).tolist(), rng.integers(n_clients, size=tries).tolist()
    i_s, j_s = rng.integers(p, size=tries).tolist(), rng.integers(p, size=tries).tolist()
    for a, b, i, j in zip(a_s, b_s, i_s, j_s):
        sa, sb = held[a][i], held[b][j]
        ca, cb = shard_cls[sa], shard_cls[sb]
        if a == b or ca == cb or cb in classes[a] or ca in classes[b]:
            continue
        held[a][i], held[b][j] = sb, sa
        classes[a].remove(ca), classes[a].add(cb)
        classes[b].remove(cb), classes[b].add(ca)


def _shards(labels: np.ndarray, n_clients: int, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """McMahan et al. 2017 (FedAvg) pathological non-IID shards, as used by FedSoftMax.

    Sort by label (random order within a class), cut into consecutive shards of ``shard_size``
    (the last one shorter when ``shard_size`` does not divide n), shuffle the shards and deal them out:
    every client gets ⌊S/N⌋ shards and the S mod N leftover shards go one each to randomly chosen
    clients, so nothing is lost. A shard can straddle two adjacent classes, as in the original.
    """
    n, size = len(labels), cfg.shard_size
    n_shard = -(-n // size)
    if n_shard < n_clients:
        raise ConfigError(f"data.partition.shard_size: {size} cuts the {n} training samples into {n_shard} shards, "
                          f"fewer than the N={n_clients} clients; allowed 1..{n // n_clients}")
    perm = rng.permutation(n)
    by_label = perm[np.argsort(labels[perm], kind="stable")]
    shards = [by_label[s: s + size] for s in range(0, n, size)]
    dealt = np.array_split(rng.permutation(n_shard), n_clients)  # the first S mod N get one extra...
    order = rng.permutation(n_clients)                           # ...and these are random clients
    out: list[np.ndarray] = [None] * n_clients  # type: ignore[list-item]
    for k, ids in zip(order, dealt):
        out[k] = np.concatenate([shards[s] for s in ids])
    return out


def _dirichlet(labels: np.ndarray, n_clients: int, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """Label-distribution skew of Hsu et al. 2019 (also FedCLG): per class, q ~ Dir(α·1_N) over clients.

    Each class's shuffled samples are cut at the rounded cumulative proportions N·cumsum(q). Small α
    gives clients few classes, large α approaches IID. Clients left empty (likely for small α) each take
    one random sample from the then-largest client: deterministic, always terminates (with n ≥ N a
    client with ≥ 2 samples exists whenever one is empty), and changes the draw minimally, unlike
    resampling until no client is empty, which may never end for tiny α.
    """
    owner = np.empty(len(labels), dtype=np.int64)
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        q = rng.dirichlet(np.full(n_clients, cfg.alpha))
        cuts = np.round(np.cumsum(q)[:-1] * len(idx)).astype(np.int64)
        owner[idx] = np.searchsorted(cuts, np.arange(len(idx)), side="right")
    sizes = np.bincount(owner, minlength=n_clients)
    for k in np.flatnonzero(sizes == 0):
        donor = int(np.argmax(sizes))
        owner[rng.choice(np.flatnonzero(owner == donor))] = k
        sizes[donor] -= 1
        sizes[k] += 1
    order = np.argsort(owner, kind="stable")
    return np.split(order, np.cumsum(sizes)[:-1])


def _quantity(labels: np.ndarray, n_clients: int, cfg: PartitionConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """Quantity skew with two client sizes (FedLGA, Sec. V-D "imbalanced remote training data").

    ⌊N/2⌋ random clients are large and hold ξ = ``ratio`` times as many samples as each of the other
    ⌈N/2⌉ small clients; sizes are rounded by largest remainder so they sum to n. The data is IID
    otherwise (a random permutation cut at those sizes).
    """
    n, xi = len(labels), cfg.ratio
    n_large = n_clients // 2
    unit = n / (n_clients - n_large + xi * n_large)
    target = np.where(np.arange(n_clients) < n_large, xi * unit, unit)
    sizes = np.floor(target).astype(np.int64)
    sizes[np.argsort(sizes - target, kind="stable")[: n - sizes.sum()]] += 1  # largest remainders
    if sizes.min() < 1:
        raise ConfigError(f"data.partition.ratio: ξ={xi:g} leaves the small clients with no sample "
                          f"({n} training samples over N={n_clients}); lower it or data.num_clients")
    sizes = sizes[rng.permutation(n_clients)]
    return np.split(rng.permutation(n), np.cumsum(sizes)[:-1])


_SCHEMES: dict[str, Scheme] = {
    "iid": _iid,
    "classes": _classes,
    "shards": _shards,
    "dirichlet": _dirichlet,
    "quantity": _quantity,
}
