"""A lab's own algorithm, model and dataset in one file, for fedsweep to sweep against its baselines.

Name this file in a run config's or sweep file's ``plugins:`` (a path relative to that file) and use
what it registers by name, like fedsweep's own: ``algorithm.name: fedavg_decay``
(``algorithm.decay``), ``model.name: two_layer`` (``model.options.width``), ``data.name: wine``.
"""
from __future__ import annotations

import math
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

import fedsweep


@fedsweep.register_algorithm
class FedAvgDecay(fedsweep.Algorithm):
    """FedAvg whose server step shrinks every round: u_t = max(γ^t, u_min) Σ q_i Δ_i (round t from 0), so
    the server learning rate η_g decays from server.lr to server.lr · u_min, as client learning rates
    often do. The clients run FedAvg's local SGD; only ``aggregate`` differs."""
    name = "fedavg_decay"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        decay: float = Field(0.95, gt=0, le=1, description="γ, the server step's factor per round.")
        floor: float = Field(0.1, gt=0, le=1, description="u_min, the smallest factor the step decays to.")

    def aggregate(self, w, uploads, plan):
        scale = max(self.params.decay ** plan.round, self.params.floor)
        return scale * (self.weights(plan) @ uploads["delta"])


@fedsweep.register_model("two_layer", input_shape=(13,))
class TwoLayer(nn.Module):
    """A two-layer MLP of `width` hidden units (any input shape, flattened)."""

    def __init__(self, input_shape, num_classes,
                 width: Annotated[int, Field(ge=1, description="Hidden units.")] = 32):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.ReLU(),
                                 nn.Linear(width, num_classes))

    def forward(self, x):
        return self.net(x)


@fedsweep.register_dataset("wine")
def wine(seed: int, test_fraction: float,
         standardize: Annotated[bool, Field(description="Scale each feature to mean 0, std 1 (the training "
                                                          "rows' statistics).")] = True):
    """scikit-learn's wine data from arrays: 178 wines, 13 features, 3 cultivars; offline."""
    from sklearn.datasets import load_wine
    x, y = load_wine(return_X_y=True)
    perm = np.random.default_rng(seed).permutation(len(y))
    n_test = max(1, int(round(test_fraction * len(y))))
    test, train = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    x_train, x_test = x[train], x[test]
    if standardize:
        mean, std = x_train.mean(0), x_train.std(0) + 1e-8
        x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    return fedsweep.Source(x_train.astype(np.float32), y[train], x_test.astype(np.float32), y[test], num_classes=3)
