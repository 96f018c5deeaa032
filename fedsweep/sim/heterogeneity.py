"""The round plan: who is sampled, how much local work each completes, and which batches it sees.

docs/design.md §2 is the contract. Every draw of round t derives from ``(seed, t, purpose)``
(:mod:`fedsweep.sim.rng`), so both engines and a resumed run see the same plan. Rounds sample K of
the N clients, or of those ``eval.unseen_clients`` leaves to train (:func:`unseen_clients`).

Heterogeneity models (``heterogeneity.kind``), with E = ``local.steps``:

- ``none``        every client completes E.
- ``stragglers``  (FedLGA §III-B) exactly round(ρK) sampled clients are stragglers; a straggler
                  completes E_i ~ U{E−τ_max, …, E−1} (clipped to ≥ 1) and reports τ_i = E − E_i + 1.
- ``uniform``     (FedNova-style) E_i ~ U{E_min, …, E_max}.
- ``profiles``    persistent per-client speeds s_i (lognormal with σ = ``speeds``, or a CSV trace),
                  E_i = clip(floor(s_i·D), 1, E) for a round deadline D; a sampled client drops out
                  (returns nothing) with probability ``dropout``.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedsweep.config.checks import unseen_count
from fedsweep.config.schema import ConfigError, RunConfig
from fedsweep.sim.client_index import ClientIndex
from fedsweep.util.lazy import torch
from fedsweep.sim.rng import batch_keys, derive_seed, generator, np_rng


@dataclass
class RoundPlan:
    """Everything decided about round t before any client trains (all tensors on CPU, shape (K,))."""
    round: int
    clients: torch.Tensor   # sampled client ids
    work: torch.Tensor      # E_i, completed local work in `local.unit`s (0 for a dropped client)
    steps: torch.Tensor     # SGD steps each client actually takes (= work for unit=steps)
    sizes: torch.Tensor     # n_i, each sampled client's number of training samples
    dropped: torch.Tensor   # bool: returned nothing this round
    expected_work: int      # E
    lr: float               # η_l of this round, after decay
    server: object = None   # hybrid FL: the round's server data (algorithms.base.ServerRound), set by the module

    @property
    def num_sampled(self) -> int:
        return int(self.clients.numel())

    @property
    def tau(self) -> torch.Tensor:
        """τ_i = E − E_i + 1 (FedLGA Alg. 1 line 6); 1 for clients that completed E."""
        return self.expected_work - self.work + 1

    @property
    def missing_steps(self) -> torch.Tensor:
        """SGD steps each client did not take: (E − E_i) times its steps per unit of work (1 with
        ``unit=steps``, ceil(n_i/B) with ``unit=epochs``); 0 for dropped clients."""
        per_unit = torch.where(self.work > 0, self.steps // self.work.clamp(min=1), torch.zeros_like(self.steps))
        return (self.expected_work - self.work).clamp(min=0) * per_unit

    @property
    def stragglers(self) -> torch.Tensor:
        """bool (K,): participated but completed less than E."""
        return (self.work < self.expected_work) & ~self.dropped

    @property
    def participated(self) -> torch.Tensor:
        return ~self.dropped

    def weights(self, kind: str) -> torch.Tensor:
        """Aggregation weights q_i over the clients that returned: uniform 1/K' or n_i/Σn."""
        base = self.sizes.double() if kind == "data" else torch.ones(self.num_sampled, dtype=torch.float64)
        base = base * self.participated
        total = base.sum()
        return base / total if total > 0 else base


def decayed_lr(lr: float, cfg: RunConfig, t: int) -> float:
    """A learning rate at round t: max(lr · local.lr_decay^t, local.lr_min) (FedCLG §VI-A: decay 0.99
    down to 0.001, for the clients' η_l and the server's γ alike)."""
    return max(lr * cfg.local.lr_decay ** t, cfg.local.lr_min)


def local_lr(cfg: RunConfig, t: int) -> float:
    """η_l at round t."""
    return decayed_lr(cfg.local.lr, cfg, t)


class Planner:
    """Builds the :class:`RoundPlan` of any round as a pure function of (config, round)."""

    def __init__(self, cfg: RunConfig, client_sizes: torch.Tensor):
        self.cfg = cfg
        self.client_sizes = client_sizes.cpu().long()
        self.num_clients = int(client_sizes.numel())
        unseen = cfg.eval.unseen_clients
        #: the clients rounds sample from (None: all N); eval.unseen_clients holds the others out
        self.pool = torch.from_numpy(training_clients(unseen, self.num_clients, cfg.seed)) if unseen else None
        if self.pool is not None and cfg.clients_per_round > len(self.pool):
            raise ConfigError(f"clients_per_round: K={cfg.clients_per_round} is more than the {len(self.pool)} of "
                              f"N={self.num_clients} clients left to train once eval.unseen_clients holds "
                              f"{self.num_clients - len(self.pool)} out; allowed 1..{len(self.pool)}")
        self.speeds = self._speeds() if cfg.heterogeneity.kind == "profiles" else None

    def _speeds(self) -> torch.Tensor:
        h = self.cfg.heterogeneity
        if h.trace is not None:
            values = read_speed_trace(h.trace)
            reps = math.ceil(self.num_clients / len(values))
            return torch.tensor((values * reps)[: self.num_clients], dtype=torch.float64)
        rng = np_rng(self.cfg.seed, -1, "speeds")
        return torch.from_numpy(rng.lognormal(mean=0.0, sigma=h.speeds, size=self.num_clients))

    def plan(self, t: int) -> RoundPlan:
        cfg, h, E = self.cfg, self.cfg.heterogeneity, self.cfg.local.steps
        K = cfg.clients_per_round
        if self.pool is None:
            clients = sample_clients(self.num_clients, K, derive_seed(cfg.seed, t, "clients")).sort().values
        else:
            clients = self.pool[sample_clients(len(self.pool), K, derive_seed(cfg.seed, t, "clients"))].sort().values
        work = torch.full((K,), E, dtype=torch.long)
        dropped = torch.zeros(K, dtype=torch.bool)
        g = generator(cfg.seed, t, "heterogeneity")
        if h.kind == "stragglers":
            n_slow = int(round(h.rho * K))
            tau_max = h.tau_max if h.tau_max is not None else E - 1
            slow = torch.randperm(K, generator=g)[:n_slow]
            lo = max(E - tau_max, 1)
            work[slow] = torch.randint(lo, E, (n_slow,), generator=g)
        elif h.kind == "uniform":
            hi = h.max_steps if h.max_steps is not None else E
            work = torch.randint(h.min_steps, hi + 1, (K,), generator=g)
        elif h.kind == "profiles":
            deadline = h.deadline if h.deadline is not None else float(E)
            work = (self.speeds[clients] * deadline).floor().long().clamp(1, E)
            dropped = torch.rand(K, generator=g, dtype=torch.float64) < h.dropout
        work = torch.where(dropped, torch.zeros_like(work), work)
        sizes = self.client_sizes[clients]
        if cfg.local.unit == "epochs":
            steps = work * ((sizes + cfg.local.batch_size - 1) // cfg.local.batch_size)
        else:
            steps = work.clone()
        return RoundPlan(t, clients, work, steps, sizes, dropped, E, local_lr(cfg, t))


def unseen_clients(share: float, num_clients: int, seed: int) -> np.ndarray:
    """The clients ``eval.unseen_clients`` holds out of training (pFL-Bench's unseen clients), sorted:
    round(share·N) of them (at least one for a share > 0) drawn without replacement once for the run
    from ``(seed, -1, "unseen clients")``; none for share 0."""
    if not share:
        return np.zeros(0, np.int64)
    count = unseen_count(share, num_clients)
    return np.sort(np_rng(seed, -1, "unseen clients").choice(num_clients, size=count, replace=False)).astype(np.int64)


def training_clients(share: float, num_clients: int, seed: int) -> np.ndarray:
    """The clients rounds sample from: all but :func:`unseen_clients`, sorted."""
    return np.setdiff1d(np.arange(num_clients, dtype=np.int64), unseen_clients(share, num_clients, seed))


def sample_clients(n: int, k: int, seed: int) -> torch.Tensor:
    """k of n clients without replacement, in O(k): ``torch.randperm(n, generator=g)[:k]`` exactly, for
    ``g = torch.Generator().manual_seed(seed)``, without drawing the other n − k positions.

    torch's CPU ``randperm`` is a forward Fisher–Yates shuffle: step i swaps position i with
    i + (r_i mod (n − i)), r_i the generator's i-th 32-bit MT19937 output, so its first k entries are
    final after k steps. The same steps on a sparse array (the positions touched so far) and the same
    MT19937 stream (numpy's, seeded as torch seeds it: the seed's low 32 bits) give those k entries
    in under 0.1 ms for k ≤ 100 at any n (most of it seeding the generator), where ``randperm`` itself
    costs 4.4 ms at n = 10^6 (2 CPU cores, 2026-11-26), more than a K = 10 round of the MLP
    (tests/test_scale.py checks the identity).
    """
    if not 0 <= k <= n < 2**32:
        raise ValueError(f"sample_clients: k={k} of n={n}; need 0 <= k <= n < 2^32")
    bits = np.random.MT19937(0)
    bits._legacy_seeding(seed & 0xFFFFFFFF)
    draws = bits.random_raw(k).tolist()
    moved: dict[int, int] = {}   # position -> the client now there, for the positions swapped so far
    out = []
    for i, r in enumerate(draws):
        j = i + r % (n - i)
        here, there = moved.get(i, i), moved.get(j, j)
        moved[i], moved[j] = there, here
        out.append(there)
    return torch.tensor(out, dtype=torch.long)


def read_speed_trace(path: str | Path) -> list[float]:
    """Speeds from a CSV: a column named ``speed``, or the first number on each line."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r and r[0].strip() and not r[0].startswith("#")]
    if not rows:
        raise ConfigError(f"heterogeneity.trace: {path} holds no speeds")
    col = 0
    if "speed" in [c.strip().lower() for c in rows[0]]:
        col = [c.strip().lower() for c in rows[0]].index("speed")
        rows = rows[1:]
    elif not _is_number(rows[0][0]):
        rows = rows[1:]
    try:
        values = [float(r[col]) for r in rows]
    except (ValueError, IndexError):
        raise ConfigError(f"heterogeneity.trace: {path}: every row needs a number in column {col + 1}") from None
    if not values or min(values) <= 0:
        raise ConfigError(f"heterogeneity.trace: {path}: speeds must be positive numbers")
    return values


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------------------------------------
# Batch schedule: which training samples each sampled client uses at each of its steps
# ---------------------------------------------------------------------------------------------

@dataclass
class Batches:
    """Indices into the training tensors for every (client, step, slot); ``mask`` marks real samples.

    A client walks through fresh random permutations of its own data, like a shuffling DataLoader:
    with ``unit=steps`` every step takes min(B, n_i) samples (wrapping into the next permutation);
    with ``unit=epochs`` each pass is cut into ceil(n_i/B) batches, the last one partial.
    """
    index: torch.Tensor  # int64 (K, S, B), S = max steps this round
    mask: torch.Tensor   # bool  (K, S, B)
    keys: torch.Tensor   # int64 (K, S): each batch's dropout key (rng.batch_keys)

    def to(self, device) -> "Batches":
        return Batches(*(t.to(device, non_blocking=True) for t in (self.index, self.mask, self.keys)))

    def rows(self, order: torch.Tensor) -> "Batches":
        """The clients' rows in ``order``."""
        return Batches(self.index[order], self.mask[order], self.keys[order])


def schedule_batches(plan: RoundPlan, clients: ClientIndex, batch_size: int, unit: str, seed: int,
                     steps: int | None = None, purpose: str = "batches") -> Batches:
    """Vectorized batch schedule for round ``plan.round`` (no per-client Python loop), into the
    training samples that ``clients`` (on the CPU) lists for each client.

    Its size is that of the K sampled clients: (K, passes, n_max) sort keys with n_max the largest of
    their sizes, whatever N is. ``steps`` overrides the per-client step counts (e.g. one probe batch each); ``purpose`` keeps the
    draws of different uses apart.
    """
    K, B = plan.num_sampled, batch_size
    n = plan.sizes.clamp(min=1)                                   # (K,)
    n_steps = plan.steps if steps is None else torch.full((K,), steps, dtype=torch.long)
    S = max(int(n_steps.max()), 1)
    s = torch.arange(S).view(1, S, 1)
    b = torch.arange(B).view(1, 1, B)
    nk = n.view(K, 1, 1)
    if unit == "epochs":
        per_pass = (nk + B - 1) // B
        epoch, pos = s // per_pass, (s % per_pass) * B + b
        valid = pos < nk
    else:
        width = nk.clamp(max=B)                                  # min(B, n_i) samples a step
        p = s * width + b
        epoch, pos = p // nk, p % nk
        valid = b < width
    valid = valid & (s < n_steps.view(K, 1, 1))
    epoch = torch.where(valid, epoch, torch.zeros_like(epoch))
    pos = torch.where(valid, pos, torch.zeros_like(pos))
    passes = int(epoch.max()) + 1
    n_max = int(n.max())
    g = generator(seed, plan.round, purpose)
    keys = torch.rand(K, passes, n_max, generator=g)
    keys = keys.masked_fill(torch.arange(n_max).view(1, 1, n_max) >= nk, 2.0)  # padding sorts last
    perm = keys.argsort(dim=-1)                                  # (K, passes, n_max) local positions
    local = perm[torch.arange(K).view(K, 1, 1), epoch, pos]      # (K, S, B)
    index = clients.gather(plan.clients.view(K, 1, 1), local)      # local < n_i: within each client
    return Batches(torch.where(valid, index, torch.zeros_like(index)), valid,
                   batch_keys(seed, plan.round, purpose, plan.clients, S))
