"""Each evaluated client's own held-out data, for per-client evaluation (``eval.clients``).

FL papers that evaluate per client score each client on data of its own distribution (LEAF's per-user
test splits; FedRep, Ditto and pFL-Bench's test data "following the client's label distribution").
fedsweep gives every evaluated client i:

* ``natural`` (``eval.client_test``): its own test samples, where the dataset has them (LEAF's users,
  ``synthetic``'s clients, a dataset's ``client_test_indices``); a client without any is not scored.
* ``matched``: ``eval.client_test_size`` samples drawn without replacement from the test split, the
  class counts its training labels' shares rounded by largest remainder (each class at most what the
  split holds), from ``(seed, -1, "client test/i")``: client i's set does not depend on which other
  clients are evaluated. Clients' sets may overlap (they are drawn from one pool), as users' data
  of one distribution would.

Validation twins, so that selection never reads test: a federated validation split is each client's
own already; a central one is drawn from ``matched``, from ``(seed, -1, "client validation/i")``.

Unseen clients (``eval.unseen_clients``, pFL-Bench's): a share of the clients held out of training
entirely, drawn once for the run; rounds sample the others only, and per-client evaluation scores the
held-out ones apart (``unseen/*``): how the model generalizes to clients it never trained on.
Numpy only: indices, no samples.
"""
from __future__ import annotations

import numpy as np

from fedsweep.data.server import largest_remainder
from fedsweep.sim.rng import np_rng


def matched_sets(client_labels: list[np.ndarray], clients: list[int], pool_labels: np.ndarray, size: int,
                 num_classes: int, seed: int, purpose: str = "client test") -> list[np.ndarray]:
    """For each client (its id in ``clients``, its training labels in ``client_labels``), sorted int64
    indices into ``pool_labels``: ``size`` of them with the client's label mix (module docstring)."""
    by_class = [np.flatnonzero(pool_labels == c) for c in range(num_classes)]
    out = []
    for i, labels in zip(clients, client_labels):
        counts = largest_remainder(np.bincount(labels, minlength=num_classes), size)
        rng = np_rng(seed, -1, f"{purpose}/{i}")
        taken = [rng.choice(by_class[c], size=min(int(k), len(by_class[c])), replace=False)
                 for c, k in enumerate(counts) if k > 0]
        out.append(np.sort(np.concatenate(taken)).astype(np.int64) if taken else np.zeros(0, np.int64))
    return out


def evaluated_clients(wanted: int | str | None, pool: np.ndarray, seed: int,
                      purpose: str = "eval clients") -> np.ndarray | None:
    """The clients of ``pool`` (sorted ids) that ``eval.clients`` names, sorted: all, or ``wanted`` drawn
    without replacement once for the run from ``(seed, -1, purpose)``; None when off."""
    if wanted is None:
        return None
    if wanted == "all" or wanted >= len(pool):
        return np.asarray(pool, dtype=np.int64)
    picked = np_rng(seed, -1, purpose).choice(len(pool), size=int(wanted), replace=False)
    return np.sort(np.asarray(pool, dtype=np.int64)[picked])
