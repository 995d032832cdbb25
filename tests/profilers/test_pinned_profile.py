"""A profile's reported figures recomputed by hand (docs/formats.md "Model profile", "How the profiler counts"), on a
non-square input (2×6×10): the forward FLOPs of each cut (2 per multiply-add, fvcore counting a BatchNorm in eval mode
1 per value), the check counter's total (matrix products and convolutions only) and ``relative_difference`` =
(fp − check)/fp, and the bits crossing each cut."""

from __future__ import annotations

import warnings

from torch import nn

from profilers.profile import profile_model

C_IN, C_OUT, H, W, CLASSES, BITS = 2, 4, 6, 10, 5, 32
CONV = 2 * C_OUT * H * W * C_IN * 3 * 3          # 3×3 convolution, padding 1: every output value C_in·9 multiply-adds
NORM = 2 * C_OUT * H * W                          # BatchNorm (no affine) in eval: 1 per value, × 2
LINEAR = 2 * (C_OUT * H * W) * CLASSES


def profiled():
    model = nn.Sequential(nn.Conv2d(C_IN, C_OUT, 3, padding=1), nn.BatchNorm2d(C_OUT, affine=False), nn.ReLU(),
                          nn.Flatten(), nn.Linear(C_OUT * H * W, CLASSES))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return profile_model(model, (C_IN, H, W), bits_per_value=BITS, optimizer=None)


def test_the_check_and_its_relative_difference_are_recomputed_from_their_definitions() -> None:
    profile = profiled()
    fp = CONV + NORM + LINEAR                    # 8,640 + 480 + 2,400
    check = CONV + LINEAR                        # FlopCounterMode: convolutions and matrix products only
    assert list(profile.rho) == [CONV + NORM, fp]
    counting = profile.flop_counting["check"]
    assert counting["fp_flops"] == check
    assert counting["relative_difference"] == round((fp - check) / fp, 6) == 0.041667
    assert profile.to_json()["flop_counting"]["check"]["relative_difference"] == 0.041667


def test_the_bits_crossing_each_cut_are_its_values_times_the_bits_per_value() -> None:
    profile = profiled()
    assert tuple(profile.input_shape) == (C_IN, H, W)
    assert [c.activation_bits for c in profile.cut_points] == [C_OUT * H * W * BITS, CLASSES * BITS]
    assert [c.gradient_bits for c in profile.cut_points] == [C_OUT * H * W * BITS, CLASSES * BITS]
    params = [C_OUT * C_IN * 9 + C_OUT, C_OUT * C_IN * 9 + C_OUT + C_OUT * H * W * CLASSES + CLASSES]
    assert [c.client_param_bits for c in profile.cut_points] == [p * BITS for p in params]
