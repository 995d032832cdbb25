"""A U-shaped split (trainers/roles/head.py, trainers/engine/head_split.py; docs/privacy.md "A U-shaped split"): the
devices keep the last blocks and the labels. Where each device's head is its own copy of the layers the plain run
keeps per device (SplitFed V1's server copies, SL's one handed-on model) the run trains the same numbers; no message
to the edge server carries a label; the head's exchange is in the round's bytes; a resumed run goes on as the
uninterrupted one; what cannot run so is one message naming --u-shaped (exit 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from adaptplan.cli import main
from trainers.engine.network import LocalNetwork
from trainers.roles.head import Head
from trainers.roles.messages import Activation, CutGradient, HeadForward, HeadGradient, MessageMismatchError
from trainers.roles.optim import OptimizerSpec
from trainers.run.history import History

RUN = ["--dataset", "synthetic", "--model", "mlp", "--devices", "3", "--cuts", "1", "--batch-size", "8", "--seed", "4",
       "--eval-every", "1", "--no-progress", "--threads", "1", "--rounds", "3"]


def _pair(tmp_path: Path, algorithm: str, *extra: str) -> tuple[History, History]:
    argv = ["train", *RUN, "--algorithm", algorithm, *extra]
    assert main([*argv, "--out", str(tmp_path / "plain")]) == 0
    assert main([*argv, "--u-shaped", "1", "--out", str(tmp_path / "u")]) == 0
    return History.load(tmp_path / "plain"), History.load(tmp_path / "u")


@pytest.mark.parametrize("algorithm", ["sl", "sfl-v1"])
def test_where_the_head_is_per_device_anyway_the_run_trains_the_same_numbers(tmp_path: Path, algorithm: str) -> None:
    """Bit for bit where the parallel step's device weight |D_i|/Σ|D| is a power of two (4 equal devices; SL's one
    device a group: 1): the plain run scales each device's server gradient by it and back, the head's gradient
    on the device is never scaled, which elsewhere differs by float rounding (docs/privacy.md)."""
    plain, shaped = _pair(tmp_path, algorithm, "--devices", "4")
    assert [r.train_loss for r in shaped.records] == [r.train_loss for r in plain.records]
    assert [r.accuracy for r in shaped.records] == [r.accuracy for r in plain.records]
    assert shaped.meta["privacy"]["u_shaped"] == 1 and "privacy" not in plain.meta


def test_adaptsfl_averaging_every_round_equals_its_shared_server_head_up_to_rounding(tmp_path: Path) -> None:
    """Eq. (4) steps the shared head with the devices' mean gradient; each device's own head stepped with its own
    and averaged every round (I = 1) is the same linear update, momentum included."""
    plain, shaped = _pair(tmp_path, "adaptsfl", "--interval", "1")
    assert [r.train_loss for r in shaped.records] == pytest.approx([r.train_loss for r in plain.records], rel=1e-5)
    assert [r.train_loss for r in shaped.records][0] == plain.records[0].train_loss


def test_no_label_reaches_the_edge_server_and_the_heads_exchange_is_in_the_bytes(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    receive = LocalNetwork.receive

    def recording(self: LocalNetwork, sources: Any, allow_absent: bool = False) -> list[Any]:
        got = receive(self, sources, allow_absent)
        seen.extend(got)
        return got

    monkeypatch.setattr(LocalNetwork, "receive", recording)
    argv = ["train", *RUN, "--algorithm", "psl"]
    assert main([*argv, "--out", str(tmp_path / "plain")]) == 0
    plain_seen, seen[:] = list(seen), []
    assert main([*argv, "--u-shaped", "1", "--out", str(tmp_path / "u")]) == 0
    plain, shaped = History.load(tmp_path / "plain"), History.load(tmp_path / "u")
    plain_acts = [m for m in plain_seen if isinstance(m, Activation)]
    u_acts = [m for m in seen if isinstance(m, Activation)]
    heads = [m for m in seen if isinstance(m, HeadGradient)]
    assert plain_acts and all(m.labels.numel() == 8 for m in plain_acts)
    assert len(u_acts) == 9 and all(m.labels.numel() == 0 for m in u_acts)
    assert len(heads) == 9 and all(m.tensor.shape == (8, 128) and m.loss.dim() == 0 for m in heads)
    # per round, 3 devices: up + features' gradient (8 × 128 float32) + the loss (4 B) − the labels (8 int64);
    # down + the features; PSL moves no model
    for a, b in zip(plain.records, shaped.records):
        assert b.bytes_up - a.bytes_up == 3 * (8 * 128 * 4 + 4 - 8 * 8)
        assert b.bytes_down - a.bytes_down == 3 * 8 * 128 * 4
        assert b.bytes_server == a.bytes_server


@pytest.mark.parametrize("noise", [[], ["--head-clip", "0.5", "--head-noise", "1"]])
def test_a_resumed_u_shaped_run_goes_on_as_the_uninterrupted_one(tmp_path: Path, noise: list[str]) -> None:
    """SplitFed V2 averages the heads with the client blocks (every 2 rounds here) and steps them with momentum:
    both are in the checkpoint, and so is the head's noise stream under noise on its gradients."""
    argv = ["train", *RUN, "--algorithm", "sfl-v2", "--u-shaped", "1", "--interval", "2", *noise]
    assert main([*argv, "--rounds", "5", "--out", str(tmp_path / "whole")]) == 0
    assert main([*argv, "--rounds", "3", "--checkpoint-every", "3", "--out", str(tmp_path / "cut")]) == 0
    assert main(["train", "--out", str(tmp_path / "cut"), "--resume", "--rounds", "5", "--no-progress"]) == 0
    a, b = History.load(tmp_path / "whole"), History.load(tmp_path / "cut")
    assert [(r.train_loss, r.accuracy) for r in a.records] == [(r.train_loss, r.accuracy) for r in b.records]


@pytest.mark.parametrize("extra, message", [
    (["--algorithm", "gapsl"], "gapsl cannot keep its labels"),
    (["--algorithm", "sfl-v1", "--cuts", "2"], "needs every cut in 1..1"),
    (["--algorithm", "sfl-v1", "--u-shaped", "2"], "keeps 1..1 blocks"),
    (["--algorithm", "adaptsfl", "--policy", "sfl"], "policy draws cuts"),
])
def test_what_cannot_run_u_shaped_is_one_message(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
                                                 message: str) -> None:
    argv = [a for a in RUN if a not in ()] + ["--u-shaped", "1", *extra, "--out", str(tmp_path / "r")]
    if "--policy" in extra:
        argv.remove("--cuts")
        argv.remove("1")
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and ("--u-shaped" in err or "--policy" in err)


def _head() -> tuple[Head, torch.nn.Sequential]:
    torch.manual_seed(0)
    template = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 3), torch.nn.Linear(3, 2))
    return Head(7, template, 2, OptimizerSpec(name="sgd", lr=0.5)), template         # blocks 1 and 2


def test_the_head_answers_the_loss_and_gradient_of_its_layers_on_the_kept_labels_and_steps_once() -> None:
    head, template = _head()
    labels = torch.tensor([0, 1, 1])
    sent = head.keep(Activation(7, 1, 1, torch.zeros(3, 4), labels))
    assert sent.labels.numel() == 0
    h = torch.randn(3, 5, requires_grad=True)
    reply = head.reply(HeadForward(7, 1, 1, h.detach()))
    loss = torch.nn.functional.cross_entropy(template[2](template[1](h)), labels)
    grad_h, grad_w = torch.autograd.grad(loss, [h, template[1].weight])
    assert torch.allclose(reply.loss, loss) and torch.allclose(reply.tensor, grad_h)
    before = template[1].weight.detach().clone()
    head.finish(CutGradient(7, 1, 1, torch.zeros(3, 4)))
    assert torch.allclose(head.blocks[0].weight, before - 0.5 * grad_w)                 # plain SGD, lr 0.5
    assert torch.equal(template[1].weight, before)                                      # the template untouched
    with pytest.raises(MessageMismatchError, match="expects nothing"):
        head.reply(HeadForward(7, 1, 1, h.detach()))


def test_a_dropped_step_leaves_the_head_as_it_was_and_mismatched_features_are_refused() -> None:
    head, template = _head()
    head.keep(Activation(7, 2, 5, torch.zeros(2, 4), torch.tensor([1, 0])))
    with pytest.raises(MessageMismatchError, match="step 4"):
        head.reply(HeadForward(7, 2, 4, torch.zeros(2, 5)))
    with pytest.raises(MessageMismatchError, match="for a step of 2 samples"):
        head.reply(HeadForward(7, 2, 5, torch.zeros(3, 5)))
    head.reply(HeadForward(7, 2, 5, torch.ones(2, 5)))
    head.finish(CutGradient(7, 2, 5, None))
    assert torch.equal(head.blocks[0].weight, template[1].weight)
