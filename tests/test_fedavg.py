"""FedAvg's round on a quadratic problem, by hand, in both engines."""
import pytest
import torch

from quadratic import DTYPE, POINTS, make_algorithm, one_round


@pytest.mark.parametrize("engine", ["loop", "vectorized"])
@pytest.mark.parametrize("weighting", ["uniform", "data"])
def test_fedavg_round_by_hand(engine, weighting):
    w = torch.tensor([0.0, 0.0], dtype=DTYPE)
    algo = make_algorithm("fedavg", 3, 2, [2, 1, 3], weighting=weighting)
    u, _ = one_round(algo, POINTS, w, steps=[2, 1, 2], lr=0.5, engine=engine)
    # w ← w − 0.5 (w − c): after k steps from 0, w = c (1 − 0.5^k)
    deltas = torch.stack([torch.tensor([2.0, 0.0]) * 0.75, torch.tensor([0.0, 4.0]) * 0.5,
                          torch.tensor([-2.0, -1.0]) * 0.75]).to(DTYPE)
    q = torch.tensor([1 / 3] * 3 if weighting == "uniform" else [2 / 6, 1 / 6, 3 / 6], dtype=DTYPE)
    torch.testing.assert_close(u, q @ deltas, rtol=0, atol=1e-12)
