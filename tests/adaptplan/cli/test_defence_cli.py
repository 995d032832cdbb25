"""A defence setting from the command line (adaptplan/defence_cost.py ``DefenceSetting``): ``profile --leakage
--leakage-defence`` measures the released activations and names the setting in its leakage table, ``plan --defence``
charges the defence's FLOPs (eqs. 16, 21) and plans only with a table measured under the same setting; bad input is
one message naming the flag (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptplan.cli import main
from adaptplan.defence_cost import DefenceSetting
from adaptplan.latency import LatencyModel
from adaptplan.leakage_table import LeakageTable
from adaptplan.model_profile import ModelProfile
from adaptplan.plan import Plan
from adaptplan.system import generate_system

PROFILE = ["profile", "mlp", "--input", "1x8x8"]


def test_a_noised_leakage_table_names_its_setting_and_leaks_less_than_the_plain_one(tmp_path: Path) -> None:
    for name, setting in (("plain", "none"), ("noised", "clip=1,noise=50")):
        assert main([*PROFILE, "--leakage", "--dataset", "synthetic", "--leakage-samples", "128", "--leakage-defence",
                     setting, "--leakage-out", str(tmp_path / f"{name}.json")]) == 0
    plain, noised = (LeakageTable.load(tmp_path / f"{k}.json") for k in ("plain", "noised"))
    assert (plain.defence, noised.defence) == ("none", "clip=1,noise=50")
    assert all(n < p for n, p in zip(noised.figures["dcor"], plain.figures["dcor"]))
    legacy = {k: v for k, v in json.loads((tmp_path / "plain.json").read_text()).items() if k != "defence"}
    (tmp_path / "legacy.json").write_text(json.dumps(legacy))
    assert LeakageTable.load(tmp_path / "legacy.json").defence == "none"     # a table written before the field


def test_a_clip_per_value_is_attacked_as_the_bound_it_stands_for_at_each_cut(tmp_path: Path) -> None:
    """``clip_rms=c`` at cut j releases as ``clip=c·√d_j`` (d_j the values a sample sends there): the attacker's
    figures agree cut by cut, and the table names the per-value setting."""
    assert main([*PROFILE, "-o", str(tmp_path / "profile.json")]) == 0
    profile = ModelProfile.load(tmp_path / "profile.json")
    widths = [int(v) for v in (profile.psi / profile.bits_per_value)[:-1]]     # d_j at the interior cuts
    common = [*PROFILE, "--leakage", "--dataset", "synthetic", "--leakage-samples", "64", "--leakage-defence"]
    # c = 1: c·√d = 11.3 lies above every sample's norm at both cuts (at most 7.8 here), C = 1 below every one, so
    # the two bounds release differently (a clip that binds at both would release the same up to scale)
    assert main([*common, "clip_rms=1,noise=0.3", "--leakage-out", str(tmp_path / "rms.json")]) == 0
    assert main([*common, "clip=1,noise=0.3", "--leakage-out", str(tmp_path / "per_sample.json")]) == 0
    rms, per_sample = LeakageTable.load(tmp_path / "rms.json"), LeakageTable.load(tmp_path / "per_sample.json")
    assert rms.defence == "clip_rms=1,noise=0.3"
    for j, d in enumerate(widths, 1):
        out = tmp_path / f"cut{j}.json"
        assert main([*common, f"clip={d ** 0.5!r},noise=0.3", "--leakage-out", str(out)]) == 0
        assert LeakageTable.load(out).figures["dcor"][j - 1] == pytest.approx(rms.figures["dcor"][j - 1], rel=1e-6)
        assert abs(per_sample.figures["dcor"][j - 1] - rms.figures["dcor"][j - 1]) > 0.01


def test_plan_charges_the_defence_and_checks_the_tables_setting(tmp_path: Path, capsys) -> None:
    assert main([*PROFILE, "-o", str(tmp_path / "p.json")]) == 0
    system = generate_system(4, 3)
    system.save(tmp_path / "s.json")
    common = ["plan", "--profile", str(tmp_path / "p.json"), "--system", str(tmp_path / "s.json"), "--json"]
    assert main([*common, "--cuts", "1", "-o", str(tmp_path / "plain.json")]) == 0
    assert main([*common, "--cuts", "1", "--defence", "clip=1,nopeek=0.5", "-o", str(tmp_path / "nopeek.json")]) == 0
    capsys.readouterr()
    profile = ModelProfile.load(tmp_path / "p.json")
    charged = DefenceSetting(clip=1.0, nopeek=0.5).charged(profile, system.batch_size)
    plain, nopeek = Plan.load(tmp_path / "plain.json"), Plan.load(tmp_path / "nopeek.json")
    assert nopeek.round_latency_s == pytest.approx(LatencyModel(charged, system).t_split([1] * 4), rel=1e-9)
    assert nopeek.round_latency_s > plain.round_latency_s == pytest.approx(
        LatencyModel(profile, system).t_split([1] * 4), rel=1e-9)
    assert main([*PROFILE, "--leakage", "--dataset", "synthetic", "--leakage-samples", "32",
                 "--leakage-out", str(tmp_path / "leak.json")]) == 0
    capsys.readouterr()
    assert main([*common, "--leakage-table", str(tmp_path / "leak.json"), "--max-leakage", "dcor=1",
                 "--defence", "clip=1,noise=1"]) == 2
    err = capsys.readouterr().err
    assert "--defence" in err and "'none'" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv, flag", [
    (["plan", "--defence", "noise=1"], "--defence"),
    (["plan", "--defence", "labels=1"], "--defence"),
    ([*PROFILE, "--leakage", "--dataset", "synthetic", "--leakage-defence", "nopeek=1"], "--leakage-defence"),
    ([*PROFILE, "--leakage-defence", "clip=1"], "--leakage-defence"),
])
def test_bad_defence_settings_are_one_message_and_exit_2(argv: list[str], flag: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_run_writes_its_trained_models_leakage_table_and_plan_budgets_with_it(tmp_path: Path, capsys) -> None:
    """train --leakage-out: the trained model's figures at every cut under the run's defence, named as `plan
    --defence` names it, at the trained weights; the table is the attack on the run's evaluated model written out
    (profilers.leakage on the same samples), and plan takes it."""
    from profilers.leakage import leakage_per_cut
    from trainers.config.train_config import TrainConfig
    from trainers.run.driver import Trainer

    run = ["--algorithm", "sfl-v1", "--dataset", "synthetic", "--model", "mlp", "--devices", "2", "--cuts", "1",
           "--batch-size", "8", "--seed", "3", "--rounds", "3", "--no-progress", "--threads", "1", "--nopeek", "0.5"]
    table_path = tmp_path / "trained.json"
    assert main(["train", *run, "--leakage-out", str(table_path), "--leakage-samples", "64"]) == 0
    capsys.readouterr()
    table = LeakageTable.load(table_path)
    assert (table.defence, table.weights, table.samples) == ("nopeek=0.5", "trained, round 3", 64)
    trainer = Trainer(TrainConfig.flat(algorithm="sfl-v1", dataset="synthetic", model="mlp", devices=2, cuts=[1],
                                       batch_size=8, seed=3, rounds=3, progress=False, threads=1, nopeek=0.5))
    trainer.run()
    rows = leakage_per_cut(trainer.engine.eval_models()[0], trainer.dataset.x_train[:64], trainer.dataset.y_train[:64])
    assert table.figures["dcor"] == pytest.approx([r.dcor for r in rows], rel=1e-9)
    assert table.figures["direction_auc"] == pytest.approx([r.direction_auc for r in rows], rel=1e-9)
    assert main(["profile", "mlp", "--input", "1x8x8", "-o", str(tmp_path / "p.json")]) == 0
    capsys.readouterr()
    assert main(["plan", "--profile", str(tmp_path / "p.json"), "--devices", "2", "--defence", "nopeek=0.5",
                 "--leakage-table", str(table_path), "--max-leakage", f"dcor={max(table.figures['dcor'])}"]) == 0
    assert "(trained, round 3 weights)" in capsys.readouterr().out
    assert main(["train", *run, "--runtime", "torch", "--leakage-out", str(table_path)]) == 2
    assert "--leakage-out" in capsys.readouterr().err
