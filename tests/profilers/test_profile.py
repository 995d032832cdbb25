"""Per-cut profiles (profilers.profile_model) and the `adaptplan profile` CLI."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from adaptplan.cli import main
from adaptplan.errors import InputError
from adaptplan.model_profile import ModelProfile
from profilers import profile_model

BITS = 32


def small_net(num_classes: int = 10) -> nn.Module:
    """Two conv layers and a linear head on 3x16x16 (factory for the CLI test)."""
    return TwoConv(num_classes)


class TwoConv(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)           # → 8x16x16
        self.conv2 = nn.Conv2d(8, 4, 3, stride=2, padding=1)  # → 4x8x8
        self.fc = nn.Linear(4 * 8 * 8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc(torch.flatten(x, 1))


@pytest.fixture(scope="module")
def vgg16() -> ModelProfile:
    return profile_model("vgg16", (3, 32, 32))


@pytest.fixture(scope="module")
def resnet18() -> ModelProfile:
    return profile_model("resnet18", (3, 32, 32))


def test_hand_computed_flops_of_a_two_conv_net() -> None:
    profile = profile_model(TwoConv(), (3, 16, 16), model_name="twoconv")
    mac1 = (16 * 16 * 8) * (3 * 3 * 3)   # output positions x kernel volume
    mac2 = (8 * 8 * 4) * (8 * 3 * 3)
    mac3 = 256 * 10
    assert profile.names == ["conv1", "conv2", "fc"]
    assert list(profile.rho) == [2 * mac1, 2 * (mac1 + mac2), 2 * (mac1 + mac2 + mac3)]
    # backward: weight gradient only for block 1 (device side), weight + input gradient after it
    assert list(profile.varpi) == [2 * mac1, 2 * mac1 + 4 * mac2, 2 * mac1 + 4 * mac2 + 4 * mac3]
    assert list(profile.server_bp) == [4 * mac2 + 4 * mac3, 4 * mac3, 0.0]
    assert list(profile.psi) == [8 * 16 * 16 * BITS, 4 * 8 * 8 * BITS, 10 * BITS]
    assert list(profile.chi) == list(profile.psi)
    params = [8 * 27 + 8, 4 * 72 + 4, 256 * 10 + 10]
    assert list(profile.delta) == [BITS * sum(params[:j]) for j in (1, 2, 3)]
    assert profile.flop_convention == "2 per multiply-add"


def test_vgg16_parameters_and_activation_shapes(vgg16: ModelProfile) -> None:
    cfg = [64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512]
    conv = sum(9 * cin * cout + cout for cin, cout in zip([3] + cfg[:-1], cfg))
    fc = (512 * 7 * 7 * 4096 + 4096) + (4096 * 4096 + 4096) + (4096 * 10 + 10)
    assert conv + fc == 134_301_514
    assert vgg16.cut_points[-1].client_param_bits == BITS * (conv + fc)
    assert vgg16.cut_points[12].client_param_bits == BITS * conv  # after the last conv block
    shapes = [(64, 32, 32), (64, 16, 16), (128, 16, 16), (128, 8, 8), (256, 8, 8), (256, 8, 8), (256, 4, 4),
              (512, 4, 4), (512, 4, 4), (512, 2, 2), (512, 2, 2), (512, 2, 2), (512, 1, 1), (4096,), (4096,), (10,)]
    assert list(vgg16.psi) == [BITS * torch.Size(s).numel() for s in shapes]
    # first conv: 32*32*64 outputs x 27 MACs, 2 FLOPs each
    assert vgg16.rho[0] == 2 * 32 * 32 * 64 * 27


def test_resnet18_parameters_and_activation_shapes(resnet18: ModelProfile) -> None:
    def block(cin: int, cout: int, down: bool) -> int:
        n = 9 * cin * cout + 9 * cout * cout + 4 * cout  # two convs (no bias) + two BNs
        return n + (cin * cout + 2 * cout if down else 0)

    total = 3 * 64 * 49 + 2 * 64
    for cin, cout in ((64, 64), (64, 128), (128, 256), (256, 512)):
        total += block(cin, cout, cin != cout) + block(cout, cout, False)
    total += 512 * 10 + 10
    assert total == 11_181_642
    assert resnet18.cut_points[-1].client_param_bits == BITS * total
    assert resnet18.names == ["maxpool", "layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1",
                              "layer4.0", "avgpool", "fc"]
    shapes = [(64, 8, 8)] * 3 + [(128, 4, 4)] * 2 + [(256, 2, 2)] * 2 + [(512, 1, 1), (512,), (10,)]
    assert list(resnet18.psi) == [BITS * torch.Size(s).numel() for s in shapes]


def test_profile_json_round_trip_and_server_backward(resnet18: ModelProfile, tmp_path) -> None:
    path = tmp_path / "p.json"
    resnet18.save(path)
    assert ModelProfile.load(path) == resnet18
    data = json.loads(path.read_text())
    assert data["flop_convention"] == "2 per multiply-add" and data["input_shape"] == [3, 32, 32]
    # the server computes the cut activation's gradient, which the device's ϖ_j never includes for block 1
    assert resnet18.server_bp[0] > 0 and resnet18.server_bp[-1] == 0
    assert resnet18.varpi[0] < 2 * resnet18.rho[0]


def test_measured_times_are_cumulative_medians() -> None:
    profile = profile_model(TwoConv(), (3, 16, 16), measure_time=True, batch_size=4, repeats=3)
    fp = [c.fp_seconds for c in profile.cut_points]
    bp = [c.bp_seconds for c in profile.cut_points]
    assert all(t > 0 for t in fp + bp)
    assert fp == sorted(fp) and bp == sorted(bp)
    assert profile.timing == {"batch_size": 4, "repeats": 3, "threads": torch.get_num_threads(), "statistic": "median"}
    assert ModelProfile.from_json(profile.to_json()) == profile


@pytest.mark.parametrize("shape", [(3, 32), (3, 0, 32), (3.0, 32, 32)])
def test_bad_input_shape_is_an_input_error(shape) -> None:
    with pytest.raises(InputError, match="input_shape"):
        profile_model(TwoConv(), shape)


def test_cli_bad_input_and_unknown_model_exit_2(capsys) -> None:
    assert main(["profile", "resnet18", "--input", "3x32"]) == 2
    assert "--input" in capsys.readouterr().err
    assert main(["profile", "no_such_net", "--input", "3x32x32"]) == 2
    err = capsys.readouterr().err
    assert "MODEL" in err and "resnet18" in err


def test_cli_writes_profile_from_a_factory(tmp_path, capsys) -> None:
    out = tmp_path / "profile.json"
    assert main(["profile", "tests.profilers.test_profile:small_net", "--input", "3x16x16", "-o", str(out)]) == 0
    printed = capsys.readouterr()
    table = printed.out
    assert "conv1" in table and "8x16x16" in table and "GFLOPs" in table
    profile = ModelProfile.load(out)
    assert profile.model == "tests.profilers.test_profile:small_net" and profile.num_cuts == 3
    assert f"wrote {out} (3 cut points)" in printed.err.splitlines()      # as `system -o` says it (issue 37)
