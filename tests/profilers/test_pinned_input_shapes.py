"""Input-shape messages on non-square inputs (profilers/input_shapes.py, profilers/chain.py, profilers/profile.py):
a per-sample shape given channels-last (H×W×C) is answered with the channels × height × width one — height before
width, which only a non-square image tells apart — for one, three and four channels; and the note on an ImageNet stem
names the input's and the first feature map's height × width in that order."""

from __future__ import annotations

import pytest
import torch

from profilers.chain import shape_failure
from profilers.input_shapes import channels_last_hint
from profilers.profile import stem_note


@pytest.mark.parametrize("given, fix", [((32, 64, 3), "3x32x64"), ((64, 32, 3), "3x64x32"), ((28, 40, 1), "1x28x40"),
                                        ((28, 28, 1), "1x28x28"), ((40, 24, 4), "4x40x24"), ((7, 5, 3), "3x7x5")])
def test_a_channels_last_shape_gets_the_channels_first_one_height_before_width(given, fix) -> None:
    hint = channels_last_hint(given)
    assert hint == (f"{'x'.join(map(str, given))} looks channels-last; the input is channels × height × width, "
                    f"e.g. {fix}")


@pytest.mark.parametrize("shape", [(3, 32, 64), (1, 28, 40), (4, 40, 24), (3, 32, 3), (1, 1, 1), (16, 8, 8),
                                   (32, 64), (3, 32, 64, 3)])
def test_a_channels_first_shape_or_another_rank_gets_no_hint(shape) -> None:
    assert channels_last_hint(shape) is None


def test_a_model_failing_on_a_non_square_channels_last_input_says_the_fix() -> None:
    message = shape_failure(torch.zeros(1, 32, 64, 3), RuntimeError("expected 3 channels"))
    assert message == ("the model cannot run on samples of shape 32x64x3 (the --input given, or the dataset's "
                       "samples): RuntimeError: expected 3 channels. Fix: 32x64x3 looks channels-last; the input is "
                       "channels × height × width, e.g. 3x32x64")


def test_the_stem_note_names_height_before_width_on_a_non_square_image() -> None:
    note = stem_note("resnet18", (3, 32, 48), [(64, 8, 12), (128, 4, 6), (512, 1, 2), (10,)])
    assert note is not None
    assert note.startswith("resnet18 shrinks the 32x48 input to 8x12 in its first block")
    assert "its last feature map is 1x2" in note and note.endswith("For 32x48 images use resnet18-cifar, its "
                                                                   "CIFAR-style variant (3x3 stride-1 stem)")
