"""Models for small images (issue 25 item 4): the CIFAR-style ResNet built-ins, the warning when an
ImageNet stem meets a small image, and torchvision's ViT built for the image size it is given."""

import subprocess
import sys

import pytest
import torch

from adaptplan.errors import InputError
from profilers.profile import profile_model, stem_note
from trainers.inputs.models import build_model


def conv_macs(c_in: int, c_out: int, kernel: int, side_out: int) -> int:
    """Multiply-adds of one bias-free convolution with a square output of ``side_out`` pixels."""
    return c_out * c_in * kernel * kernel * side_out * side_out


def resnet18_cifar_macs(num_classes: int) -> int:
    """ResNet-18 on 32×32 with a 3×3 stride-1 stem and no max-pool, convolutions and the classifier
    only (He et al. 2016, Table 1's stages at 32/16/8/4 pixels)."""
    macs = conv_macs(3, 64, 3, 32) + 4 * conv_macs(64, 64, 3, 32)
    for c_in, c_out, side in ((64, 128, 16), (128, 256, 8), (256, 512, 4)):
        macs += conv_macs(c_in, c_out, 3, side) + 3 * conv_macs(c_out, c_out, 3, side) + conv_macs(c_in, c_out, 1, side)
    return macs + 512 * num_classes


def test_resnet18_cifar_is_the_imagenet_network_with_a_small_image_stem():
    cifar, imagenet = build_model("resnet18-cifar", (3, 32, 32), 10), build_model("resnet18", (3, 32, 32), 10)
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert count(cifar) == count(imagenet) - 64 * 3 * 7 * 7 + 64 * 3 * 3 * 3   # only the stem kernel differs
    assert cifar(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    fp = profile_model(cifar, (3, 32, 32), optimizer=None).cut_points[-1].fp_flops
    # fvcore also counts the norm layers and the average pool (≈ 0.1 %); 2 FLOPs per multiply-add
    assert 2 * resnet18_cifar_macs(10) <= fp <= 2 * resnet18_cifar_macs(10) * 1.003
    assert 1.10e9 < fp < 1.12e9


@pytest.mark.parametrize("name, blocks", [("resnet34-cifar", 18), ("resnet50-cifar", 18)])
def test_deeper_cifar_resnets_keep_32_pixels_in_their_first_stage(name, blocks):
    profile = profile_model(build_model(name, (1, 28, 28), 3), (1, 28, 28), optimizer=None)
    assert profile.num_cuts == blocks
    model = build_model(name, (1, 28, 28), 3)
    assert model.conv1.stride == (1, 1) and model.conv1.in_channels == 1
    assert isinstance(model.maxpool, torch.nn.Identity)


def test_an_imagenet_stem_on_a_small_image_is_noted_with_the_fix():
    shapes = [(64, 8, 8), (128, 4, 4), (512, 1, 1), (10,)]
    note = stem_note("resnet18", (3, 32, 32), shapes)
    assert note.startswith("resnet18 shrinks the 32x32 input to 8x8 in its first block")
    assert "last feature map is 1x1" in note and "use resnet18-cifar" in note
    assert "vgg16-cifar" in stem_note("densenet121", (3, 32, 32), shapes)        # no variant: a general fix
    assert stem_note("resnet18", (3, 64, 64), [(64, 16, 16), (10,)]) is not None   # 4x at the 64-pixel limit
    assert stem_note("resnet18", (3, 65, 65), [(64, 16, 16), (10,)]) is None       # not a small image
    assert stem_note("resnet18", (3, 32, 128), [(64, 8, 32), (10,)]) is None       # one side of 128: not small
    assert stem_note("resnet18", (3, 224, 224), [(64, 56, 56), (10,)]) is None
    assert stem_note("mobilenet_v2", (3, 32, 32), [(32, 16, 16), (10,)]) is None   # a stride-2 stem: 2x
    assert stem_note("mlp", (1, 8, 8), [(16,), (3,)]) is None                      # no spatial cut


def test_profile_says_nothing_for_a_model_made_for_small_images():
    for name in ("resnet18-cifar", "vgg16-cifar", "cnn"):
        note = stem_note(name, (3, 32, 32), _shapes(name))
        assert note is None, name


def _shapes(name):
    from profilers.chain import build_chain
    from profilers.tracing import example_batch

    return build_chain(build_model(name, (3, 32, 32), 10), example_batch((3, 32, 32))).output_shapes


def test_vit_is_built_for_the_image_size_given():
    model = build_model("vit_b_32", (3, 64, 64), 5)
    assert model.image_size == 64
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 5)
    assert build_model("vit_b_32", (3, 32, 32), 5).image_size == 32


@pytest.mark.parametrize("shape, expected", [((3, 60, 60), "--input 3x48x48"), ((3, 64, 32), "got 64x32"),
                                             ((3, 8, 8), "--input 3x16x16")])
def test_vit_refuses_a_size_its_patches_do_not_tile(shape, expected):
    with pytest.raises(InputError) as info:
        build_model("vit_b_16", shape, 10)
    assert info.value.field == "--input"
    assert "multiple of its patch size 16" in str(info.value) and expected in str(info.value)


def test_profile_cli_refuses_a_vit_size_with_exit_2_and_no_traceback():
    result = subprocess.run([sys.executable, "-m", "adaptplan.cli", "profile", "vit_b_16", "--input", "3x60x60"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "adaptplan profile: error: --input: vit_b_16 needs square images whose side is a multiple of its patch "
        "size 16; got 60x60. Fix: resize the images, e.g. --input 3x48x48"]
