"""fedsweep's own models, registered as a plugin's are (``fedsweep.register_model``): factories called as
``f(input_shape, num_classes, **model.options)`` whose keyword parameters are the options.

The networks live in :mod:`fedsweep.sim.models`, imported inside each factory: registering them
imports no torch, so commands that train nothing (``fedsweep config``, a sweep's driver) never do.
"""
from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field

from fedsweep.config.registry import register_model
from fedsweep.util.errors import ConfigError

Groups = Annotated[int, Field(ge=1, description="GroupNorm groups (the gcd with a layer's channels where it does "
                                                 "not divide them; Hsieh et al. 2020 use 2).")]


def _image(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) == 1:
        raise ConfigError(f"model.name: {name!r} needs image inputs; the dataset gives flat vectors "
                          f"of size {input_shape[0]}; use model.name: mlp")
    if len(input_shape) != 3:
        raise ConfigError(f"model.name: {name!r} needs image inputs of shape (C, H, W), "
                          f"got {tuple(input_shape)}; use model.name: mlp")
    return tuple(input_shape)


BatchNormOption = Annotated[bool, Field(description=(
    "BatchNorm after each hidden layer (FedBN's models; its running statistics make the run use the loop "
    "engine, and FedBN keeps each client's)."))]


@register_model("mlp", input_shape=(1, 8, 8))
def mlp(input_shape, num_classes, hidden: Annotated[int, Field(ge=1, description=(
        "Hidden units (FedLGA: one hidden layer of 400)."))] = 400, batchnorm: BatchNormOption = False):
    """FedLGA's two-layer MLP: flatten, Linear(d, hidden), [BatchNorm1d,] ReLU, Linear(hidden, classes)."""
    from fedsweep.sim.models import MLP
    return MLP(math.prod(input_shape), hidden, num_classes, batchnorm)


@register_model("lenet5", input_shape=(1, 28, 28))
def lenet5(input_shape, num_classes):
    """LeNet-5 with ReLU and max pooling (conv 6@5x5, conv 16@5x5, FC 120, 84); small inputs padded."""
    from fedsweep.sim.models import LeNet5
    return LeNet5(_image("lenet5", input_shape), num_classes)


@register_model("cnn", input_shape=(1, 8, 8))
def cnn(input_shape, num_classes, batchnorm: BatchNormOption = False):
    """The FedSoftMax paper's CNN: two 3x3 convs (32, 64 channels) with 2x2 max pooling, FC 1600."""
    from fedsweep.sim.models import CNN
    return CNN(_image("cnn", input_shape), num_classes, batchnorm=batchnorm)


@register_model("resnet18", input_shape=(3, 32, 32))
def resnet18(input_shape, num_classes, groups: Groups = 2):
    """ResNet-18 for small images (CIFAR stem), GroupNorm instead of BatchNorm (FedLGA's CIFAR model)."""
    from fedsweep.sim.models import ResNet18
    return ResNet18(_image("resnet18", input_shape)[0], num_classes, groups)


@register_model("mobilenet_v2", input_shape=(3, 32, 32))
def mobilenet_v2(input_shape, num_classes, groups: Groups = 2):
    """MobileNetV2 with CIFAR strides and GroupNorm instead of BatchNorm."""
    from fedsweep.sim.models import MobileNetV2
    return MobileNetV2(_image("mobilenet_v2", input_shape)[0], num_classes, groups)
