"""Tiny quadratic federated problems on which one round can be computed by hand.

Client i holds points x_ij ∈ R^d; the "model" is w itself and the loss of a batch is
Σ_j weight_j · ½‖w − x_j‖². With ``batch_size ≥ n_i`` every step sees all of the client's points,
so its gradient is exactly w − c_i (c_i the client's mean) and local SGD is w ← w − η (w − c_i).
``one_round`` runs any registered algorithm through the real engines (loop and vectorized) on it.
"""
from __future__ import annotations

import torch

from fedsweep.algorithms import get_algorithm_class
from fedsweep.algorithms.base import SetupContext
from fedsweep.engine import ClientData, make_engine, probe_batches
from fedsweep.sim.client_index import ClientIndex
from fedsweep.sim.heterogeneity import RoundPlan, schedule_batches

DTYPE = torch.float64
ENGINES = ["loop", "vectorized"]

#: The three-client problem the algorithm tests compute by hand: client i's points, their means
#: C[i] (so a full-batch gradient at w is w − C[i]) and the client sizes.
POINTS = [torch.tensor([[1.0, 0.0], [3.0, 0.0]], dtype=DTYPE),                     # c_0 = (2, 0)
          torch.tensor([[0.0, 4.0]], dtype=DTYPE),                                  # c_1 = (0, 4)
          torch.tensor([[-1.0, -1.0], [-1.0, -3.0], [-4.0, 1.0]], dtype=DTYPE)]    # c_2 = (−2, −1)
C = torch.tensor([[2.0, 0.0], [0.0, 4.0], [-2.0, -1.0]], dtype=DTYPE)
SIZES = [2, 1, 3]


def t(*v):
    """A float64 vector."""
    return torch.tensor(v, dtype=DTYPE)


def close(a, b):
    """Equal up to float64 rounding of hand-computed values."""
    torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


class QuadraticModel:
    """Duck-types the FunctionalModel interface the engines use."""
    random = False   # no dropout: batches carry no key

    def __init__(self, dim: int):
        self.dim = dim

    def loss(self, w, batch):
        x, _, weight = batch
        return 0.5 * (weight * ((w - x) ** 2).sum(-1)).sum()

    loss_vmappable = loss


def make_algorithm(name: str, num_clients: int, dim: int, sizes, weighting: str = "uniform",
                   local_steps: int = 3, layout: tuple = (), batchnorm: tuple = (), **params):
    """``layout``: the parameters' (name, start, stop) in w, for algorithms that split the model;
    ``batchnorm``: which of their layers are BatchNorm layers (FedBN's)."""
    cls = get_algorithm_class(name)
    ctx = SetupContext(num_clients=num_clients, dim=dim, client_sizes=torch.as_tensor(sizes),
                       weighting=weighting, local_steps=local_steps, device=torch.device("cpu"), dtype=DTYPE,
                       layout=layout, batchnorm=batchnorm)
    return cls(cls.Params(**params), ctx)


def one_round(algo, points: list[torch.Tensor], w: torch.Tensor, steps: list[int], lr: float,
              engine: str = "loop", clients: list[int] | None = None, expected: int | None = None,
              round: int = 0, dropped: list[bool] | None = None, server=None):
    """Run the sampled ``clients`` (default: all) for ``steps`` full-batch steps; returns
    (update u from aggregate, uploads). The server step is the caller's: w⁺ = w + η_g u."""
    N = len(points)
    clients = list(range(N)) if clients is None else clients
    sizes_all = torch.tensor([p.shape[0] for p in points])
    offsets = torch.cumsum(torch.tensor([0, *sizes_all.tolist()]), 0)
    table = ClientIndex(offsets, torch.arange(int(offsets[-1])))
    K = len(clients)
    work = torch.tensor(steps)
    drop = torch.tensor(dropped if dropped is not None else [False] * K)
    plan = RoundPlan(round, torch.tensor(clients), work, work.clone(), sizes_all[clients], drop,
                     expected if expected is not None else max(steps), lr, server=server)
    B = int(sizes_all.max())
    batches = schedule_batches(plan, table, B, "steps", seed=0)
    probe = probe_batches(algo.probe, plan, table, B, seed=0)
    x = torch.cat(points).to(DTYPE)
    data = ClientData(x, torch.zeros(x.shape[0], dtype=torch.long))
    eng = make_engine(engine, QuadraticModel(w.numel()), algo, data)
    with torch.no_grad():
        shared = algo.broadcast(w, plan)
        own = algo.client_state(plan)
    uploads, _ = eng.run(w, plan, batches, probe, shared, own)
    with torch.no_grad():
        return algo.aggregate(w, uploads, plan), uploads


def server_round(points: torch.Tensor, steps: int, gamma: float):
    """A ServerRound over the server's points: every batch (and ζ_s) is all of them (full batch)."""
    from fedsweep.algorithms.base import ServerRound
    x = points.to(DTYPE)
    full = (x, torch.zeros(x.shape[0], dtype=torch.long), torch.full((x.shape[0],), 1.0 / x.shape[0], dtype=DTYPE))
    return ServerRound(full=full, minibatch=full, batches=[full] * steps, lr=gamma)


def hybrid_round(algo, points, w, steps, lr, server_points, server_steps, gamma, engine="loop"):
    """One hybrid round with η_g = 1: aggregate, w + u, then the algorithm's server training."""
    from fedsweep.engine.loop import autograd_ops
    algo.ctx.ops = autograd_ops(QuadraticModel(w.numel()))
    server = server_round(server_points, server_steps, gamma)
    u, uploads = one_round(algo, points, w, steps, lr, engine=engine, server=server)
    plan = type("Plan", (), {"server": server})()
    w1 = w + u
    trained = algo.server_train(w1, plan, algo.ctx.ops)
    return (w1 if trained is None else trained), uploads
