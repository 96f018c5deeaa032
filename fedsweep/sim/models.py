"""Model zoo: the networks of the three papers, written so that K copies train at once.

Every model here is a pure function of its parameters, so the engine can run
``torch.func.functional_call(model, params, (x,))`` under ``vmap`` over K stacked copies and under
``grad`` (docs/design.md §1.5). That rules out three things, none of which appears below:

- batch statistics (BatchNorm and its running buffers): the deep models use GroupNorm instead,
  as Hsieh et al., "The Non-IID Data Quagmire of Decentralized ML" (ICML 2020) recommend for FL
  (the MLP and the CNN take ``batchnorm=True`` for FedBN; those run on the loop engine);
- in-place ops on activations (every ReLU is ``inplace=False``);
- dropout (no model has any, so train and eval forward passes are the same function; a plugin's
  ``nn.Dropout`` layers are seeded by :mod:`fedsweep.engine.dropout` and vmap).

Models never draw from an RNG other than the global torch one (PyTorch's default layer inits):
the caller seeds initialization by wrapping :func:`build_model` in ``torch.random.fork_rng``.

They are registered, with their options, in :mod:`fedsweep.sim.zoo`, as a plugin's models are.

Inputs are float batches ``(B, *input_shape)`` with ``input_shape`` ``(C, H, W)`` or ``(d,)``;
outputs are logits ``(B, num_classes)`` (softmax lives in the cross-entropy loss).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from fedsweep.config.registry import MODELS
from fedsweep.config.schema import ConfigError, ModelConfig
from fedsweep.util.errors import raised

def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The registered model ``cfg.name`` (``fedsweep models``) for inputs of shape ``input_shape`` and
    ``num_classes`` classes, called as ``f(input_shape, num_classes, **cfg.options)``; one line naming
    ``model.name`` if it cannot be built, is not an ``nn.Module``, or does not map a batch of such inputs
    to ``num_classes`` logits (:func:`check_output`)."""
    entry = MODELS.get(cfg.name)
    input_shape = tuple(int(s) for s in input_shape)
    try:
        net = entry.obj(input_shape, num_classes, **cfg.options)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's code: one line, where it failed
        raise ConfigError(f"model.name: {cfg.name!r} could not be built for inputs {input_shape} and {num_classes} "
                          f"classes ({_error(e)})") from None
    if not isinstance(net, nn.Module):
        raise ConfigError(f"model.name: {cfg.name!r} gave a {type(net).__name__}, not a torch.nn.Module")
    if param_count(net) == 0:
        raise ConfigError(f"model.name: {cfg.name!r} has no parameters to train")
    check_output(net, cfg.name, input_shape, num_classes)
    return net


def check_output(net: nn.Module, name: str, input_shape: tuple[int, ...], num_classes: int) -> None:
    """A forward pass of two zero inputs, in eval mode and without gradients (no batch statistic is
    updated, no random number drawn), must give logits of shape (2, ``num_classes``)."""
    was_training = net.training
    dtype = next(net.parameters()).dtype
    try:
        net.eval()
        with torch.no_grad():
            out = net(torch.zeros(2, *input_shape, dtype=dtype))
    except Exception as e:  # noqa: BLE001 - one line, where it failed
        raise ConfigError(f"model.name: {name!r} cannot take this dataset's inputs: a batch of shape "
                          f"{(2, *input_shape)} failed in its forward pass ({_error(e)})") from None
    finally:
        net.train(was_training)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(f"model.name: {name!r} gives outputs of shape {got} for a batch of 2; it must give one "
                          f"logit per class, (2, {num_classes}) for this dataset's {num_classes} classes")


def _error(e: BaseException) -> str:
    return raised(e, skip=("/torch/",))


def param_count(model: nn.Module) -> int:
    """Number of scalar parameters n (the length of the flat vector w ∈ R^n the algorithms see)."""
    return sum(p.numel() for p in model.parameters())


def _flat_size(features: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Feature count after ``features`` by a dry run on zeros (draws no random numbers; in eval mode, so
    BatchNorm's running statistics stay as initialized)."""
    with torch.no_grad():
        features.eval()
        try:
            return features(torch.zeros(1, *input_shape)).numel()
        finally:
            features.train()


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    """GroupNorm with ``groups`` groups (``model.options.groups``, default 2 as in Hsieh et al. 2020); when
    ``groups`` does not divide ``channels`` it falls back to their gcd, the nearest count that does."""
    return nn.GroupNorm(math.gcd(groups, channels), channels)


# ---------------------------------------------------------------------------------------------
# Small models of the papers
# ---------------------------------------------------------------------------------------------

class MLP(nn.Module):
    """FedLGA (Sec. V-A): "a two-layer fully connect MLP network with 400 hidden nodes" for FMNIST:
    flatten -> Linear(d, hidden) -> ReLU -> Linear(hidden, classes); ``batchnorm``: a BatchNorm1d
    before the ReLU (FedBN's models)."""

    def __init__(self, in_features: int, hidden: int, num_classes: int, batchnorm: bool = False):
        super().__init__()
        norm = [nn.BatchNorm1d(hidden)] if batchnorm else []
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), *norm, nn.ReLU(),
                                 nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)

    def chain(self):
        """Leaves in execution order, so the engine can run this model without functional_call."""
        return [(f"net.{n}", m) for n, m in self.net.named_children()]


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al. 1998) with ReLU and max pooling: conv 6@5x5, pool, conv 16@5x5, pool,
    FC 120, FC 84, FC classes.

    The original takes 32x32 inputs and has 14x14 maps at the second conv. A conv whose input map is
    smaller than that gets "same" padding 2: MNIST 28x28 gives the usual 16@5x5 (padded conv1),
    CIFAR 32x32 the original 16@5x5, digits 8x8 gives 16@2x2."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int):
        super().__init__()
        c, h, w = input_shape
        s1 = min(h, w)
        s2 = (s1 if s1 < 32 else s1 - 4) // 2
        self.features = nn.Sequential(
            nn.Conv2d(c, 6, 5, padding=2 if s1 < 32 else 0), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5, padding=2 if s2 < 14 else 0), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten())
        self.classifier = nn.Sequential(
            nn.Linear(_flat_size(self.features, input_shape), 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))

    def chain(self):
        """Leaves in execution order, so the engine can run this model without functional_call."""
        return [(f"{part}.{n}", m) for part in ("features", "classifier")
                for n, m in getattr(self, part).named_children()]


class CNN(nn.Module):
    """The FedSoftMax paper's CNN (Sec. 3.1, "Model"): "two 3x3 convolution layers (the first with 32
    channels, the second with 64, each followed with 2x2 max pooling), a fully connected layer with
    1600 units and ReLu activation, and a final softmax output layer".

    The paper names no dropout, so there is none (which also keeps the forward pass deterministic for
    functional training). Convs are unpadded, so MNIST 28x28 flattens to 64·5·5 = 1600 features;
    inputs smaller than 16 pixels (digits 8x8, which unpadded would shrink to nothing) use "same"
    padding 1. The softmax is in the loss: the model returns logits. ``batchnorm``: a BatchNorm after
    each conv and the hidden FC layer, before its ReLU (FedBN's CNN, Li et al. ICLR 2021)."""

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int, fc: int = 1600, batchnorm: bool = False):
        super().__init__()
        c, h, w = input_shape
        pad = 1 if min(h, w) < 16 else 0

        def norm(kind, width):
            return [kind(width)] if batchnorm else []
        self.features = nn.Sequential(
            nn.Conv2d(c, 32, 3, padding=pad), *norm(nn.BatchNorm2d, 32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=pad), *norm(nn.BatchNorm2d, 64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten())
        self.classifier = nn.Sequential(
            nn.Linear(_flat_size(self.features, input_shape), fc), *norm(nn.BatchNorm1d, fc), nn.ReLU(),
            nn.Linear(fc, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))

    def chain(self):
        """Leaves in execution order, so the engine can run this model without functional_call."""
        return [(f"{part}.{n}", m) for part in ("features", "classifier")
                for n, m in getattr(self, part).named_children()]


# ---------------------------------------------------------------------------------------------
# ResNet-18 (FedLGA's CIFAR model) and MobileNetV2, with GroupNorm
# ---------------------------------------------------------------------------------------------

class BasicBlock(nn.Module):
    """ResNet basic block (He et al. 2016): two 3x3 convs, GroupNorm, identity or 1x1 shortcut."""

    def __init__(self, cin: int, cout: int, stride: int, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = _norm(cout, groups)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = _norm(cout, groups)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _norm(cout, groups))
        self.relu = nn.ReLU()

    def forward(self, x):
        out = self.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 (He et al. 2016) for small images, as FedLGA runs on CIFAR-10/100 following
    Hsieh et al. (2020), who replace BatchNorm by GroupNorm for non-IID FL.

    CIFAR-style stem: one 3x3 conv, stride 1, no max pool (32x32 -> 4x4 before pooling); stages of
    64/128/256/512 channels with strides 1/2/2/2; adaptive average pooling, so 28x28 and 8x8 inputs
    (and any channel count) work. GroupNorm uses ``groups`` groups (``model.options.groups``)."""

    def __init__(self, in_channels: int, num_classes: int, groups: int = 2):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False), _norm(64, groups), nn.ReLU())
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride, groups), BasicBlock(cout, cout, 1, groups)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        return self.fc(self.pool(self.layers(self.stem(x))))


class InvertedResidual(nn.Module):
    """MobileNetV2 block (Sandler et al. 2018): 1x1 expand, 3x3 depthwise, 1x1 linear projection;
    a residual connection when stride is 1 and the channel count is kept."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int, groups: int):
        super().__init__()
        mid = cin * expand
        layers = [] if expand == 1 else [nn.Conv2d(cin, mid, 1, bias=False), _norm(mid, groups), nn.ReLU6()]
        layers += [nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), _norm(mid, groups), nn.ReLU6(),
                   nn.Conv2d(mid, cout, 1, bias=False), _norm(cout, groups)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        out = self.block(x)
        return x + out if self.residual else out


class MobileNetV2(nn.Module):
    """MobileNetV2 (Sandler et al. 2018, Table 2) with GroupNorm instead of BatchNorm.

    CIFAR-style strides, as in common CIFAR ports: the stem conv has stride 1 and so does the
    first 24-channel stage (ImageNet: 2 and 2), so 32x32 inputs end at 4x4 rather than 1x1; adaptive
    average pooling makes 28x28 and 8x8 inputs work too. GroupNorm uses ``groups`` groups."""

    # (expansion t, output channels c, repeats n, first stride s); Table 2 with CIFAR strides
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2),
                (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, in_channels: int, num_classes: int, groups: int = 2):
        super().__init__()
        layers, cin = [nn.Conv2d(in_channels, 32, 3, 1, 1, bias=False), _norm(32, groups), nn.ReLU6()], 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t, groups))
                cin = c
        layers += [nn.Conv2d(cin, 1280, 1, bias=False), _norm(1280, groups), nn.ReLU6(),
                   nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))
