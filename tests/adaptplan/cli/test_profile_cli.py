"""`adaptplan profile` from the command line: block-boundary cuts, JSON output, gradient statistics."""

import json
import math
import subprocess
import sys

import pytest

from adaptplan.cli import main
from adaptplan.constants import ConvergenceConstants
from adaptplan.model_profile import ModelProfile

RESNET18_CUTS = ["maxpool", "layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1", "layer4.0",
                 "avgpool", "fc"]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adaptplan.cli", *args], capture_output=True, text=True, timeout=600)


def test_resnet18_lists_only_block_boundaries(tmp_path):
    result = cli("profile", "resnet18", "--input", "3x32x32", "-o", str(tmp_path / "p.json"))
    assert result.returncode == 0, result.stderr
    profile = ModelProfile.load(tmp_path / "p.json")
    assert profile.names == RESNET18_CUTS
    assert profile.flop_convention == "2 per multiply-add"
    for name in RESNET18_CUTS:
        assert f" {name} " in result.stdout
    # torchvision's ImageNet stem at 32x32 is said once, with the CIFAR variant to use instead
    assert result.stderr.count("adaptplan profile: warning: resnet18 shrinks the 32x32 input to 8x8") == 1
    assert "use resnet18-cifar" in result.stderr


def test_grad_stats_writes_constants_matching_the_profile(tmp_path):
    profile_path, constants_path = tmp_path / "p.json", tmp_path / "c.json"
    result = cli("profile", "cnn", "--input", "3x32x32", "-o", str(profile_path), "--grad-stats", "--dataset",
                 "cifar10-subset", "--constants-out", str(constants_path), "--batches", "3", "--gamma", "0.02")
    assert result.returncode == 0, result.stderr
    profile, constants = ModelProfile.load(profile_path), ConvergenceConstants.load(constants_path)
    assert constants.num_cuts == profile.num_cuts == 5
    assert constants.gamma == 0.02 and constants.beta > 0
    assert abs(constants.theta - math.log(10)) < 0.3          # ϑ ≈ f(w⁰) ≈ ln 10 for a fresh 10-class net
    assert all(s >= 0 for s in constants.sigma2) and all(g > 0 for g in constants.G2)
    assert json.loads(constants_path.read_text())["G2"] == list(constants.G2)


def test_grad_stats_input_mismatch_and_unknown_dataset_exit_2(tmp_path):
    mismatch = cli("profile", "cnn", "--input", "1x28x28", "--grad-stats", "--dataset", "cifar10-subset",
                   "--constants-out", str(tmp_path / "c.json"))
    assert mismatch.returncode == 2 and "--input" in mismatch.stderr
    unknown = cli("profile", "cnn", "--input", "3x32x32", "--grad-stats", "--dataset", "imagenet",
                  "--constants-out", str(tmp_path / "c.json"))
    assert unknown.returncode == 2 and "cifar10-subset" in unknown.stderr and "Traceback" not in unknown.stderr


def test_model_width_profiles_the_built_in_a_run_of_that_width_trains(tmp_path, capsys):
    """`profile cnn --model-width 16`: the profile of the model `bench plans --model-width 16` (run key model_width)
    trains, the same structure hash, so its leakage table budgets such runs; the width's FLOPs scale; only the
    built-ins cnn and mlp take it (exit 2 naming --model-width)."""
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    narrow, wide = tmp_path / "w8.json", tmp_path / "w32.json"
    assert main(["profile", "cnn", "--input", "1x8x8", "--model-width", "8", "-o", str(narrow)]) == 0
    assert main(["profile", "cnn", "--input", "1x8x8", "-o", str(wide)]) == 0
    run = Trainer(TrainConfig.flat(dataset="synthetic", devices=2, batch_size=4, model_width=8, cuts=(1,), rounds=1,
                                   threads=1, progress=False)).profile
    mine = ModelProfile.load(narrow)
    assert mine.identity()["structure_sha256"] == run.identity()["structure_sha256"] != \
        ModelProfile.load(wide).identity()["structure_sha256"]
    assert mine.cut_points[0].fp_flops == pytest.approx(ModelProfile.load(wide).cut_points[0].fp_flops / 4)
    capsys.readouterr()
    assert main(["profile", "resnet18", "--input", "3x32x32", "--model-width", "8"]) == 2
    assert "--model-width: sizes the built-ins cnn and mlp only, not resnet18" in capsys.readouterr().err


def test_the_data_set_gives_the_input_shape_where_input_is_not_given(capsys):
    """`profile MODEL --dataset NAME` profiles at the data set's sample shape: the same table as `--input` of that
    shape, and neither is one error naming --input (tests/adaptplan/cli/test_errors_before_torch.py: before torch)."""
    assert main(["profile", "cnn", "--input", "3x32x32", "--json"]) == 0
    given = json.loads(capsys.readouterr().out)
    assert main(["profile", "cnn", "--dataset", "cifar10-subset", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == given and given["input_shape"] == [3, 32, 32]
    assert main(["profile", "cnn", "--dataset", "cifar10-subset", "--num-classes", "7"]) == 2
    assert "cifar10-subset has 10 classes; pass --num-classes 10" in capsys.readouterr().err
