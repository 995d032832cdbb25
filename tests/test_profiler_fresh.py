"""Profiler behaviour found untested by a fresh mutation sample (docs/mutation.md)."""

from __future__ import annotations

import torch

from profilers.chain import shape_failure


def test_a_shape_failure_names_the_per_sample_shape_and_the_channels_last_fix() -> None:
    batch = torch.zeros(2, 32, 32, 3)                       # two samples given as H×W×C
    message = shape_failure(batch, RuntimeError("expected 3 channels\nmore detail"))
    assert message == ("the model cannot run on samples of shape 32x32x3 (the --input given, or the dataset's "
                       "samples): RuntimeError: expected 3 channels. Fix: 32x32x3 looks channels-last; the input "
                       "is channels × height × width, e.g. 3x32x32")
    plain = shape_failure(torch.zeros(4, 3, 8, 8), ValueError(""))
    assert plain == ("the model cannot run on samples of shape 3x8x8 (the --input given, or the dataset's samples): "
                     "ValueError: . Fix: check the input shape (channels × height × width)")
