"""Noise on a U-shaped split's head gradients (``--head-clip C_g``, ``--head-noise σ_g``; trainers/roles/head.py,
trainers/roles/defences.py; docs/privacy.md "A U-shaped split"): each sample's gradient b·∂F_i/∂h_k is clipped to
C_g and noised with σ_g·C_g·z from the device's own stream before it leaves; the head steps with the exact gradient;
the run records each device's (ε, δ) from Opacus' accountant; its cost is on the clock; the attacker's view reads
the released rows. (A resumed run under it: tests/trainers/engine/test_u_shaped.py.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from adaptplan.cli import main
from adaptplan.defence_cost import DefenceSetting, with_head_on_device
from adaptplan.errors import InputError
from profilers.leakage import leakage_per_cut
from solvers.synthetic import synthetic_profile
from trainers.roles.defences import ActivationDefence
from trainers.roles.head import Head
from trainers.roles.messages import Activation, CutGradient, HeadForward
from trainers.roles.optim import OptimizerSpec
from trainers.run.history import History

RUN = ["train", "--dataset", "synthetic", "--model", "mlp", "--devices", "3", "--cuts", "1", "--batch-size", "8",
       "--seed", "4", "--eval-every", "1", "--no-progress", "--threads", "1", "--rounds", "3", "--u-shaped", "1"]


def _stream(seed: list[int]) -> torch.Generator:
    """The head's noise stream written out: SeedSequence([*seed, 2³² − 4]), two words into torch's seed."""
    words = np.random.SeedSequence([*seed, 2 ** 32 - 4]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(words[0]) << 31 ^ int(words[1]))


def _head(clip: float, noise: float) -> tuple[Head, torch.nn.Sequential]:
    torch.manual_seed(0)
    template = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 3), torch.nn.Linear(3, 2))
    defence = ActivationDefence(head=2, head_clip=clip, head_noise=noise)
    return Head(7, template, 2, OptimizerSpec(name="sgd", lr=0.5), defence, [3, 7]), template


def _exact(template: torch.nn.Sequential, h: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h = h.detach().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(template[2](template[1](h)), labels)
    grad_h, grad_w = torch.autograd.grad(loss, [h, template[1].weight])
    return grad_h, grad_w


def test_the_head_sends_each_samples_gradient_clipped_and_noised_from_its_stream_and_steps_with_the_exact_one() -> None:
    head, template = _head(clip=0.3, noise=2.0)
    labels = torch.tensor([0, 1, 1, 0])
    head.keep(Activation(7, 1, 1, torch.zeros(4, 4), labels))
    h = torch.randn(4, 5) * torch.tensor([[1.0], [100.0], [0.01], [10.0]])
    reply = head.reply(HeadForward(7, 1, 1, h))
    grad_h, grad_w = _exact(template, h, labels)
    rows = 4 * grad_h                                           # each sample's own ∂CE/∂h
    norms = rows.norm(dim=1, keepdim=True)
    clipped = rows * torch.clamp(0.3 / norms, max=1.0)
    z = torch.randn(rows.shape, generator=_stream([3, 7]))
    assert torch.allclose(reply.tensor, (clipped + 2.0 * 0.3 * z) / 4, atol=1e-7)
    assert torch.allclose(reply.loss, torch.nn.functional.cross_entropy(template[2](template[1](h)), labels))
    before = template[1].weight.detach().clone()
    head.finish(CutGradient(7, 1, 1, torch.zeros(4, 4)))
    assert torch.allclose(head.blocks[0].weight, before - 0.5 * grad_w)       # the exact gradient, never released


def test_a_clip_alone_bounds_each_row_and_leaves_the_rows_under_it() -> None:
    head, template = _head(clip=0.3, noise=0.0)
    labels = torch.tensor([1, 0])
    head.keep(Activation(7, 1, 1, torch.zeros(2, 4), labels))
    h = torch.randn(2, 5)
    reply = head.reply(HeadForward(7, 1, 1, h))
    rows = 2 * _exact(template, h, labels)[0]
    sent = 2 * reply.tensor
    for r, s in zip(rows, sent):
        if r.norm() <= 0.3:
            assert torch.equal(s, r)
        else:
            assert s.norm() == pytest.approx(0.3, rel=1e-6) and torch.allclose(s / s.norm(), r / r.norm())
    assert head.noise_rng is None


def _history(tmp_path: Path, name: str, *extra: str) -> History:
    assert main([*RUN, *extra, "--out", str(tmp_path / name)]) == 0
    return History.load(tmp_path / name)


def test_a_clip_that_never_binds_trains_the_plain_u_shaped_run_and_noise_is_accounted_per_device(
        tmp_path: Path) -> None:
    from opacus.accountants import RDPAccountant

    plain = _history(tmp_path, "plain", "--algorithm", "sfl-v1")
    loose = _history(tmp_path, "loose", "--algorithm", "sfl-v1", "--head-clip", "1e9")
    assert [(r.train_loss, r.accuracy) for r in loose.records] == [(r.train_loss, r.accuracy) for r in plain.records]
    noisy = _history(tmp_path, "noisy", "--algorithm", "sfl-v1", "--head-clip", "0.5", "--head-noise", "1")
    assert noisy.records[0].train_loss == plain.records[0].train_loss           # the first loss is before any noise
    assert [r.train_loss for r in noisy.records] != [r.train_loss for r in plain.records]
    privacy = noisy.meta["privacy"]
    assert (privacy["head_clip"], privacy["head_noise"], privacy["releases"]) == (0.5, 1.0, [3, 3, 3])
    for q, eps in zip(privacy["sample_rate"], privacy["head_epsilon"]):
        accountant = RDPAccountant()
        accountant.history = [(1.0, q, 3)]
        assert eps == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
    assert noisy.records[-1].metrics["head_epsilon_max"] == pytest.approx(max(privacy["head_epsilon"]), rel=1e-12)
    assert "epsilon_max" not in noisy.records[-1].metrics and "head_epsilon_max" not in plain.records[-1].metrics


@pytest.mark.parametrize("extra, flag, message", [
    (["--head-noise", "1"], "--head-noise", "give --head-clip"),
    (["--head-clip", "1", "--u-shaped", "0"], "--head-clip", "give --u-shaped"),
    (["--head-clip", "-1"], "--head-clip", ""),
])
def test_a_head_gradient_setting_that_cannot_run_is_one_message(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                               extra: list[str], flag: str, message: str) -> None:
    assert main([*RUN, "--algorithm", "sfl-v1", *extra, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert flag in err and message in err and "Traceback" not in err


def test_the_setting_parses_names_and_configures_the_head_gradients_defence() -> None:
    setting = DefenceSetting.parse("head=1,head_clip=0.5,head_noise=2")
    assert (setting.head, setting.head_clip, setting.head_noise) == (1, 0.5, 2.0)
    assert setting.name == "head=1,head_clip=0.5,head_noise=2"
    assert DefenceSetting.parse(setting.name) == setting
    config = setting.config()
    assert (config["u_shaped"], config["head_clip"], config["head_noise"]) == (1, 0.5, 2.0)
    defence = ActivationDefence.of_setting(setting, classes=10)
    assert (defence.head, defence.head_clip, defence.head_noise) == (1, 0.5, 2.0)
    for text, message in [("head_clip=1", "need a U-shaped split"), ("head=1,head_noise=1", "head_noise needs head_clip"),
                          ("head=1,head_clip=x", "must be a number")]:
        with pytest.raises(InputError, match=message):
            DefenceSetting.parse(text, "--defences")
    with pytest.raises(ValueError, match="needs a U-shaped split"):
        ActivationDefence(head_clip=1.0)
    with pytest.raises(ValueError, match="needs a clip"):
        ActivationDefence(head=1, head_noise=1.0)


def test_the_clock_charges_the_heads_clip_and_noise_per_sample_written_out() -> None:
    profile = synthetic_profile(6, seed=3)
    head = 2
    k = profile.num_cuts - head - 1
    d_k = profile.cut_points[k].activation_bits / profile.bits_per_value
    bare = with_head_on_device(profile, head)
    for clip, noise, flops in [(True, False, 3 * d_k), (True, True, 4 * d_k)]:
        charged = with_head_on_device(profile, head, "head", clip, noise)
        for j in range(k):            # eq. (21): 3d to clip (norm, scaling), d to add the noise, with the backward
            assert charged.cut_points[j].bp_flops == pytest.approx(bare.cut_points[j].bp_flops + flops, rel=1e-12)
            assert charged.cut_points[j].fp_flops == bare.cut_points[j].fp_flops
    setting = DefenceSetting.parse("head=2,head_clip=1,head_noise=1")
    assert setting.charged(profile, 8).cut_points[0].bp_flops == pytest.approx(
        bare.cut_points[0].bp_flops + 4 * d_k, rel=1e-12)


def _chain() -> tuple[torch.nn.Sequential, torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    blocks = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    x = torch.randn(200, 6)
    return blocks, x, torch.randint(0, 4, (200,))


def test_the_attacker_reads_the_released_rows_at_the_heads_input_and_their_back_propagation_below_it() -> None:
    blocks, x, y = _chain()
    plain = leakage_per_cut(blocks, x, y)
    same = leakage_per_cut(blocks, x, y, head=(2, lambda g: g))
    assert same == plain                                     # an identity release is the plain table
    scaled = leakage_per_cut(blocks, x, y, head=(2, lambda g: 3.0 * g))
    assert scaled[1].direction_auc == pytest.approx(plain[1].direction_auc, abs=1e-12)   # cosines ignore scale
    generator = torch.Generator().manual_seed(0)
    drowned = leakage_per_cut(blocks, x, y, head=(2, lambda g: torch.randn(g.shape, generator=generator)))
    assert plain[1].direction_auc > 0.9
    for row in drowned:       # cut 1 (back-propagated) and cut 2 (the head's input): nothing of the labels is left
        assert abs(row.direction_auc - 0.5) < 0.08 and abs(row.norm_auc - 0.5) < 0.08
    assert [r.dcor for r in drowned] == [r.dcor for r in plain]


def test_the_attackers_view_of_a_head_defence_is_its_release_from_the_attackers_own_stream() -> None:
    defence = ActivationDefence(head=1, head_clip=0.5, head_noise=1.0)
    view = defence.attacker_view(torch.tensor([0, 1]), 5, [5])
    assert view.release is None and view.labels is None and view.gradient is not None
    rows = torch.tensor([[3.0, 4.0], [0.3, 0.0]])
    expected = defence.released_gradient(rows, torch.Generator().manual_seed(5 ^ (2 ** 32 - 4)))
    assert torch.equal(view.gradient(rows), expected)
    assert ActivationDefence(head=1).attacker_view(torch.tensor([0]), 5, [5]).gradient is None


def test_a_clip_on_a_head_that_mixes_a_batchs_samples_is_refused_naming_head_clip() -> None:
    """BatchNorm in the head couples the rows of ∂F/∂h: no row is one sample's gradient, so no clip bounds a sample."""
    from types import SimpleNamespace

    from trainers.engine.head_split import check_u_shaped

    def engine(head_block: torch.nn.Module, clip: float) -> SimpleNamespace:
        template = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 6), head_block)
        return SimpleNamespace(template=template, num_blocks=3, strategy=SimpleNamespace(labels_on_device=True),
                               defence=ActivationDefence(head=1, head_clip=clip))

    coupled = torch.nn.Sequential(torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 2))
    with pytest.raises(InputError) as caught:
        check_u_shaped(engine(coupled, 0.5), [1])
    assert caught.value.field == "head_clip" and "holds BatchNorm" in caught.value.message
    check_u_shaped(engine(coupled, 0.0), [1])                                  # no clip: nothing per sample needed
    check_u_shaped(engine(torch.nn.Sequential(torch.nn.LayerNorm(6), torch.nn.Linear(6, 2)), 0.5), [1])  # per sample
