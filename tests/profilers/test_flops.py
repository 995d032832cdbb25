"""FLOP counts against hand counts (2 FLOPs per multiply–add, per sample), cut points of models with
run-time checks and attention, and the warnings/errors for models without an interior cut.

Hand counts: a convolution costs C_out·|out|·(C_in/groups)·|k| multiply–adds forward; its input
gradient and its weight gradient cost the same each (docs/formats.md "Model profile").
"""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from adaptplan.errors import InputError
from profilers.chain import NoCutWarning, build_chain
from profilers.flops import count_flops
from profilers.profile import profile_model


def test_depthwise_conv_backward_is_twice_its_forward():
    conv = nn.Conv2d(8, 8, 3, padding=1, groups=8)  # depthwise, 8 channels, 6×6 map
    fp = 2 * 8 * 36 * 1 * 9                           # 5,184 FLOPs
    x = torch.randn(2, 8, 6, 6)
    with_input = count_flops(conv, x, input_grad=True)
    assert (with_input.fp, with_input.check_fp, with_input.bp) == (fp, fp, 2 * fp)
    assert count_flops(conv, x, input_grad=False).bp == fp   # weight gradient only (first layer)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_grouped_conv_counts(groups):
    conv = nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=groups)   # 9×9 → 5×5
    fp = 2 * 8 * 25 * (4 // groups) * 9
    counts = count_flops(conv, torch.randn(1, 4, 9, 9), input_grad=True)
    assert (counts.fp, counts.bp) == (fp, 2 * fp)


def test_transposed_grouped_conv_counts():
    conv = nn.ConvTranspose2d(8, 4, 3, stride=2, groups=2)  # each of 8·5·5 inputs meets 2·9 weights
    fp = 2 * 8 * 25 * 2 * 9
    counts = count_flops(conv, torch.randn(1, 8, 5, 5), input_grad=True)
    assert (counts.fp, counts.bp) == (fp, 2 * fp)


class Attention(nn.Module):
    """Linear 4→4 on 5 tokens, then single-head attention with q = k = v."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.proj(x).unsqueeze(1)                       # (b, 1, 5, 4)
        return F.scaled_dot_product_attention(q, q, q).squeeze(1)


def test_attention_is_counted_forward_and_backward():
    linear = 5 * 4 * 4                # multiply–adds of the projection
    attention = 5 * 5 * 4 + 5 * 5 * 4  # Q·Kᵀ and P·V
    counts = count_flops(Attention(), torch.randn(3, 5, 4), input_grad=True)
    assert counts.fp == 2 * (linear + attention)
    assert counts.check_fp == 2 * (linear + attention)
    # backward: the projection's two gradients, and five 5×5×4 products: the flash kernel recomputes
    # Q·Kᵀ, then dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K, dK = dSᵀ·Q
    assert counts.bp == 2 * (2 * linear + 5 * (5 * 5 * 4))


def test_profile_first_block_has_no_input_gradient_and_states_its_counting():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1, groups=4))
    first, second = 2 * 4 * 25 * 3 * 9, 2 * 4 * 25 * 1 * 9   # 5,400 and 1,800 FLOPs on 5×5
    profile = profile_model(model, (3, 5, 5))
    assert list(profile.rho) == [first, first + second]
    assert list(profile.varpi) == [first, first + 2 * second]   # block 1: weight gradient only
    counting = profile.flop_counting
    assert counting["check"]["fp_flops"] == first + second and counting["check"]["relative_difference"] == 0
    assert counting["zero_flop_ops"] == ["aten::relu"]
    assert profile.to_json()["flop_counting"] == counting


def test_mobilenet_v2_backward_is_about_twice_its_forward():
    profile = profile_model("mobilenet_v2", (3, 32, 32))
    fp = [profile.rho[0]] + list(profile.rho[1:] - profile.rho[:-1])
    bp = [profile.varpi[0]] + list(profile.varpi[1:] - profile.varpi[:-1])
    assert bp[0] <= fp[0]                                    # first block: no input gradient
    assert all(b <= 2 * f * (1 + 1e-9) for f, b in zip(fp[1:], bp[1:]))  # norms count in fp only
    assert 1.6 <= profile.varpi[-1] / profile.rho[-1] <= 2.4
    assert abs(profile.flop_counting["check"]["relative_difference"]) < 0.1


def small_vit() -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
                             num_classes=10)


def test_vit_is_cut_between_its_encoder_blocks_with_hand_counted_flops():
    profile = profile_model(small_vit(), (3, 32, 32))
    # patch conv; after each encoder layer's attention and after its MLP (the last one joins the
    # final LayerNorm); the head. Class token and position embedding make no zero-FLOP cuts.
    assert profile.names == ["conv_proj", "encoder.layers.encoder_layer_0.dropout", "encoder.layers.encoder_layer_0.mlp",
                             "encoder.layers.encoder_layer_1.dropout", "encoder.ln", "heads.head"]
    tokens, d, mlp = 17, 16, 32
    patch = 16 * d * 3 * 8 * 8                                       # 16 patches
    layer = (tokens * d * 3 * d + tokens * d * d                     # in- and out-projection
             + 2 * (2 * tokens * tokens * (d // 2))                  # attention, 2 heads
             + 2 * tokens * d * mlp                                  # MLP
             + 2 * tokens * d * 5)                                   # 2 LayerNorms (fvcore: 5 per value)
    total = patch + 2 * layer + tokens * d * 5 + d * 10              # + final LayerNorm + head
    assert profile.rho[0] == 2 * patch
    assert profile.rho[-1] == 2 * total
    norms = 2 * (2 * tokens * d * 5) + tokens * d * 5                 # the check counts no LayerNorm
    assert profile.flop_counting["check"]["fp_flops"] == 2 * (total - norms)
    assert "aten::gelu" in profile.flop_counting["zero_flop_ops"]


def test_vit_chain_equals_the_model_and_keeps_its_input_check():
    model = small_vit().eval()
    chain = build_chain(model, torch.randn(1, 3, 32, 32))
    chain.blocks.eval()
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(chain.blocks(x), model(x))
    with pytest.raises(Exception, match="Wrong image height"):
        chain.blocks[0](torch.randn(1, 3, 16, 32))


class Checked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._assert(x.shape[1] == 4, "four features")
        return self.fc2(torch.relu(self.fc1(x)))


def test_torch_assert_does_not_remove_cut_points():
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoCutWarning)
        chain = build_chain(Checked(), torch.randn(1, 4))
    assert chain.names == ["fc1", "fc2"]


class SkipAll(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.fc1(x))


def test_model_without_interior_cut_warns_and_cannot_be_planned():
    with pytest.warns(NoCutWarning, match="no cut point but its output"):
        profile = profile_model(SkipAll(), (4,))
    assert profile.num_cuts == 1
    from adaptplan import Planner
    from adaptplan.system import generate_system

    with pytest.raises(InputError, match="profile.cut_points: .*no cut point but its output"):
        Planner(profile, generate_system(4, seed=0))


class Scaled(nn.Module):
    """fc1 → learned per-feature scale (parameters, no matrix product: 0 FLOPs counted) → fc2."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 2)
        self.scale = nn.Parameter(torch.ones(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x) * self.scale)


def test_zero_flop_block_makes_no_cut_of_its_own():
    """Cutting after the scale costs the device the same FLOPs and sends the same 6 values as
    cutting after fc1, but holds 6 more parameters: only the cut after fc1 is kept."""
    model = Scaled()
    chain = build_chain(model, torch.randn(1, 4))
    assert chain.names == ["fc1", "fc2"]
    assert sum(p.numel() for p in chain.blocks[0].parameters()) == 4 * 6 + 6   # fc1 only, not the scale
    x = torch.randn(3, 4)
    assert torch.equal(chain.blocks(x), model(x))
