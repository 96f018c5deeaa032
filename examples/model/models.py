"""Models of one's own as a fedsweep plugin: classes (or factories) called as
``f(input_shape, num_classes, **model.options)``, whose keyword parameters are their options.

Named in ``plugins: [models.py]``, ``model.name: resmlp`` takes ``model.options.width`` and
``model.options.depth``, checked before anything runs and swept like any key
(``grid: {model.options.width: [32, 128]}``); ``fedsweep models models.py`` lists them.
"""
from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field
from torch import nn

import fedsweep


@fedsweep.register_model("resmlp", input_shape=(1, 8, 8))
class ResMLP(nn.Module):
    """A residual MLP: flatten, Linear(d, width), then `depth` blocks x + Linear(ReLU(Linear(x))),
    then Linear(width, classes). A pure function of its parameters, so the vectorized engine trains
    every client at once."""

    def __init__(self, input_shape, num_classes,
                 width: Annotated[int, Field(ge=1, description="Units of every hidden layer.")] = 64,
                 depth: Annotated[int, Field(ge=0, le=8, description="Residual blocks.")] = 1):
        super().__init__()
        self.stem = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width))
        self.blocks = nn.ModuleList(nn.Sequential(nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
                                    for _ in range(depth))
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(width, num_classes))

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


@fedsweep.register_model("bn_cnn", input_shape=(1, 8, 8))
class BatchNormCNN(nn.Module):
    """A small CNN with BatchNorm: its running statistics change in every forward pass, which
    torch.func.vmap cannot do for K stacked clients, so `engine: auto` trains it on the loop engine
    and says why (`engine: vectorized` is refused in one line). The statistics are the model's
    buffers, kept in checkpoints with it, updated by every client's steps in turn (not averaged: they
    are not parameters); evaluation runs in eval mode, on them."""

    def __init__(self, input_shape, num_classes,
                 channels: Annotated[int, Field(ge=1, description="Channels of the convolution.")] = 16):
        super().__init__()
        c = input_shape[0]
        self.features = nn.Sequential(nn.Conv2d(c, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.head = nn.Linear(channels * 4, num_classes)

    def forward(self, x):
        return self.head(self.features(x))
