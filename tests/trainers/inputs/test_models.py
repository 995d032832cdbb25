"""The built-in model builders (trainers/inputs/models.py): parameter counts written out, the documented
sizes, and other names going to torchvision or refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from adaptplan.errors import InputError
from trainers.inputs.models import build_model, check_model

torch.set_num_threads(1)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_builtin_mlp_has_the_documented_shape() -> None:
    # Flatten → Linear(C·H·W, 4·width) → ReLU → Linear(4w, 4w) → ReLU → Linear(4w, M); 1×8×8 inputs, width 4:
    # 64·16 + 16 + 16·16 + 16 + 16·3 + 3 = 1,379 parameters
    model = build_model("mlp", (1, 8, 8), 3, width=4)
    assert n_params(model) == 64 * 16 + 16 + 16 * 16 + 16 + 16 * 3 + 3
    assert model(torch.zeros(5, 1, 8, 8)).shape == (5, 3)
    # 3×4×2 inputs: C·H·W = 24 input features
    assert n_params(build_model("mlp", (3, 4, 2), 2, width=1)) == 24 * 4 + 4 + 4 * 4 + 4 + 4 * 2 + 2


def test_builtin_cnn_has_the_documented_shape() -> None:
    # CIFAR (3×32×32), width 32: convs 3→32→64→64 (3×3), then 64·4·4 → 128 → 10: ≈ 0.12 M parameters
    model = build_model("cnn", (3, 32, 32), 10)
    expected = (3 * 9 * 32 + 32) + (32 * 9 * 64 + 64) + (64 * 9 * 64 + 64) + (64 * 16 * 128 + 128) + (128 * 10 + 10)
    assert n_params(model) == expected
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_other_model_names_go_to_torchvision_and_unknown_ones_are_input_errors() -> None:
    model = build_model("resnet18", (3, 32, 32), 7)
    assert model.fc.out_features == 7
    with pytest.raises(InputError, match="cnn") as info:
        check_model("no-such-model", field="--model")
    assert info.value.field == "--model"
    with pytest.raises(InputError, match="cnn, mlp, vgg16-cifar") as info:     # the built-ins are listed as valid
        build_model("no-such-model", (3, 32, 32), 10, field="model")
    assert info.value.field == "model"
    check_model("mlp")                                    # built-ins need no look-up


def test_model_builders_default_to_the_documented_sizes() -> None:
    from trainers.inputs.models import cnn, vgg16_cifar

    # cnn(): width 32 (32/64/64 channels, ≈ 0.12 M parameters on CIFAR-10)
    expected = (3 * 9 * 32 + 32) + (32 * 9 * 64 + 64) + (64 * 9 * 64 + 64) + (64 * 16 * 128 + 128) + (128 * 10 + 10)
    assert n_params(cnn(3, 32, 10)) == expected
    # vgg16_cifar(): 10 classes, 3 input channels: 15,245,130 parameters (docs/model.md §7.1)
    vgg = vgg16_cifar()
    assert n_params(vgg) == 15_245_130
    assert next(vgg.parameters()).shape[1] == 3


def test_the_builtin_cnn_takes_a_non_square_input() -> None:
    """3 × 24 × 40 images (a device-data folder's shape need not be square): fc1 takes 2w·⌊24/8⌋·⌊40/8⌋ = 2w·15
    inputs, and the model runs; a square 28 × 28 input keeps ⌊28/8⌋² = 9 positions, as before."""
    from trainers.inputs.models import build_model

    model = build_model("cnn", (3, 24, 40), 10, width=4)
    fc1 = model[9][1]
    assert fc1.in_features == 2 * 4 * 3 * 5
    assert model(torch.zeros(2, 3, 24, 40)).shape == (2, 10)
    assert build_model("cnn", (1, 28, 28), 10, width=4)[9][1].in_features == 2 * 4 * 9
    tall = build_model("cnn", (3, 40, 24), 10, width=4)
    assert tall(torch.zeros(1, 3, 40, 24)).shape == (1, 10)
