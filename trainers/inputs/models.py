"""Models for split training, and the ONE model resolver (:func:`build_model`).

Built-ins (:data:`trainers.config.train_config.MODELS`): ``cnn``, ``mlp``, ``vgg16-cifar``, written as
``nn.Sequential``, the CIFAR-style ResNets ``resnet18-cifar``, ``resnet34-cifar``,
``resnet50-cifar`` (torchvision's ResNet with a 3×3 stride-1 stem and no max-pool), and LEAF's Shakespeare model
``leaf-lstm`` (:func:`leaf_lstm`, for the ``shakespeare`` data set's 80-character windows); every other
name goes to :func:`profilers.models.resolve_model` (any torchvision
classification model name, or ``package.module:factory``). The engine does not use the children
of a Sequential as its blocks: the driver cuts every model with ``profilers.build_chain``
(traced; one block per parameterised layer, activations/pooling/flatten joining the layer
before them), so cut index ℓ = number of those blocks on the device (docs/model.md §1 ℓ_i).

``cnn`` and ``vgg16-cifar`` pool with :class:`trainers.inputs.pooling.MaxPool2d` (``nn.MaxPool2d`` bit for bit,
several times faster on a CPU).

No BatchNorm in ``cnn``, ``mlp`` and ``vgg16-cifar``: samples never interact inside a batch, so the
engine may concatenate the activations of devices that share server blocks without changing the
mathematics. The ResNets have BatchNorm, so the engine runs their devices one by one
(:func:`trainers.roles.core.has_batch_coupling`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch
from torch import nn

from trainers.config.train_config import MODELS, check_model  # noqa: F401  (check_model re-exported)
from trainers.inputs.pooling import MaxPool2d


def cnn(in_channels: int, image_size: int | tuple[int, int], num_classes: int, width: int = 32) -> nn.Sequential:
    """Three conv stages (conv 3×3 → ReLU → max-pool 2) and two linear layers: 5 cut points when
    traced (conv1, conv2, conv3 + flatten, fc1, fc2); 11 children when chunked by hand. ``image_size``: the
    input's side, or its (height, width) — the three pools leave ⌊H/8⌋ × ⌊W/8⌋ positions for fc1.

    For CIFAR-10 (3×32×32) with ``width`` = 32: 32/64/64 channels, ≈ 0.12 M parameters.
    """
    w = width
    height, across = (image_size, image_size) if isinstance(image_size, int) else image_size
    positions = (height // 8) * (across // 8)
    return nn.Sequential(
        nn.Conv2d(in_channels, w, 3, padding=1), nn.ReLU(), MaxPool2d(2),
        nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(), MaxPool2d(2),
        nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.ReLU(), MaxPool2d(2),
        nn.Sequential(nn.Flatten(), nn.Linear(2 * w * positions, 128), nn.ReLU()),
        nn.Linear(128, num_classes),
    )


def mlp(in_features: int, num_classes: int, hidden: int = 128) -> nn.Sequential:
    """Flatten → Linear → ReLU → Linear → ReLU → Linear: 3 cut points when traced."""
    return nn.Sequential(
        nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden)), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
    )


VGG16_CIFAR_CONFIG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def vgg16_cifar(num_classes: int = 10, in_channels: int = 3) -> nn.Sequential:
    """VGG-16 for 32×32 inputs as in the AdaptSFL experiments (docs/model.md §6.1, §7.1): 13 conv
    3×3 (+ReLU, max-pool after each stage) and 3 FC (512-512-``num_classes``), no BatchNorm, L = 16.

    With 10 classes: 15,245,130 parameters (δ_16 = 487.8 Mbit in fp32) and 313.7 M multiply-adds
    per sample (ρ_16 ≈ 0.6275 GFLOP at 2 FLOPs per multiply-add), the figures of docs/model.md §7.1.
    """
    layers: dict[str, nn.Module] = {}
    channels, stage, conv = in_channels, 1, 1
    for item in VGG16_CIFAR_CONFIG:
        if item == "M":
            layers[f"pool{stage}"] = MaxPool2d(2)
            stage, conv = stage + 1, 1
        else:
            layers[f"conv{stage}_{conv}"] = nn.Conv2d(channels, int(item), 3, padding=1)
            layers[f"relu{stage}_{conv}"] = nn.ReLU()
            channels, conv = int(item), conv + 1
    layers.update(flatten=nn.Flatten(), fc1=nn.Linear(512, 512), relu_fc1=nn.ReLU(), fc2=nn.Linear(512, 512),
                  relu_fc2=nn.ReLU(), fc3=nn.Linear(512, num_classes))
    return nn.Sequential(OrderedDict(layers))


def resnet_cifar(depth: int, num_classes: int = 10, in_channels: int = 3) -> nn.Module:
    """ResNet-``depth`` (18, 34 or 50) for 32×32 images, as CIFAR papers train it (He et al. 2016
    §4.2 keep the ImageNet stages but a CIFAR input cannot afford the ImageNet stem): torchvision's
    ``resnet{depth}`` with its 7×7 stride-2 stem convolution replaced by a 3×3 stride-1 one and its
    max-pool removed, so the four stages see 32, 16, 8 and 4 pixels a side instead of 8, 4, 2, 1.

    With 10 classes and 3×32×32 input, ResNet-18 has 11,173,962 parameters and 556.7 M
    multiply-adds per sample (1.11 GFLOP at 2 FLOPs per multiply-add), against 37.2 M (0.074 GFLOP)
    for torchvision's ImageNet ``resnet18`` at the same input.
    """
    import torchvision

    model = torchvision.models.get_model(f"resnet{depth}", weights=None, num_classes=num_classes)
    model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


class TokenEmbedding(nn.Module):
    """Character ids → vectors. Ids arrive as numbers of any dtype (the data sets hold them as floats, as every
    input; a profiler feeds random floats) and are taken as integers modulo the vocabulary, so that ids 0..V−1 pass
    unchanged and any probe input is a valid one."""

    def __init__(self, vocabulary: int, dim: int) -> None:
        super().__init__()
        self.vocabulary = vocabulary
        self.embed = nn.Embedding(vocabulary, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(torch.remainder(ids.long(), self.vocabulary))


class Recurrent(nn.Module):
    """One LSTM layer over (batch, time, features); ``last``: only the last step's output (the next-character
    head reads it). A layer is one block: the planner cuts between layers, never inside the recurrence."""

    def __init__(self, input_size: int, hidden: int, last: bool = False) -> None:
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden, batch_first=True)
        self.last = last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lstm(x)[0]
        return out[:, -1] if self.last else out


def leaf_lstm(vocabulary: int = 80, embedding: int = 8, hidden: int = 256) -> nn.Sequential:
    """LEAF's Shakespeare model (CycleSL's Table 12): a character embedding of 8, two LSTM layers of 256 and a dense
    output over the 80 characters, predicting the character after an 80-character window. LEAF's one two-layer
    ``nn.LSTM`` is written as two one-layer LSTMs (the same function without dropout between layers), so that the
    cut after the first layer exists; the embedding (no FLOPs) joins the first layer's block. CycleSL cuts after
    the recurrent layers (cut 2 of 3)."""
    return nn.Sequential(OrderedDict([
        ("embed", TokenEmbedding(vocabulary, embedding)),
        ("lstm1", Recurrent(embedding, hidden)),
        ("lstm2", Recurrent(hidden, hidden, last=True)),
        ("head", nn.Linear(hidden, vocabulary)),
    ]))


def _features(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


# name → builder(input_shape (C, H, W), num_classes, width)
BUILTINS: dict[str, Callable[[tuple[int, ...], int, int], nn.Module]] = {
    "cnn": lambda shape, classes, width: cnn(shape[0], (shape[-2], shape[-1]), classes, width),
    "mlp": lambda shape, classes, width: mlp(_features(shape), classes, 4 * width),
    "vgg16-cifar": lambda shape, classes, width: vgg16_cifar(classes, shape[0]),
    "resnet18-cifar": lambda shape, classes, width: resnet_cifar(18, classes, shape[0]),
    "resnet34-cifar": lambda shape, classes, width: resnet_cifar(34, classes, shape[0]),
    "resnet50-cifar": lambda shape, classes, width: resnet_cifar(50, classes, shape[0]),
    "leaf-lstm": lambda shape, classes, width: leaf_lstm(classes),
}
assert tuple(BUILTINS) == MODELS


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, width: int = 32,
                field: str = "model") -> nn.Module:
    """Build model ``name`` for per-sample inputs of shape (C, H, W) with ``num_classes`` outputs.

    ``width`` (channels of the first conv layer; the MLP's hidden size is 4·width) applies to the
    built-ins ``cnn`` and ``mlp`` only. Other names: :func:`profilers.models.resolve_model`
    (random weights). InputError naming ``field`` for an unknown name.

    Your own model, ``name = "package.module:factory"`` (docs/api.md "The model factory"): the factory is called
    as ``factory(num_classes=num_classes)`` when it declares ``num_classes``, else as ``factory()``
    (:data:`profilers.models.FACTORY_SIGNATURE`); it receives neither ``input_shape`` nor ``width``, so it builds
    a model for the data set's (C, H, W) itself, and every other parameter needs a default (else an InputError
    naming ``field`` when the configuration is checked).
    """
    if name in BUILTINS:
        return BUILTINS[name](tuple(input_shape), num_classes, width)
    check_model(name, field)
    from profilers.models import resolve_model

    return resolve_model(name, num_classes=num_classes, field=field, input_shape=tuple(input_shape))
