"""``train --leakage-out FILE --leakage-every N`` (adaptplan/cli/leakage_trace.py): the leakage per cut measured before
the first round, every N rounds and at the last, kept in history.json, the table the worst of them; the measurements
leave the training as it was; a resumed run goes on with the series; bad flags are one message (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptplan.cli import main
from adaptplan.cli.leakage_trace import KEY, figure_path, plot_over_rounds, rounds_text, worst_figures
from adaptplan.leakage_table import LeakageTable
from tests.plot_checks import spy_figures

RUN = ["--algorithm", "sfl-v1", "--dataset", "synthetic", "--model", "mlp", "--devices", "2", "--cuts", "1",
       "--batch-size", "8", "--seed", "3", "--no-progress", "--threads", "1", "--eval-every", "1"]
NOISED = ["--activation-clip", "1", "--activation-noise", "0.5", "--label-epsilon", "2"]


def _history(folder: Path) -> dict:
    return json.loads((folder / "history.json").read_text(encoding="utf-8"))


def test_the_worst_figure_of_each_cut_is_the_largest_but_for_the_reconstruction_error() -> None:
    points = [{"dcor": [0.9, 0.5], "mse": [0.01, 0.03], "psnr": [19.0, 14.0]},
              {"dcor": [0.8, 0.6], "mse": [0.02, 0.02], "psnr": [19.5, 13.0]}]
    assert worst_figures(points) == {"dcor": [0.9, 0.6], "mse": [0.01, 0.02], "psnr": [19.5, 14.0]}


def test_the_rounds_are_named_all_up_to_six_then_the_first_three_and_the_last() -> None:
    assert rounds_text([0, 5, 10, 15, 20, 25]) == "0, 5, 10, 15, 20, 25"
    assert rounds_text([0, 5, 10, 15, 20, 25, 30]) == "0, 5, 10, …, 30"


def test_the_figure_draws_each_held_figure_against_the_round_one_line_per_cut(tmp_path: Path, monkeypatch) -> None:
    figures = spy_figures(monkeypatch)
    series = [{"round": 0, "figures": {"dcor": [0.9, 0.5], "norm_auc": [0.5, 0.5], "psnr": [19.0, 14.0]}},
              {"round": 25, "figures": {"dcor": [0.95, 0.6], "norm_auc": [0.5, 0.5], "psnr": [19.5, 13.0]}}]
    plot_over_rounds(series, tmp_path / "f.png", "worst of $2$ models")
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    (fig,) = figures
    assert fig._suptitle.get_text() == r"worst of \$2\$ models"                   # shown as typed, not as mathtext
    assert all(ax.get_xlabel() == "round" for ax in fig.axes)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["cut 1", "cut 2"]
    panels = {ax.get_ylabel(): ax for ax in fig.axes}
    assert set(panels) == {"dCor (inputs, activations)", "inversion PSNR (dB)"}      # no AUC of direction held
    dcor = panels["dCor (inputs, activations)"]
    assert [list(line.get_xdata()) for line in dcor.lines] == [[0, 25], [0, 25]]
    assert [list(line.get_ydata()) for line in dcor.lines] == [[0.9, 0.95], [0.5, 0.6]]
    assert [line.get_label() for line in dcor.lines] == ["cut 1", "cut 2"]
    assert [list(line.get_ydata()) for line in panels["inversion PSNR (dB)"].lines] == [[19.0, 19.5], [14.0, 13.0]]
    assert figure_path("out/worst.json") == Path("out/worst-over-rounds.png")


def test_measuring_every_round_trains_what_an_unmeasured_run_trains(tmp_path: Path, capsys) -> None:
    """The defence draws noise and randomised labels every round and the attacks draw their own: the losses,
    accuracies and the privacy account of a run measured every round equal an unmeasured run's exactly."""
    plain, measured = tmp_path / "plain", tmp_path / "measured"
    assert main(["train", *RUN, *NOISED, "--rounds", "3", "--out", str(plain)]) == 0
    assert main(["train", *RUN, *NOISED, "--rounds", "3", "--out", str(measured), "--leakage-every", "1",
                 "--leakage-out", str(tmp_path / "t.json"), "--leakage-samples", "32"]) == 0
    capsys.readouterr()
    a, b = _history(plain), _history(measured)
    fields = ("train_loss", "accuracy", "test_loss", "sim_seconds", "metrics")
    assert [[r[f] for f in fields] for r in a["records"]] == [[r[f] for f in fields] for r in b["records"]]
    assert [p["round"] for p in b["meta"][KEY]] == [0, 1, 2, 3]


def test_a_careless_attack_changes_neither_the_model_nor_the_random_streams(tmp_path: Path, monkeypatch) -> None:
    """An attack that draws from torch's, numpy's and Python's generators, moves every weight it is given and leaves
    the model in eval mode: the trace measures a copy with the generators restored, so each generator is where it
    was and the run trains as an unmeasured one."""
    import random

    import numpy as np
    import torch

    import adaptplan.cli.leakage_report as report
    from adaptplan.cli.leakage_trace import LeakageTrace
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    def careless(blocks, *args, **kwargs):
        torch.rand(3), np.random.rand(3), random.random()
        with torch.no_grad():
            for p in blocks.parameters():
                p.add_(1.0)
        blocks.eval()
        return "", {"dcor": [0.5, 0.5]}

    monkeypatch.setattr(report, "leakage_report", careless)
    config = dict(algorithm="sl", dataset="synthetic", model="mlp", devices=2, cuts=[1], batch_size=8, seed=3,
                  rounds=3, progress=False, threads=1, eval_every=1)
    plain = Trainer(TrainConfig.flat(**config)).run()
    trainer = Trainer(TrainConfig.flat(**config))
    states = torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()
    trainer.observers.append(LeakageTrace(trainer, str(tmp_path / "t.json"), 16, 1))   # measures round 0 now
    assert torch.equal(states[0], torch.get_rng_state()) and (states[1] == np.random.get_state()[1]).all()
    assert states[2] == random.getstate()
    measured = trainer.run()
    assert [(r.train_loss, r.accuracy) for r in plain.records] == [(r.train_loss, r.accuracy) for r in measured.records]
    assert [p["round"] for p in measured.meta[KEY]] == [0, 1, 2, 3]


def test_the_table_is_the_worst_of_the_runs_measurements_each_the_attack_on_its_model(tmp_path: Path, capsys) -> None:
    """every = 2 over 3 rounds measures rounds 0, 2 and 3; round 0 is the attack on the model before training and
    round 3 the trained one (profilers.leakage on the same samples), and the table holds each cut's worst."""
    from profilers.leakage import leakage_per_cut
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    table_path = tmp_path / "worst.json"
    assert main(["train", *RUN, "--rounds", "3", "--out", str(tmp_path / "run"), "--leakage-every", "2",
                 "--leakage-out", str(table_path), "--leakage-samples", "48"]) == 0
    err = capsys.readouterr().err
    series = _history(tmp_path / "run")["meta"][KEY]
    assert [(p["round"], p["samples"]) for p in series] == [(0, 48), (2, 48), (3, 48)]
    assert "leakage at round 2: dCor per cut" in err and "the worst of 3 measurements (rounds 0, 2, 3)" in err
    trainer = Trainer(TrainConfig.flat(algorithm="sfl-v1", dataset="synthetic", model="mlp", devices=2, cuts=[1],
                                       batch_size=8, seed=3, rounds=3, progress=False, threads=1, eval_every=1))
    x, y = trainer.dataset.x_train[:48], trainer.dataset.y_train[:48]
    before = leakage_per_cut(trainer.engine.eval_models()[0], x, y)
    trainer.run()
    after = leakage_per_cut(trainer.engine.eval_models()[0], x, y)
    assert series[0]["figures"]["dcor"] == pytest.approx([r.dcor for r in before], rel=1e-9)
    assert series[-1]["figures"]["dcor"] == pytest.approx([r.dcor for r in after], rel=1e-9)
    assert series[0]["figures"]["dcor"] != pytest.approx(series[-1]["figures"]["dcor"], rel=1e-9)
    table = LeakageTable.load(table_path)
    assert table.weights == "worst of rounds 0, 2, 3" and table.samples == 48
    assert figure_path(table_path).read_bytes()[:4] == b"\x89PNG" and f"wrote {figure_path(table_path)}" in err
    for name, values in table.figures.items():
        assert values == [max(p["figures"][name][j] for p in series) for j in range(len(values))]


def test_a_resumed_run_goes_on_with_its_series_and_its_samples(tmp_path: Path, capsys) -> None:
    """A run continued to a longer length measures from where it stopped (not its round 0 again) and its table is the
    worst over both parts; resuming with other samples is refused naming --leakage-samples."""
    run, table_path = tmp_path / "run", tmp_path / "t.json"
    assert main(["train", *RUN, "--rounds", "2", "--out", str(run), "--checkpoint-every", "1", "--leakage-every", "1",
                 "--leakage-out", str(table_path), "--leakage-samples", "32"]) == 0
    assert main(["train", "--resume", "--out", str(run), "--rounds", "3", "--leakage-every", "1",
                 "--leakage-out", str(table_path), "--leakage-samples", "32"]) == 0
    capsys.readouterr()
    series = _history(run)["meta"][KEY]
    assert [p["round"] for p in series] == [0, 1, 2, 3]
    assert LeakageTable.load(table_path).figures["dcor"] == worst_figures([p["figures"] for p in series])["dcor"]
    assert main(["train", "--resume", "--out", str(run), "--rounds", "4", "--leakage-every", "1",
                 "--leakage-out", str(table_path), "--leakage-samples", "16"]) == 2
    err = capsys.readouterr().err
    assert "--leakage-samples" in err and "32 samples" in err and "Traceback" not in err


@pytest.mark.parametrize(("extra", "flag"), [
    (["--leakage-every", "2"], "--leakage-every"),
    (["--leakage-every", "0", "--leakage-out", "t.json"], "--leakage-every"),
])
def test_bad_leakage_every_is_one_message_and_exit_2(extra: list[str], flag: str, capsys) -> None:
    assert main(["train", *RUN, "--rounds", "2", *extra]) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_resumed_run_with_no_round_left_and_no_measurement_writes_no_table(tmp_path: Path, capsys) -> None:
    """A run trained without --leakage-every, resumed at its own length with it: nothing was measured, so no table
    is written and the run says so (rather than a table of no measurement)."""
    run, table_path = tmp_path / "run", tmp_path / "t.json"
    assert main(["train", *RUN, "--rounds", "2", "--out", str(run), "--checkpoint-every", "1"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", "--out", str(run), "--rounds", "2", "--leakage-every", "1",
                 "--leakage-out", str(table_path)]) == 0
    assert "no leakage was measured in this run" in capsys.readouterr().err and not table_path.exists()


def test_distinct_models_keeps_the_first_of_each_equal_group() -> None:
    import torch
    from torch import nn

    from adaptplan.cli.leakage_trace import distinct_models

    torch.manual_seed(0)
    a, b, c = nn.Linear(3, 2), nn.Linear(3, 2), nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())                     # b equals a; c has other weights
    d = nn.Linear(3, 2)
    d.load_state_dict(c.state_dict())
    with torch.no_grad():
        d.bias[1] += 1e-6                                 # one value apart
    assert distinct_models([a, b, c, b, d]) == [a, c, d]
    assert len(distinct_models([nn.Linear(3, 2), nn.Linear(2, 3)])) == 2 and distinct_models([a, a, a]) == [a]


def test_under_psl_every_devices_model_is_attacked_and_the_worst_kept(tmp_path: Path, capsys) -> None:
    """PSL evaluates each device's own client model: before the first round they are one (attacked once); after
    training they differ and each figure is the worst over both (profilers.leakage on each device's model), which
    here is device 1's, not device 0's."""
    from profilers.leakage import leakage_per_cut
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    run = ["--algorithm", "psl", *RUN[2:]]
    assert main(["train", *run, "--rounds", "2", "--out", str(tmp_path / "run"), "--leakage-every", "2",
                 "--leakage-out", str(tmp_path / "t.json"), "--leakage-samples", "48"]) == 0
    err = capsys.readouterr().err
    series = _history(tmp_path / "run")["meta"][KEY]
    assert [(p["round"], p["models"]) for p in series] == [(0, 1), (2, 2)]
    assert "leakage at round 2: dCor per cut" in err and "(the worst of 2 device models)" in err
    assert "leakage at round 0: dCor per cut" in err and "(the worst of 1" not in err
    trainer = Trainer(TrainConfig.flat(algorithm="psl", dataset="synthetic", model="mlp", devices=2, cuts=[1],
                                       batch_size=8, seed=3, rounds=2, progress=False, threads=1, eval_every=1))
    x, y = trainer.dataset.x_train[:48], trainer.dataset.y_train[:48]
    trainer.run()
    per_device = [[r.dcor for r in leakage_per_cut(m, x, y)] for m in trainer.engine.eval_models()]
    worst = [max(column) for column in zip(*per_device)]
    assert series[-1]["figures"]["dcor"] == pytest.approx(worst, rel=1e-9)
    assert per_device[0] != pytest.approx(worst, rel=1e-9)            # device 0's alone would not be the worst


def test_each_cut_takes_its_worst_device_whichever_device_that_is(tmp_path: Path, monkeypatch) -> None:
    """Device 0 leaks most at cut 1, device 1 at cut 2: the measurement holds 0.9 and 0.8, neither device's own."""
    import adaptplan.cli.leakage_report as report
    from adaptplan.cli.leakage_trace import LeakageTrace
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    answers = iter([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]])      # round 0 (one model), then device 0's and device 1's
    monkeypatch.setattr(report, "leakage_report", lambda *args, **kwargs: ("", {"dcor": next(answers)}))
    trainer = Trainer(TrainConfig.flat(algorithm="psl", dataset="synthetic", model="mlp", devices=2, cuts=[1],
                                       batch_size=8, seed=3, rounds=2, progress=False, threads=1, eval_every=1))
    trainer.observers.append(LeakageTrace(trainer, str(tmp_path / "t.json"), 16, 2))
    monkeypatch.setattr("adaptplan.cli.leakage_report.write_leakage_table", lambda *args, **kwargs: None)
    monkeypatch.setattr("adaptplan.cli.leakage_trace.plot_over_rounds", lambda *args, **kwargs: None)
    history = trainer.run()
    assert [(p["round"], p["models"], p["figures"]["dcor"]) for p in history.meta[KEY]] == [
        (0, 1, [0.5, 0.5]), (2, 2, [0.9, 0.8])]
