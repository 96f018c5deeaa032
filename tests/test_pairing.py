"""Comparisons between methods are paired by seed (docs/sweeps.md, "`fedsweep report`"): at a seed,
every method trains from the same initial model on the same partition with the same clients sampled
each round and the same stragglers, whatever its algorithm, learning rates or own parameters. A
pairing that broke would make every paired verdict a comparison of different draws."""
import pytest
import torch

from fedsweep.config.schema import build_config
from fedsweep.runs.module import FederatedModule
from conftest import tiny_raw

ARMS = [{"algorithm": {"name": "fedavg"}},
        {"algorithm": {"name": "fedprox", "mu": 0.1}, "local": {"steps": 4, "batch_size": 5, "lr": 0.05}},
        {"algorithm": {"name": "scaffold"}, "server": {"lr": 0.5}},
        {"algorithm": {"name": "fedlga"}},
        {"algorithm": {"name": "fedsoftmax", "temperature": 0.5}}]


def draws(over: dict, seed: int):
    m = FederatedModule(build_config({**tiny_raw(seed=seed), **over}))
    plans = [m.planner.plan(t) for t in range(6)]
    return {"partition": [ix.tolist() for ix in m.data.client_indices],
            "w0": m.w.detach().clone(),
            "clients": [p.clients.tolist() for p in plans],
            "work": [p.steps.tolist() for p in plans]}


@pytest.mark.parametrize("seed", [0, 7])
def test_a_seed_gives_every_method_the_same_partition_sampling_stragglers_and_initial_model(seed):
    first = draws(ARMS[0], seed)
    for arm in ARMS[1:]:
        other = draws(arm, seed)
        assert other["partition"] == first["partition"], arm
        assert torch.equal(other["w0"], first["w0"]), arm
        assert other["clients"] == first["clients"] and other["work"] == first["work"], arm
    assert draws(ARMS[0], seed + 1)["clients"] != first["clients"]   # and the seed matters
