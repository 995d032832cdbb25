"""Small models for split training, written as flat ``nn.Sequential`` chains (each child is one
block of the chain, so cut index ℓ = number of blocks on the device; spec §1 ℓ_i).

No BatchNorm: samples never interact inside a batch, so the engine may concatenate the
activations of devices that share server blocks without changing the mathematics.
"""

from __future__ import annotations

from torch import nn

from trainers.config import MODELS, check_choice


def cnn(in_channels: int, image_size: int, num_classes: int, width: int = 32) -> nn.Sequential:
    """Three conv blocks (conv 3×3 → ReLU → max-pool 2) and two linear layers; 11 blocks.

    For CIFAR-10 (3×32×32): 32/64/64 channels, ≈ 0.12 M parameters.
    """
    w = width
    side = image_size // 8
    return nn.Sequential(
        nn.Conv2d(in_channels, w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Sequential(nn.Flatten(), nn.Linear(2 * w * side * side, 128), nn.ReLU()),
        nn.Linear(128, num_classes),
    )


def mlp(in_features: int, num_classes: int, hidden: int = 128) -> nn.Sequential:
    """Flatten → Linear → ReLU → Linear → ReLU → Linear (5 blocks)."""
    return nn.Sequential(
        nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden)), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
    )


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, width: int = 32) -> nn.Sequential:
    """Build model ``name`` (one of :data:`trainers.config.MODELS`) for inputs of shape (C, H, W)."""
    check_choice(name, MODELS, "model")
    if name == "cnn":
        return cnn(input_shape[0], input_shape[-1], num_classes, width)
    features = 1
    for s in input_shape:
        features *= s
    return mlp(features, num_classes, 4 * width)
