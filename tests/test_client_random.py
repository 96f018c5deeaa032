"""Random numbers in client hooks (fedsweep.client_normal / client_uniform, Algorithm.random): drawn
from each batch's key, so the same seed gives the same numbers on the loop engine, under vmap and
row-wise, a resumed run continues them, and `fedsweep check` passes such an algorithm; torch's own
generator in a client hook is one failed check naming the fix."""
import math

import pytest
import torch
from torch.func import vmap

import fedsweep
from fedsweep.config.registry import ALGORITHMS
from fedsweep.sim.rng import batch_keys
from fedsweep.testing import check_algorithm


def _batch(key):
    return (torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64), torch.full((2,), 0.5), key)


def test_draws_are_standard_a_function_of_the_key_and_purpose_and_the_same_under_vmap_and_rowwise():
    keys = batch_keys(3, 7, "train", torch.arange(4), 1)[:, 0]
    like = torch.zeros(50_000)
    z = fedsweep.client_normal(_batch(keys[0]), like, "noise")
    assert abs(float(z.mean())) < 0.02 and abs(float(z.std()) - 1.0) < 0.02
    assert abs(float((z.abs() < 1.0).double().mean()) - math.erf(1 / math.sqrt(2))) < 0.01
    u = fedsweep.client_uniform(_batch(keys[0]), like, "noise")
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0 and abs(float(u.mean()) - 0.5) < 0.01
    assert torch.equal(z, fedsweep.client_normal(_batch(keys[0]), like, "noise"))          # the same key: the same
    assert not torch.equal(z, fedsweep.client_normal(_batch(keys[1]), like, "noise"))      # another client or step
    assert not torch.equal(z, fedsweep.client_normal(_batch(keys[0]), like, "other"))      # another purpose
    small = torch.zeros(4, 6)
    each = torch.stack([fedsweep.client_normal(_batch(k), small[0], "p") for k in keys])
    mapped = vmap(lambda k: fedsweep.client_normal(_batch(k), small[0], "p"))(keys)
    rows = fedsweep.client_normal(_batch(keys), small, "p")                                   # K stacked clients
    assert torch.equal(each, mapped) and torch.equal(each, rows)
    with pytest.raises(TypeError, match="declares `random = True`"):
        fedsweep.client_normal(_batch(keys[0])[:3], like)


class Noisy(fedsweep.Algorithm):
    """FedAvg with noise on each local step, drawn from the batch's key."""
    name = "test_seeded_noise"
    random = True

    def client_step(self, state, batch, ops, lr, shared):
        _, g = ops.grad(state["w"], batch)
        return {**state, "w": state["w"] - lr * (g + 0.05 * fedsweep.client_normal(batch, g, "step noise"))}


class NoisyRows(Noisy):
    """The same, declared row-wise: the vectorized engine calls it on all K clients at once."""
    name = "test_seeded_noise_rows"
    rowwise = True


@pytest.mark.parametrize("cls", [Noisy, NoisyRows])
def test_an_algorithm_drawing_from_its_batches_passes_every_check(cls):
    """Engines agree, the same seed gives the same numbers, a resumed run continues exactly."""
    checks = check_algorithm(cls)
    assert all(c.ok for c in checks) and len(checks) >= 12, [c.line() for c in checks]
    assert cls.name not in ALGORITHMS.names()


def test_torch_noise_in_a_client_hook_is_one_failed_check_naming_the_fix():
    class TorchNoise(fedsweep.Algorithm):
        name = "test_torch_noise"

        def client_step(self, state, batch, ops, lr, shared):
            _, g = ops.grad(state["w"], batch)
            return {**state, "w": state["w"] - lr * (g + 0.01 * torch.randn_like(g))}
    checks = check_algorithm(TorchNoise, raise_on_failure=False)
    failed = [c for c in checks if c.failed]
    assert len(failed) == 1 and failed[0].hook == "client_step", [c.line() for c in checks]
    assert "fedsweep.client_normal(batch, like, purpose)" in failed[0].message and "random = True" in failed[0].message
    skipped = [c.name for c in checks if c.skipped]
    assert "same seed, same numbers (each engine)" in skipped and "exact resume from a checkpoint" in skipped
    assert all(c.line().startswith("skipped ") for c in checks if c.skipped)
