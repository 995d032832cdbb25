"""``adaptplan bench privacy`` (adaptplan/benches/privacy.py): its defence settings as written, the attack on the
released activations (noise that swamps the activation leaves the attacker less dependence than none; a clip that
never binds changes nothing), the files it writes and its rerun that reads the finished runs back, and one message
naming the flag for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptplan.benches import privacy as bench
from adaptplan.benches.privacy import DefenceSetting, parse_defences
from adaptplan.cli import main
from adaptplan.errors import InputError

TINY = ["bench", "privacy", "--dataset", "synthetic", "--model", "mlp", "--devices", "2", "--rounds", "2",
        "--eval-every", "2", "--seeds", "0", "--cuts", "1", "--workers", "1", "--leakage-samples", "128"]


def test_settings_read_as_written() -> None:
    assert parse_defences("none; clip=2,noise=0.5 ;nopeek=0.25") == [
        DefenceSetting(), DefenceSetting(clip=2.0, noise=0.5), DefenceSetting(nopeek=0.25)]
    assert [d.name for d in parse_defences("none;noise=1,clip=3;nopeek=1")] == ["none", "clip=3,noise=1", "nopeek=1"]
    assert DefenceSetting(clip=3, noise=1).config() == {"activation_clip": 3, "activation_noise": 1, "nopeek": 0.0,
                                                        "label_epsilon": None, "clip_per_value": False, "u_shaped": 0,
                                                        "head_clip": 0.0, "head_noise": 0.0}
    rms = DefenceSetting.parse("noise=1,clip_rms=0.25")
    assert rms == DefenceSetting(clip=0.25, noise=1.0, clip_per_value=True) and rms.name == "clip_rms=0.25,noise=1"
    assert DefenceSetting.parse(rms.name) == rms and rms.config()["clip_per_value"] is True
    assert DefenceSetting.parse("labels=2").name == "labels=2" and DefenceSetting.parse("labels=2").labels == 2.0
    for bad, words in (("noise=1", "needs a clip"), ("clip=x", "must be a number"), ("size=1", "is not"),
                       ("clip=-1", "≥ 0"), ("", "at least one"), ("clip=1,clip_rms=1", "not both"),
                       ("clip_rms=0,noise=1", "needs a clip")):
        with pytest.raises(InputError, match=words) as info:
            parse_defences(bad)
        assert info.value.field == "--defences"


def test_the_bench_attacks_the_released_activations_and_reads_finished_runs_back(tmp_path: Path, monkeypatch,
                                                                               capsys) -> None:
    out = tmp_path / "bench"
    argv = [*TINY, "--defences", "none;clip=1000;clip=1,noise=100", "--out", str(out)]
    assert main(argv) == 0
    first = capsys.readouterr().out
    rows = {r["defence"]: r["mean"] for r in json.loads((out / "results.json").read_text())["rows"]}
    assert list(rows) == ["none", "clip=1000", "clip=1,noise=100"]
    assert rows["clip=1000"]["dcor"] == rows["none"]["dcor"]              # a clip that never binds changes nothing
    # noise 100× the clip swamps the activation: the dCor of inputs and independent noise of the activation's shape
    # (the V-statistic's bias at 128 samples, about 0.70 here), well below the undefended figure
    assert abs(rows["clip=1,noise=100"]["dcor"] - _independent_dcor()) < 0.02 < rows["none"]["dcor"] - 0.2
    assert rows["clip=1,noise=100"]["epsilon"] > 0 and rows["none"]["epsilon"] is None
    assert (out / "table.txt").read_text().strip() == first.strip() and (out / "tradeoff.png").stat().st_size > 0
    import trainers.run.driver as driver

    from adaptplan.benches.privacy import RESULT_FILE

    for saved in (out / "runs").rglob(RESULT_FILE):                       # as saved before clip_per_value existed
        content = json.loads(saved.read_text())
        del content["config"]["clip_per_value"]
        saved.write_text(json.dumps(content))
    monkeypatch.setattr(driver, "Trainer", None)                          # a rerun trains nothing
    assert main(argv) == 0
    assert capsys.readouterr().out == first
    monkeypatch.undo()
    before = {r["defence"]: r["mean"]["sim_seconds"] for r in json.loads((out / "results.json").read_text())["rows"]}
    assert main([*argv, "--rounds", "4"]) == 0                              # another setting: trained again, longer
    after = {r["defence"]: r["mean"]["sim_seconds"] for r in json.loads((out / "results.json").read_text())["rows"]}
    assert all(after[k] > before[k] for k in before)


def _independent_dcor() -> float:
    """dCor of the first 128 synthetic training inputs and standard normal noise shaped as the mlp's cut-1 activation
    (mean of 5 draws)."""
    import torch

    from profilers import build_chain
    from profilers.leakage import distance_correlation
    from trainers.inputs.datasets import load_dataset
    from trainers.inputs.models import build_model

    data = load_dataset("synthetic")
    x = data.x_train[:128]
    width = build_chain(build_model("mlp", tuple(x.shape[1:]), data.num_classes), x[:2]).blocks[0](x).shape[1]
    g = torch.Generator().manual_seed(0)
    return sum(distance_correlation(x, torch.randn(128, width, generator=g)) for _ in range(5)) / 5


@pytest.mark.parametrize("argv, flag", [
    (["--defences", "noise=1"], "--defences"),
    (["--cuts", "9"], "--cuts"),
    (["--seeds", "a"], "--seeds"),
    (["--algorithm", "nope"], "--algorithm"),
])
def test_bad_bench_privacy_flags_are_one_message_and_exit_2(argv: list[str], flag: str, capsys) -> None:
    assert main([*TINY, *argv]) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_u_shaped_setting_runs_at_the_cuts_its_head_leaves_and_sees_the_plain_runs_leakage(
        tmp_path: Path, capsys) -> None:
    """SplitFed V1 trains the same model with its head on the devices (tests/trainers/engine/test_u_shaped.py), so the
    attacker measures the same figures at the cut and the same accuracy; the run is longer (the head's exchange). The
    mlp's 3 blocks leave head=1 cut 1 only: cut 2 is left out with a note, and a setting left no cut is refused."""
    out = tmp_path / "bench"
    argv = [*TINY[:-6], "--workers", "1", "--leakage-samples", "128", "--cuts", "1,2", "--defences", "none;head=1",
            "--out", str(out)]
    assert main(argv) == 0
    assert "note: head=1 runs at cuts [1] only" in capsys.readouterr().err
    rows = {(r["cut"], r["defence"]): r["mean"] for r in json.loads((out / "results.json").read_text())["rows"]}
    assert set(rows) == {(1, "none"), (1, "head=1"), (2, "none")}
    plain, shaped = rows[(1, "none")], rows[(1, "head=1")]
    for figure in ("accuracy", "dcor", "norm_auc", "direction_auc"):
        assert shaped[figure] == plain[figure], figure
    assert shaped["sim_seconds"] > plain["sim_seconds"]
    assert main([*TINY, "--defences", "head=1", "--cuts", "2"]) == 2
    assert "--defences: head=1 keeps 1 of the model's 3 blocks on the device: it runs at cuts 1..1" in capsys.readouterr().err


def test_under_a_head_the_attack_also_reads_the_gradient_at_the_heads_input() -> None:
    """attack() on a U-shaped run's model with noise on its head's gradients: the direction AUC at the run's cut and at
    the head's input (cut L − K), as profilers.leakage measures them on the evaluated model from the released rows
    (the attacker's view drawn from the same seeds, in the same order)."""
    from profilers.leakage import leakage_per_cut
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    trainer = Trainer(TrainConfig.flat(algorithm="sfl-v1", dataset="synthetic", model="mlp", devices=2, rounds=1,
                                       cuts=(1,), u_shaped=1, head_clip=0.05, head_noise=1.0, threads=1, progress=False,
                                       eval_every=1, seed=3))
    trainer.run()
    out = bench.attack(trainer, 1, 64)
    model = trainer.engine.eval_models()[0]
    x, y = trainer.dataset.x_train[:64], trainer.dataset.y_train[:64]
    view = trainer.engine.defence.attacker_view(y, 2 ** 31 - 1 - 3, [3, 2 ** 31 - 1])
    at_cut, at_head = leakage_per_cut(model, x, y, cuts=[1, 2], head=(2, view.gradient))
    assert (out["direction_auc"], out["head_direction_auc"]) == (at_cut.direction_auc, at_head.direction_auc)
    assert at_cut.direction_auc != at_head.direction_auc


def test_a_stopped_run_continues_from_its_checkpoint_and_is_attacked_as_the_uninterrupted_one(tmp_path: Path) -> None:
    """A SIGTERM after round 2 of 4 leaves a checkpoint (one at every evaluation, every 2 rounds) and no figures; the
    next call trains rounds 3 and 4 only and gives the uninterrupted run's figures, every one of them."""
    import os
    import signal

    from trainers.run.driver import Trainer
    from trainers.run.folder import Interrupted

    base = dict(algorithm="sfl-v1", dataset="synthetic", model="mlp", devices=2, rounds=4, eval_every=2,
                batch_size=8, threads=1, max_test_samples=50)
    (job,) = bench.privacy_jobs(base, [1], parse_defences("clip=1,noise=0.5"), [0], 64, tmp_path / "bench")
    straight = bench.privacy_run({**job, "folder": None})
    real_round = Trainer._round

    def stop_after_round_2(self, t, out, wall):
        record = real_round(self, t, out, wall)
        if t == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return record

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "_round", stop_after_round_2)
        with pytest.raises(Interrupted, match="after round 2"):
            bench.privacy_run(job)
    folder = Path(job["folder"])
    assert (folder / "checkpoint.pt").exists() and not (folder / bench.RESULT_FILE).exists()
    assert "checkpoint-every = 2\n" in (folder / "config.toml").read_text()     # also where a kill gives no warning
    trained = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "_round", lambda self, t, out, wall: trained.append(t) or real_round(self, t, out, wall))
        resumed = bench.privacy_run(job)
    assert trained == [3, 4] and resumed == straight
    assert json.loads((folder / bench.RESULT_FILE).read_text())["figures"] == straight
    other = {**job, "config": {**job["config"], "lr": 0.05}}     # the folder's run ended with another setting:
    assert bench.privacy_run(other) == bench.privacy_run({**other, "folder": None})      # trained afresh


def test_under_psl_the_bench_attacks_every_devices_model_and_keeps_each_figures_worst() -> None:
    """PSL evaluates each device's own client model: the bench's figures are, per figure, the worst of the attack on
    each (here device 1's dCor, not device 0's), the attack on one model written out by attack_model."""
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    trainer = Trainer(TrainConfig.flat(algorithm="psl", dataset="synthetic", model="mlp", devices=2, cuts=[1],
                                       batch_size=8, seed=3, rounds=2, progress=False, threads=1, eval_every=1))
    trainer.run()
    models = trainer.engine.eval_models()
    each = [bench.attack_model(trainer, m, 1, 48) for m in models]
    assert len(models) == 2 and each[0] != each[1]
    out = bench.attack(trainer, 1, 48)
    assert out == {k: max(p[k] for p in each) for k in each[0]} and out["dcor"] != each[0]["dcor"]
