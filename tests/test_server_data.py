"""Hybrid FL server data (fedsweep.data.server, load_federated(..., server=...))."""
import numpy as np
import pytest
import torch

from fedsweep.config.schema import ConfigError, DataConfig, PartitionConfig, ServerDataConfig
from fedsweep.data import load_federated
from fedsweep.data.server import cosine, pool_size, round_server_indices, server_size, split_pool

DIGITS = DataConfig(name="digits", num_clients=20)
SYNTH = DataConfig(name="synthetic", num_clients=15, options={"mean_samples": 40})


@pytest.fixture(scope="module")
def digits():
    return load_federated(DIGITS, seed=0)


def mix(labels, idx, c=10):
    return np.bincount(np.asarray(labels)[np.asarray(idx)], minlength=c)


def assert_split(d, m_s, pool):
    allidx = torch.cat([*d.client_indices, d.server_pool])
    assert torch.equal(allidx.sort().values, torch.arange(len(d.y_train)))  # disjoint, together all
    assert d.server_pool.dtype == torch.int64 and len(d.server_pool) == pool and d.server_size == m_s
    assert all(len(ix) >= 1 and ix.dtype == torch.int64 for ix in d.client_indices)


def test_sizes():
    assert server_size(ServerDataConfig(fraction=0.05), 1437) == 72
    assert server_size(ServerDataConfig(fraction=0.05, size=30), 1437) == 30
    assert server_size(ServerDataConfig(), 1437) == 0
    assert pool_size(ServerDataConfig(fraction=0.05), 1437) == 144
    assert pool_size(ServerDataConfig(fraction=0.05, pool_factor=1.5), 1437) == 108
    assert pool_size(ServerDataConfig(fraction=0.05, pool_factor=3, resample=False), 1437) == 72


@pytest.mark.parametrize("part", ["iid", "classes", "dirichlet"])
def test_digits_pool_disjoint_from_clients(part):
    pc = PartitionConfig(kind=part, classes_per_client=2, alpha=0.3)
    srv = ServerDataConfig(fraction=0.05)
    d = load_federated(DataConfig(name="digits", num_clients=20, partition=pc), 0, srv)
    assert_split(d, 72, 144)
    assert d.describe().endswith(", server pool 144 (m_s 72/round)")
    if part == "classes":
        assert all(len(d.y_train[ix].unique()) == 2 for ix in d.client_indices)
    d2 = load_federated(DataConfig(name="digits", num_clients=20, partition=pc), 0,
                        ServerDataConfig(size=40, resample=False))
    assert_split(d2, 40, 40)
    assert d2.describe().endswith(", server pool 40 (fixed)")
    assert d2.to("cpu").server_pool is not None


def test_synthetic_pool_from_natural_split():
    d = load_federated(SYNTH, 0, ServerDataConfig(fraction=0.1))
    plain = load_federated(SYNTH, 0)
    n = len(d.y_train)
    assert_split(d, round(0.1 * n), 2 * round(0.1 * n))
    for a, b in zip(d.client_indices, plain.client_indices):  # each client keeps its own other samples
        assert set(a.tolist()) <= set(b.tolist())
    assert torch.equal(d.x_train, plain.x_train)


def test_without_server_is_unchanged(digits):
    for srv in (None, ServerDataConfig(), ServerDataConfig(fraction=0.0, shift=0.9)):
        for cfg in (DIGITS, SYNTH):
            a, b = load_federated(cfg, 3), load_federated(cfg, 3, srv)
            assert b.server_pool is None and b.server_size == 0 and a.describe() == b.describe()
            assert all(torch.equal(x, y) for x, y in zip(a.client_indices, b.client_indices))
            assert len(a.client_indices) == len(b.client_indices)


def test_label_mix_mirrors_global_and_draws_keep_it(digits):
    y = digits.y_train.numpy()
    p = np.bincount(y, minlength=10)
    cfg = ServerDataConfig(fraction=0.05)
    allowed, pool = split_pool(y, cfg, 10, seed=0)
    assert len(pool) == 144 and len(np.intersect1d(allowed, pool)) == 0 and len(allowed) + 144 == len(y)
    assert cosine(mix(y, pool), p) >= 0.99
    for t in range(5):
        r = round_server_indices(pool, y, cfg, 10, t, seed=0)
        assert len(r) == 72 and np.isin(r, pool).all() and len(np.unique(r)) == 72
        assert cosine(mix(y, r), p) >= 0.99


@pytest.mark.parametrize("shift", [0.95, 0.8])
@pytest.mark.parametrize("frac", [0.01, 0.05])
def test_shift_reached_for_pool_and_round_draws(digits, shift, frac):
    y = digits.y_train.numpy()
    p = np.bincount(y, minlength=10)
    cfg = ServerDataConfig(fraction=frac, shift=shift)
    for seed in range(3):
        _, pool = split_pool(y, cfg, 10, seed)
        assert abs(cosine(mix(y, pool), p) - shift) <= 0.01
        for t in range(3):
            r = round_server_indices(pool, y, cfg, 10, t, seed)
            assert len(r) == server_size(cfg, len(y))
            assert abs(cosine(mix(y, r), p) - shift) <= 0.01


def test_determinism(digits):
    y = digits.y_train.numpy()
    cfg = ServerDataConfig(fraction=0.05, shift=0.95)
    a, pool = split_pool(y, cfg, 10, 7)
    b, pool2 = split_pool(y, cfg, 10, 7)
    assert np.array_equal(a, b) and np.array_equal(pool, pool2)
    assert not np.array_equal(pool, split_pool(y, cfg, 10, 8)[1])
    r1, r1b, r2 = (round_server_indices(pool, y, cfg, 10, t, 7) for t in (1, 1, 2))
    assert np.array_equal(r1, r1b) and not np.array_equal(r1, r2)
    fixed = ServerDataConfig(fraction=0.05, resample=False)
    _, fpool = split_pool(y, fixed, 10, 7)
    assert len(fpool) == 72
    assert all(np.array_equal(round_server_indices(fpool, y, fixed, 10, t, 7), fpool) for t in range(4))
    d1, d2 = load_federated(DIGITS, 5, cfg), load_federated(DIGITS, 5, cfg)
    assert torch.equal(d1.server_pool, d2.server_pool)


def test_errors(digits):
    y = digits.y_train.numpy()
    with pytest.raises(ConfigError, match=r"^server_data.fraction: .*more than half"):
        split_pool(y, ServerDataConfig(fraction=0.3), 10, 0)  # pool 2·0.3 = 60%
    with pytest.raises(ConfigError, match=r"^server_data.size: "):
        load_federated(DIGITS, 0, ServerDataConfig(size=400))
    with pytest.raises(ConfigError, match=r"^server_data.shift: "):
        split_pool(y, ServerDataConfig(fraction=0.05, shift=0.2), 10, 0)  # below min_k p_k/‖p‖ ≈ 0.31
    lopsided = np.r_[np.zeros(990, dtype=np.int64), np.ones(10, dtype=np.int64)]
    with pytest.raises(ConfigError, match=r"^server_data.shift: "):  # would need more of class 1 than exist
        split_pool(lopsided, ServerDataConfig(size=100, shift=0.5), 2, 0)
