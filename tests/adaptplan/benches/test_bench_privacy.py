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


def test_on_images_the_attack_adds_the_inversion_of_the_released_activations() -> None:
    """On image data (CIFAR-10 subset, 3×32×32: at least the SSIM window) the figures hold the inversion attacker's
    MSE, PSNR and SSIM at the cut, those of profilers.inversion.invert_per_cut on the same samples (written out here);
    on 8×8 inputs (below the window) none."""
    from profilers.inversion import invert_per_cut
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    trainer = Trainer(TrainConfig.flat(algorithm="sfl-v1", dataset="cifar10-subset", model="cnn", model_width=4,
                                       devices=2, cuts=[2], batch_size=8, seed=1, rounds=1, progress=False, threads=1))
    model = trainer.engine.eval_models()[0]
    out = bench.attack_model(trainer, model, 2, 32)
    data = trainer.dataset
    (rec,), _ = invert_per_cut(model, data.x_test[:32], data.x_train[:32], data.mean, data.std,
                               release=trainer.engine.defence.attacker_view(
                                   data.y_train[:32], 2 ** 31 - 2, [1, 2 ** 31 - 1]).release, cuts=[2])
    assert (out["mse"], out["psnr"], out["ssim"]) == (rec.mse, rec.psnr, rec.ssim) and 0 < out["ssim"] < 1
    small = Trainer(TrainConfig.flat(algorithm="sfl-v1", dataset="synthetic", model="mlp", devices=2, cuts=[1],
                                     batch_size=8, seed=1, rounds=1, progress=False, threads=1))
    assert not {"mse", "psnr", "ssim"} & set(bench.attack_model(small, small.engine.eval_models()[0], 1, 32))


def _row(cut: int, defence: str, seeds: int = 3, **figures: tuple[float, float]) -> bench.PrivacyRow:
    """A table row over ``seeds`` seeds with the (mean, s.d.) of each figure given, None for the others."""
    mean = {name: figures[name][0] if name in figures else None for name in bench.FIGURES}
    std = {name: figures[name][1] if name in figures else None for name in bench.FIGURES}
    return bench.PrivacyRow(cut, defence, seeds, mean, std)


def test_the_table_prints_each_mean_with_its_spread_in_the_figures_units() -> None:
    """Three seeds: mean ± s.d., accuracy in percent (0.401 ± 0.014 → 40.1 ± 1.4), a zero spread as "± 0"; one seed:
    the value alone; a figure no seed has: "-". The defence column is left-aligned and every other right-aligned
    under its name, a rule under the names; the head's columns only where a row has the head's figure."""
    rows = [_row(1, "none", 3, accuracy=(0.401, 0.014), sim_seconds=(2869.78, 0.0), dcor=(0.97511, 0.00088),
                ssim=(0.3867, 0.0031)),
            _row(8, "clip=4,noise=1", 1, accuracy=(0.285, 0.0), sim_seconds=(1212.0, 0.0), epsilon=(3.7512, 0.0))]
    lines = bench.table(rows, "HEAD").splitlines()
    assert lines[:2] == ["HEAD", ""] and len(lines) == 6
    names, rule, first, second = lines[2:]
    assert set(rule) == {"-", " "} and len({len(names), len(rule), len(first), len(second)}) == 1
    cells = [line.split("  ") for line in (first, second)]
    assert [c.strip() for c in cells[0] if c.strip()] == ["1", "none", "40.1 ± 1.4", "2870 ± 0", "-", "0.975 ± 0.001",
                                                          "-", "-", "-", "0.387 ± 0.003"]
    assert [c.strip() for c in cells[1] if c.strip()] == ["8", "clip=4,noise=1", "28.5", "1212", "3.75", "-", "-",
                                                          "-", "-", "-"]
    assert first.index("none") == names.index("defence") == second.index("clip=4,noise=1")          # left-aligned
    for name, value, line in (("test acc. %", "40.1 ± 1.4", first), ("SSIM", "0.387 ± 0.003", first),
                              ("ε (δ = 1e-5)", "3.75", second)):                                        # right-aligned
        assert line.index(value) + len(value) == names.index(name) + len(name)
    assert "head" not in names
    with_head = bench.table([_row(3, "head=1", 1, accuracy=(0.4, 0.0), head_direction_auc=(0.81, 0.0))], "H")
    assert with_head.splitlines()[2].endswith("head ε  head-input dir. AUC") and with_head.split()[-2:] == ["-", "0.810"]


def test_the_tradeoff_draws_each_row_at_its_leakage_and_accuracy(tmp_path: Path, monkeypatch) -> None:
    """Per leakage figure a panel: each row with that figure and an accuracy is a point (figure, accuracy in %) with
    its s.d. as error bars, its defence's colour (tab10, in first-seen order), its cut's marker, and a size growing
    with its simulated time (5 + 7·t / the largest t); a row without the figure or without accuracy is left out."""
    import matplotlib.pyplot as plt

    from tests.plot_checks import spy_figures

    rows = [_row(1, "none", accuracy=(0.401, 0.014), sim_seconds=(2870.0, 0.0), psnr=(17.8, 0.04), dcor=(0.975, 0.001),
                direction_auc=(0.86, 0.01)),
            _row(8, "clip=4,noise=1", accuracy=(0.285, 0.02), sim_seconds=(1212.0, 0.0), dcor=(0.606, 0.002),
                direction_auc=(1.0, 0.0)),
            _row(1, "labels=2", accuracy=(0.267, 0.022), dcor=(0.976, 0.002), direction_auc=(0.503, 0.016)),
            _row(8, "labels=2", sim_seconds=(1212.0, 0.0), dcor=(0.785, 0.011))]          # no accuracy: not drawn
    figures = spy_figures(monkeypatch)
    bench.plot(rows, tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    (fig,) = figures
    assert [ax.get_xlabel() for ax in fig.axes] == ["inversion PSNR (dB, higher: more leaked)",
                                                    "dCor(inputs, released activations)",
                                                    "label inference AUC (direction)"]
    colour = [plt.get_cmap("tab10")(k) for k in range(3)]

    def points(ax) -> list[tuple]:
        return [(float(c.lines[0].get_xdata()[0]), float(c.lines[0].get_ydata()[0]), c.lines[0].get_marker(),
                 c.lines[0].get_color(), c.lines[0].get_markersize()) for c in ax.containers]

    big, mid, small = 12.0, 5 + 7 * 1212.0 / 2870.0, 5.0
    assert points(fig.axes[0]) == [(17.8, 40.1, "o", colour[0], big)]
    assert points(fig.axes[1]) == [(0.975, 40.1, "o", colour[0], big), (0.606, pytest.approx(28.5), "s", colour[1], mid),
                                   (0.976, pytest.approx(26.7), "o", colour[2], small)]
    assert [p[0] for p in points(fig.axes[2])] == [0.86, 1.0, 0.503]
    x_bar, y_bar = fig.axes[1].containers[0].lines[2]                       # the first row's error bars
    assert [[tuple(p) for p in s] for s in x_bar.get_segments()] == [[pytest.approx((0.974, 40.1)),
                                                                       pytest.approx((0.976, 40.1))]]
    assert [[tuple(p) for p in s] for s in y_bar.get_segments()] == [[pytest.approx((0.975, 38.7)),
                                                                       pytest.approx((0.975, 41.5))]]
    legend = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
    assert legend == ["none", "clip=4,noise=1", "labels=2", "cut 1", "cut 8"]
    bench.plot([_row(1, "none", accuracy=(0.4, 0.0), sim_seconds=(0.5, 0.0), dcor=(0.9, 0.0)),   # runs under 1 s
                _row(2, "none", accuracy=(0.4, 0.0), sim_seconds=(0.25, 0.0), dcor=(0.8, 0.0))], tmp_path / "s.png")
    assert [p[-1] for p in points(figures[-1].axes[0])] == [12.0, 8.5]
