"""Hybrid FL server data (FedCLG, docs/design.md §2.5, ``server_data.*``).

The server holds a small dataset D_s^t of m_s training samples in every round t, disjoint from every
client's data. It is drawn from a *pool* that is split off the training set before the clients are
formed:

* ``m_s`` = ``server_data.size``, else ``round(server_data.fraction · n_train)``; 0 = no server data.
* The pool holds ``P = round(pool_factor · m_s)`` samples when ``resample`` is on (each round draws m_s
  of them afresh), else exactly ``m_s`` (the same set every round).
* Label mix, ``shift`` unset: the pool is stratified, its class counts are the global shares
  ``p_c = n_c / n`` of P rounded by largest remainder (FedCLG: "data homogeneous with the overall
  dataset").
* Label mix, ``shift = s``: the pool's label distribution q has cos(q, p) = s ± 0.01 (FedCLG Fig. 7,
  s ≈ 0.95), see :func:`_shifted_counts`.
* Each round's draw (:func:`round_server_indices`) takes, per class, a fixed quota
  ``largest_remainder(pool_counts · m_s / P)`` from the pool's samples of that class, so every round
  keeps the pool's label mix; the shift construction checks that this quota also meets s ± 0.01.

Randomness: the pool draws from ``np_rng(seed, -1, "server_pool")`` (run level), round t's draw from
``np_rng(seed, t, "server_data")``; both are pure functions of their arguments.
"""
from __future__ import annotations

import numpy as np

from fedsweep.config.schema import ConfigError, ServerDataConfig
from fedsweep.sim.rng import np_rng

__all__ = ["server_size", "pool_size", "split_pool", "round_server_indices", "cosine"]

#: Allowed gap between the achieved and the requested cosine (``server_data.shift``).
SHIFT_TOL = 0.01


def server_size(cfg: ServerDataConfig, n_train: int) -> int:
    """m_s: ``cfg.size`` if set, else ``round(cfg.fraction · n_train)``; 0 means no server data."""
    if cfg.size is not None:
        return int(cfg.size)
    return int(round(cfg.fraction * n_train))


def pool_size(cfg: ServerDataConfig, n_train: int) -> int:
    """P: ``round(pool_factor · m_s)`` with ``resample``, else m_s (the fixed set is the pool)."""
    m_s = server_size(cfg, n_train)
    return max(m_s, int(round(cfg.pool_factor * m_s))) if cfg.resample else m_s


def cosine(p, q) -> float:
    """Cosine similarity of two (label-count or probability) vectors; 0 if either is zero."""
    p, q = np.asarray(p, dtype=np.float64).ravel(), np.asarray(q, dtype=np.float64).ravel()
    den = float(np.linalg.norm(p) * np.linalg.norm(q))
    return float(p @ q) / den if den > 0 else 0.0


def largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Integer counts summing to ``total``, proportional to ``weights``; remainders broken by
    size, then by the lower index (deterministic)."""
    w = np.asarray(weights, dtype=np.float64)
    want = w * total / w.sum()
    out = np.floor(want + 1e-9).astype(np.int64)
    rest = int(total - out.sum())
    if rest > 0:
        out[np.argsort(-(want - out), kind="stable")[:rest]] += 1
    return out


def _draw_quota(pool_counts: np.ndarray, m_s: int) -> np.ndarray:
    """Per-class counts of one round's draw: the pool's mix scaled to m_s (largest remainder)."""
    if pool_counts.sum() == m_s:
        return pool_counts.copy()
    return largest_remainder(pool_counts, m_s)


def _size_error(what: str, cfg: ServerDataConfig, m_s: int, n: int) -> ConfigError:
    key = "server_data.size" if cfg.size is not None else "server_data.fraction"
    return ConfigError(f"{key}: {what} (m_s={m_s}, pool {pool_size(cfg, n)} = "
                       f"{'pool_factor·m_s' if cfg.resample else 'm_s'}, {n} training samples); "
                       f"lower {key} or server_data.pool_factor")


def split_pool(labels: np.ndarray, cfg: ServerDataConfig, num_classes: int, seed: int,
               reserved: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Split ``range(len(labels))`` into ``(client_allowed, pool)``: sorted int64, disjoint, together all.

    The pool holds P samples (:func:`pool_size`) whose class counts mirror the global label
    distribution (stratified, largest remainder), or with ``cfg.shift = s`` are skewed to a cosine
    similarity s ± 0.01 with it (:func:`_shifted_counts`). ``reserved`` indices (e.g. one sample per
    client of a natural split) never go to the pool. m_s = 0 gives ``(all, empty)``.

    Raises ConfigError naming ``server_data.fraction``/``size`` when the pool would exceed half the
    training set or a class lacks the samples its share needs, and ``server_data.shift`` when the
    requested cosine cannot be reached.
    """
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    n = len(labels)
    m_s, size = server_size(cfg, n), pool_size(cfg, n)
    everything = np.arange(n, dtype=np.int64)
    if m_s == 0:
        return everything, np.empty(0, dtype=np.int64)
    if 2 * size > n:
        raise _size_error("the server pool would take more than half the training set", cfg, m_s, n)

    eligible = np.ones(n, dtype=bool)
    if reserved is not None and len(reserved):
        eligible[np.asarray(reserved, dtype=np.int64)] = False
    total = np.bincount(labels, minlength=num_classes).astype(np.float64)
    avail = np.bincount(labels[eligible], minlength=num_classes)
    p = total / total.sum()
    rng = np_rng(seed, -1, "server_pool")

    if cfg.shift is None or cfg.shift >= 1.0:
        counts = largest_remainder(p, size)
        short = np.flatnonzero(counts > avail)
        if len(short):
            c = int(short[0])
            raise _size_error(f"class {c} has {avail[c]} samples available for the pool but its share "
                              f"needs {counts[c]}", cfg, m_s, n)
    else:
        counts = _shifted_counts(p, avail, cfg.shift, size, m_s, rng)

    pool = np.concatenate([rng.choice(np.flatnonzero((labels == c) & eligible), size=int(k), replace=False)
                           for c, k in enumerate(counts) if k > 0])
    pool = np.sort(pool).astype(np.int64)
    in_pool = np.zeros(n, dtype=bool)
    in_pool[pool] = True
    return everything[~in_pool], pool


def _shifted_counts(p: np.ndarray, avail: np.ndarray, s: float, size: int, m_s: int,
                    rng: np.random.Generator) -> np.ndarray:
    """Pool class counts whose distribution q has cos(q, p) = s ± 0.01, as must its round quota.

    Construction: q(λ) = (1 − λ)·p + λ·e_k, mixing the global distribution p with the one-hot of a
    class k. Along this segment cos(q(λ), p) falls monotonically from 1 (λ = 0) to
    cos(e_k, p) = p_k / ‖p‖ (λ = 1), so s is reachable iff s ≥ p_k/‖p‖. Counts are
    ``largest_remainder(q(λ), P)`` (pool) and the round quota ``largest_remainder(pool · m_s / P)``;
    λ is found by bisection on the cosine of the *quota* (the coarser of the two, a step function of λ
    that is monotone up to rounding), and of the two λ bracketing s the one whose pool and quota are
    both closest to s is kept. If rounding leaves that outside s ± 0.01 (small pools), the integer counts
are polished by hill climbing on single-sample moves between classes (:func:`_polish`). The classes k
are tried in an order drawn from the seed (the first one
    that works is used): a k is skipped when s is below p_k/‖p‖, when the pool would need more
    samples of k than are available, or when rounding leaves the cosine outside s ± 0.01.
    """
    n_cls = len(p)
    floor = p / np.linalg.norm(p)  # cos(e_k, p) for each k
    reasons: list[str] = []
    for k in rng.permutation(n_cls):
        if p[k] <= 0 or s < floor[k] - 1e-12:
            continue

        def counts_at(lam: float) -> tuple[np.ndarray, np.ndarray]:
            q = (1.0 - lam) * p
            q[k] += lam
            c = largest_remainder(q, size)
            return c, _draw_quota(c, m_s)

        lo, hi = 0.0, 1.0  # cos(quota(lo)) >= s > cos(quota(hi)), up to rounding
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            if cosine(counts_at(mid)[1], p) >= s:
                lo = mid
            else:
                hi = mid
        best, best_err = None, np.inf
        for lam in (lo, hi):
            c, _ = counts_at(lam)
            err = _shift_error(c, p, s, m_s)
            if err < best_err:
                best, best_err = c, err
        if best_err > SHIFT_TOL:
            best, best_err = _polish(best, p, s, m_s, avail)
        if np.any(best > avail):
            reasons.append(f"class {k} needs {int(best[k])} of its {int(avail[k])} available samples")
            continue
        if best_err > SHIFT_TOL:
            reasons.append(f"class {k}: nearest cosine off by {best_err:.3f}")
            continue
        return best
    reachable = float(floor.min())
    why = "; ".join(reasons[:3]) if reasons else f"the lowest reachable cosine is {reachable:.3f}"
    raise ConfigError(f"server_data.shift: cosine {s:g} to the global label distribution cannot be reached "
                      f"within ±{SHIFT_TOL} by a pool of {size} (m_s={m_s}): {why}; allowed about "
                      f"{reachable:.2f}..1 given enough samples (raise server_data.fraction/size if "
                      f"rounding is the problem)")


def _shift_error(c: np.ndarray, p: np.ndarray, s: float, m_s: int) -> float:
    """How far the pool counts ``c`` and their round quota are from cosine s (the larger gap)."""
    return max(abs(cosine(c, p) - s), abs(cosine(_draw_quota(c, m_s), p) - s))


def _polish(c: np.ndarray, p: np.ndarray, s: float, m_s: int, avail: np.ndarray,
            max_moves: int = 50) -> tuple[np.ndarray, float]:
    """Hill climbing on integer counts: move one sample from class i to class j (keeping the total and
    ``c ≤ avail``) while that lowers :func:`_shift_error`; stops within tolerance or at a local optimum.
    Needed for small pools, where one-class mixing alone is too coarse after rounding."""
    c = c.copy()
    err = _shift_error(c, p, s, m_s)
    for _ in range(max_moves):
        if err <= SHIFT_TOL:
            break
        best = None
        for i in np.flatnonzero(c > 0):
            for j in np.flatnonzero((c < avail) & (p > 0)):
                if i == j:
                    continue
                c[i] -= 1
                c[j] += 1
                e = _shift_error(c, p, s, m_s)
                c[i] += 1
                c[j] -= 1
                if e < err - 1e-12:
                    best, err = (i, j), e
        if best is None:
            break
        c[best[0]] -= 1
        c[best[1]] += 1
    return c, err


def round_server_indices(pool: np.ndarray, labels: np.ndarray, cfg: ServerDataConfig, num_classes: int,
                         t: int, seed: int) -> np.ndarray:
    """The m_s indices (into the training set, sorted int64) of the server's data in round t.

    ``resample``: a stratified draw of m_s from the pool with per-class quota
    ``largest_remainder(pool_counts · m_s / P)`` (the same every round, so the pool's label mix is
    kept), the members drawn from ``np_rng(seed, t, "server_data")``. Otherwise the whole pool, every
    round. A pure function of its arguments. ``labels`` are the labels of the whole training set.
    """
    pool = np.asarray(pool, dtype=np.int64).reshape(-1)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    m_s = server_size(cfg, len(labels))
    if not cfg.resample or len(pool) <= m_s:
        return np.sort(pool)
    pool_labels = labels[pool]
    quota = _draw_quota(np.bincount(pool_labels, minlength=num_classes), m_s)
    rng = np_rng(seed, t, "server_data")
    out = np.concatenate([rng.choice(pool[pool_labels == c], size=int(k), replace=False)
                          for c, k in enumerate(quota) if k > 0])
    return np.sort(out).astype(np.int64)
