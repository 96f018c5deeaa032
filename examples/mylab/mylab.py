"""A lab's own algorithm, model and dataset in one file, for fedsweep to sweep against its baselines.

Name this file in a run config's or sweep file's ``plugins:`` (a path relative to that file) and use
the names it registers like fedsweep's own: ``algorithm.name: fedexp``, ``model.name: two_layer``
(``model.options.width``), ``data.name: breast_cancer``.
"""
from __future__ import annotations

from typing import Annotated

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

import fedsweep


@fedsweep.register_algorithm
class FedExP(fedsweep.Algorithm):
    """FedExP (Jhunjhunwala, Wang and Joshi, "FedExP: Speeding Up Federated Averaging via Extrapolation",
    ICLR 2023, arXiv:2301.09604): FedAvg whose server step is extrapolated each round by how much the
    clients' updates agree.

    Eq. (8) of the paper, with q_i the aggregation weights of the clients that returned and
    Δ_i = w_i − w^t: η_g^t = max(1, Σ q_i ‖Δ_i‖² / (2 (‖Σ q_i Δ_i‖² + ε))), and u = η_g^t Σ q_i Δ_i (the
    server then steps w ← w + server.lr · u; server.lr = 1 is the paper's). The clients run FedAvg's
    local SGD unchanged, so the client code is FedAvg's (row-wise). Choices: ε is the paper's (the
    authors' code adds M·ε, M the clients a round, and decays ε by 0.998² a round); the paper's
    evaluation of the average of the last two iterates is not made (fedsweep evaluates w^t)."""
    name = "fedexp"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        epsilon: float = Field(1e-3, gt=0, description="ε, which keeps η_g finite when the updates cancel "
                                                      "(the paper: 1e-3 on CIFAR, 0.1 on EMNIST).")

    def aggregate(self, w, uploads, plan):
        q = self.weights(plan)                               # (K,), 0 for a client that dropped out
        delta = uploads["delta"]                             # (K, n)
        mean = q @ delta
        spread = q @ (delta * delta).sum(dim=1)              # Σ q_i ‖Δ_i‖²
        self.eta = torch.clamp(spread / (2 * (mean @ mean + self.params.epsilon)), min=1.0)
        return self.eta * mean

    def round_metrics(self, plan):
        return {"fedexp/eta_g": float(self.eta)}


@fedsweep.register_model("two_layer", input_shape=(30,))
class TwoLayer(nn.Module):
    """A two-layer MLP of `width` hidden units (any input shape, flattened)."""

    def __init__(self, input_shape, num_classes,
                 width: Annotated[int, Field(ge=1, description="Hidden units.")] = 32):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), width), nn.ReLU(),
                                 nn.Linear(width, num_classes))

    def forward(self, x):
        return self.net(x)


@fedsweep.register_dataset("breast_cancer")
def breast_cancer(seed: int, test_fraction: float = 0.25,
                  standardize: Annotated[bool, Field(description="Scale each feature to mean 0, std 1 "
                                                                   "(on the training split's statistics).")] = True):
    """scikit-learn's Wisconsin breast cancer data: 569 tumours, 30 features, 2 classes; offline."""
    from sklearn.datasets import load_breast_cancer
    x, y = load_breast_cancer(return_X_y=True)
    test = np.random.default_rng(seed).permutation(len(y))[: int(round(test_fraction * len(y)))]
    train = np.setdiff1d(np.arange(len(y)), test)
    x_train, x_test = x[train], x[test]
    if standardize:
        mean, std = x_train.mean(0), x_train.std(0) + 1e-8
        x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    return fedsweep.Source(x_train.astype(np.float32), y[train], x_test.astype(np.float32), y[test], num_classes=2)
