"""Properties of every partition scheme (fedsweep.data.partition)."""
import numpy as np
import pytest

from fedsweep.config.schema import ConfigError, PartitionConfig
from fedsweep.data import partition

# Unequal class sizes on purpose (3000 samples, 10 classes), drawn once from a fixed test generator.
_P = np.array([14, 12, 11, 10, 10, 10, 9, 9, 8, 7]) / 100
LABELS = np.random.default_rng(1234).choice(10, size=3000, p=_P)

KINDS = {
    "iid": {},
    "classes": {"classes_per_client": 2},
    "shards": {"shard_size": 25},
    "dirichlet": {"alpha": 0.1},
    "quantity": {"ratio": 3.0},
}


def cfg(kind, **kw):
    return PartitionConfig(kind=kind, **{**KINDS[kind], **kw})


def assert_valid(parts, n, n_clients):
    assert len(parts) == n_clients
    for p in parts:
        assert p.dtype == np.int64 and p.ndim == 1 and len(p) >= 1
    allidx = np.concatenate(parts)
    assert len(allidx) == n, "a sample is lost or duplicated"
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n))


def entropy(labels):
    p = np.bincount(labels, minlength=10) / len(labels)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


@pytest.mark.parametrize("n_clients", [1, 10, 50])
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_is_a_partition(kind, n_clients):
    c = cfg(kind, classes_per_client=10) if (kind, n_clients) == ("classes", 1) else cfg(kind)  # need N·P ≥ 10
    assert_valid(partition(LABELS, n_clients, c, seed=0), len(LABELS), n_clients)


@pytest.mark.parametrize("kind", list(KINDS))
def test_pure_function_of_seed(kind):
    a = partition(LABELS, 20, cfg(kind), seed=3)
    b = partition(LABELS, 20, cfg(kind), seed=3)
    c = partition(LABELS, 20, cfg(kind), seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("kind", list(KINDS))
def test_more_clients_than_samples_is_a_config_error(kind):
    with pytest.raises(ConfigError, match=r"^data\.num_clients: ") as e:
        partition(LABELS[:30], 31, cfg(kind), seed=0)
    assert "\n" not in str(e.value)


def test_iid_sizes_equal():
    sizes = [len(p) for p in partition(LABELS, 7, cfg("iid"), seed=0)]
    assert max(sizes) - min(sizes) <= 1


def test_classes_clean_case_fedlga():
    # N=50, P=2, 10 classes: every class cut into 10 shards, every client exactly 2 classes.
    parts = partition(LABELS, 50, cfg("classes"), seed=0)
    sets = [frozenset(np.unique(LABELS[p]).tolist()) for p in parts]
    assert all(len(s) == 2 for s in sets)
    clients_per_class = np.bincount([c for s in sets for c in s], minlength=10)
    np.testing.assert_array_equal(clients_per_class, 10)
    # each client holds ~1/10 of each of its two classes
    counts = np.bincount(LABELS, minlength=10)
    for p, s in zip(parts, sets):
        for c in s:
            assert abs((LABELS[p] == c).sum() - counts[c] / 10) <= 1
    # the class pairs are randomized, not the rigid round-robin pattern (which gives 5 pairs)
    assert len(set(sets)) > 10


@pytest.mark.parametrize("n_clients,p", [(7, 3), (13, 4), (5, 10), (10, 1)])
def test_classes_uneven_case_still_exactly_p(n_clients, p):
    parts = partition(LABELS, n_clients, cfg("classes", classes_per_client=p), seed=1)
    assert_valid(parts, len(LABELS), n_clients)
    assert all(len(np.unique(LABELS[q])) == p for q in parts)


def test_classes_errors():
    with pytest.raises(ConfigError, match=r"^data\.partition\.classes_per_client: P=11 .*allowed 1\.\.10"):
        partition(LABELS, 20, cfg("classes", classes_per_client=11), seed=0)
    with pytest.raises(ConfigError, match=r"^data\.partition\.classes_per_client: N·P"):
        partition(LABELS, 3, cfg("classes", classes_per_client=2), seed=0)  # 6 shards < 10 classes
    few = np.concatenate([np.zeros(100, int), np.ones(3, int)])  # class 1 has 3 samples, needs 5 shards
    with pytest.raises(ConfigError, match=r"^data\.num_clients: class 1 has 3"):
        partition(few, 5, cfg("classes", classes_per_client=2), seed=0)


def test_shards_mcmahan():
    n_clients, size = 50, 25  # 3000/25 = 120 shards: 2 each, 20 random clients get a 3rd
    parts = partition(LABELS, n_clients, cfg("shards", shard_size=size), seed=0)
    sizes = np.array([len(p) for p in parts])
    assert set(sizes.tolist()) == {50, 75} and (sizes == 75).sum() == 20
    # label-sorted shards: a client of k shards sees at most 2k classes (a shard may straddle two)
    for p in parts:
        assert len(np.unique(LABELS[p])) <= 2 * len(p) // size
    # size 26 leaves a short last shard (3000 = 115·26 + 10): it is dealt too, not dropped
    assert_valid(partition(LABELS, 50, cfg("shards", shard_size=26), seed=0), len(LABELS), 50)


def test_shards_too_few_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^data\.partition\.shard_size: 100 .*30 shards.*allowed 1\.\.60"):
        partition(LABELS, 50, cfg("shards", shard_size=100), seed=0)


def test_dirichlet_small_alpha_is_more_skewed():
    def mean_entropy(alpha):
        parts = partition(LABELS, 20, cfg("dirichlet", alpha=alpha), seed=0)
        return np.mean([entropy(LABELS[p]) for p in parts])

    low, high = mean_entropy(0.05), mean_entropy(100.0)
    assert low < 0.6 * high
    assert high > 0.95 * entropy(LABELS)  # large α is close to the global label mix


def test_dirichlet_tiny_alpha_many_clients_no_empty_client():
    labels = LABELS[:300]
    parts = partition(labels, 200, cfg("dirichlet", alpha=0.01), seed=0)
    assert_valid(parts, 300, 200)


@pytest.mark.parametrize("n_clients,ratio", [(10, 3.0), (7, 2.5), (50, 4.0), (10, 1.0)])
def test_quantity_two_sizes_with_ratio(n_clients, ratio):
    parts = partition(LABELS, n_clients, cfg("quantity", ratio=ratio), seed=0)
    sizes = np.sort([len(p) for p in parts])
    small, large = sizes[: n_clients - n_clients // 2], sizes[n_clients - n_clients // 2:]
    assert small.max() - small.min() <= 1 and large.max() - large.min() <= 1
    assert large.mean() / small.mean() == pytest.approx(ratio, rel=0.02)
    if (n_clients, ratio) == (10, 3.0):  # 3000 = 5·150 + 5·450 exactly
        np.testing.assert_array_equal(sizes, [150] * 5 + [450] * 5)


def test_quantity_large_clients_are_random():
    sizes = [np.array([len(p) for p in partition(LABELS, 10, cfg("quantity"), seed=s)]) for s in range(4)]
    assert len({tuple(np.argsort(s, kind="stable")[5:]) for s in sizes}) > 1


def test_quantity_impossible_ratio():
    with pytest.raises(ConfigError, match=r"^data\.partition\.ratio: "):
        partition(LABELS[:20], 20, cfg("quantity", ratio=4.0), seed=0)
