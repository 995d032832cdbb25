"""A run with a defence of the activations (docs/privacy.md "Defences"): the (ε, δ) each device has spent is in the
history (every record's ``epsilon_max``, the meta's per-device figures), each equal to the accountant at the device's
sends; a resumed run goes on as the uninterrupted one (the noise stream is checkpointed); the batched client path
gives way to the per-device one; bad settings are one message naming the flag (exit 2)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from adaptplan.cli import main
from trainers.roles.defences import activation_epsilon
from trainers.run.history import History

RUN = ["--algorithm", "sfl-v2", "--dataset", "synthetic", "--model", "mlp", "--devices", "3", "--cuts", "1",
       "--batch-size", "8", "--seed", "4", "--eval-every", "2", "--no-progress", "--threads", "1"]
NOISE = ["--activation-clip", "1.5", "--activation-noise", "0.8", "--nopeek", "0.3"]


def test_the_history_records_each_devices_epsilon_from_its_sends(tmp_path: Path) -> None:
    argv = [*RUN, *NOISE, "--rounds", "5", "--algorithm", "sfl-v1", "--devices", "4", "--participation", "0.5", "--out", str(tmp_path)]
    assert main(["train", *argv]) == 0
    history = History.load(tmp_path)
    privacy = history.meta["privacy"]
    sent = [sum(d in r.participants for r in history.records) for d in range(4)]   # one send a round
    assert privacy["releases"] == sent and sum(sent) == 10
    for d in range(4):
        q = privacy["sample_rate"][d]
        assert privacy["epsilon"][d] == pytest.approx(activation_epsilon(0.8, q, sent[d], 1e-5), rel=1e-12)
    assert history.records[-1].metrics["epsilon_max"] == pytest.approx(max(privacy["epsilon"]), rel=1e-12)
    running = [r.metrics["epsilon_max"] for r in history.records]
    assert running == sorted(running) and running[0] > 0
    assert (privacy["activation_clip"], privacy["activation_noise"], privacy["nopeek"], privacy["delta"]) == \
        (1.5, 0.8, 0.3, 1e-5)


def test_a_resumed_defended_run_goes_on_as_the_uninterrupted_one(tmp_path: Path) -> None:
    """Half the devices take part in the last round: the others' sends before the checkpoint still count."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    argv = [*RUN, *NOISE, "--algorithm", "sfl-v1", "--devices", "4", "--participation", "0.5"]
    assert main(["train", *argv, "--rounds", "6", "--out", str(whole)]) == 0
    assert main(["train", *argv, "--rounds", "5", "--checkpoint-every", "5", "--out", str(cut)]) == 0
    assert main(["train", "--out", str(cut), "--resume", "--rounds", "6", "--no-progress"]) == 0
    a, b = History.load(whole), History.load(cut)
    assert [r.train_loss for r in a.records] == [r.train_loss for r in b.records]
    assert [r.metrics["epsilon_max"] for r in a.records] == [r.metrics["epsilon_max"] for r in b.records]
    assert a.meta["privacy"]["epsilon"] == b.meta["privacy"]["epsilon"] and min(a.meta["privacy"]["epsilon"]) > 0


def test_the_batched_client_path_gives_way_to_the_defence(tmp_path: Path) -> None:
    argv = [*RUN, *NOISE, "--rounds", "3"]
    assert main(["train", *argv, "--client-batching", "on", "--out", str(tmp_path / "on")]) == 0
    assert main(["train", *argv, "--client-batching", "off", "--out", str(tmp_path / "off")]) == 0
    on, off = History.load(tmp_path / "on"), History.load(tmp_path / "off")
    assert [r.train_loss for r in on.records] == [r.train_loss for r in off.records]


def test_randomised_labels_at_a_large_epsilon_train_as_the_true_ones_and_are_recorded(tmp_path: Path) -> None:
    """ε = 1000 keeps every label (probability 1 − 9·e⁻¹⁰⁰⁰): the run equals the undefended one; ε = 0.5 does not."""
    argv = [*RUN, "--rounds", "3"]
    assert main(["train", *argv, "--out", str(tmp_path / "plain")]) == 0
    assert main(["train", *argv, "--label-epsilon", "1000", "--out", str(tmp_path / "kept")]) == 0
    assert main(["train", *argv, "--label-epsilon", "0.5", "--out", str(tmp_path / "noisy")]) == 0
    plain, kept, noisy = (History.load(tmp_path / k) for k in ("plain", "kept", "noisy"))
    assert [r.train_loss for r in kept.records] == [r.train_loss for r in plain.records]
    assert [r.train_loss for r in noisy.records] != [r.train_loss for r in plain.records]
    m = plain.meta["num_classes"]
    assert noisy.meta["privacy"]["label_epsilon"] == 0.5 and noisy.meta["privacy"]["label_keep_probability"] == \
        pytest.approx(math.exp(0.5) / (math.exp(0.5) + m - 1), rel=1e-12)


def test_an_undefended_run_records_no_privacy(tmp_path: Path) -> None:
    assert main(["train", *RUN, "--rounds", "2", "--out", str(tmp_path)]) == 0
    history = History.load(tmp_path)
    assert "privacy" not in history.meta and all("epsilon_max" not in r.metrics for r in history.records)


@pytest.mark.parametrize("argv, flag", [
    (["--activation-noise", "1"], "--activation-noise"),
    (["--activation-clip", "-1"], "--activation-clip"),
    (["--nopeek", "-0.5"], "--nopeek"),
    (["--privacy-delta", "1"], "--privacy-delta"),
    (["--label-epsilon", "-1"], "--label-epsilon"),
    (["--clip-per-value"], "--clip-per-value"),
])
def test_bad_defence_settings_are_one_message_and_exit_2(argv: list[str], flag: str, capsys) -> None:
    assert main(["train", *RUN, "--rounds", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_devices_sampling_rate_is_its_batch_over_its_samples_at_most_one() -> None:
    from types import SimpleNamespace

    from trainers.engine.privacy_account import sample_rates

    engine = SimpleNamespace(batch_size=16, data_sizes=lambda: [10, 40, 0, 16])
    assert sample_rates(engine) == [1.0, 0.4, 1.0, 1.0]      # 10 samples: the whole set each step; none: never sends


def test_a_bound_per_value_trains_as_the_bound_it_stands_for(tmp_path: Path) -> None:
    """--activation-clip c --clip-per-value is --activation-clip c·√d (d: the values a sample sends at the cut), and
    the history says which it was."""
    from trainers.inputs.datasets import load_dataset
    from trainers.inputs.models import build_model

    data = load_dataset("synthetic")
    d = int(build_model("mlp", data.input_shape, data.num_classes)[0](data.x_train[:1]).numel())
    argv = [*RUN, "--activation-noise", "0.8", "--rounds", "3"]
    assert main(["train", *argv, "--activation-clip", "0.25", "--clip-per-value", "--out", str(tmp_path / "v")]) == 0
    assert main(["train", *argv, "--activation-clip", str(0.25 * d ** 0.5), "--out", str(tmp_path / "s")]) == 0
    per_value, per_sample = History.load(tmp_path / "v"), History.load(tmp_path / "s")
    assert [r.train_loss for r in per_value.records] == pytest.approx([r.train_loss for r in per_sample.records],
                                                                      rel=1e-6)
    assert per_value.meta["privacy"]["clip_per_value"] is True and per_sample.meta["privacy"]["clip_per_value"] is False
