"""A run planned on constants estimated from itself and fitted to pilot runs (``--pilots``, docs/model.md §10): what it
records and says, that ``adaptplan plan --pilots`` plans the same, and the refusals, on tiny synthetic runs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from adaptplan.calibration import calibrate
from adaptplan.cli import main
from adaptplan.errors import InputError
from trainers.config.train_config import TrainConfig
from trainers.run.driver import Trainer
from trainers.run.estimation import run_constants
from trainers.run.pilots import read_pilot

torch.set_num_threads(1)

SMALL = dict(dataset="synthetic", model="mlp", devices=2, batch_size=8, eval_every=1, threads=1, lr=0.05,
             max_test_samples=100, progress=False)
TARGET = 0.4


@pytest.fixture(scope="module")
def pilots(tmp_path_factory) -> list[str]:
    """Two finished runs of the setting: every device at cut 1 with I = 1, at cut 2 with I = 4 (both pass 40 %)."""
    root = tmp_path_factory.mktemp("pilots")
    folders = []
    for cut, interval in ((1, 1), (2, 4)):
        folder = str(root / f"cut{cut}-I{interval}")
        Trainer(TrainConfig.flat(**SMALL, rounds=8, cuts=(cut,), interval=interval, out=folder)).run()
        folders.append(folder)
    return folders


def test_the_run_plans_on_its_own_constants_fitted_to_the_pilots_and_says_what_it_predicted(pilots, tmp_path) -> None:
    config = TrainConfig.flat(**SMALL, rounds=8, pilots=",".join(pilots), target_accuracy=TARGET, out=str(tmp_path / "r"))
    trainer = Trainer(config)
    # the fit, computed here from its parts: the run's constants estimated on its initial model, the pilots read back
    estimated = run_constants(trainer.run_data, trainer.blocks, 0, epsilon=1.0)
    fit = calibrate(estimated, [read_pilot(p, TARGET) for p in pilots], 2)
    assert trainer.constants == fit.constants and trainer.calibration == fit
    event = trainer.history.events[0]
    assert event["source"] == "planner"
    assert trainer.describe_plan().endswith(
        f"predicted {event['plan']['rounds']} rounds, {event['plan']['total_latency_s']:.4g} simulated s to 40.0% test "
        f"accuracy (eq. 26, calibrated on 2 pilots: {fit.message})")
    history = trainer.run()
    assert history.meta["calibration"] == json.loads(json.dumps(fit.to_json()))
    found = history.summary(TARGET)["to_target"]
    assert found["predicted_rounds"] == event["plan"]["rounds"]
    assert found["predicted_seconds"] == event["plan"]["total_latency_s"]
    assert found["measured_over_predicted"] == pytest.approx(found["seconds"] / found["predicted_seconds"])
    saved = json.loads((tmp_path / "r" / "history.json").read_text())
    assert saved["summary"]["to_target"] == json.loads(json.dumps(found))


def test_plan_with_pilots_plans_what_the_run_plans(pilots, tmp_path, capsys) -> None:
    config = TrainConfig.flat(**SMALL, rounds=8, pilots=",".join(pilots), target_accuracy=TARGET)
    event = Trainer(config).history.events[0]
    assert main(["plan", "--pilots", ",".join(pilots), "--target-accuracy", str(TARGET), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["cuts"], plan["interval"], plan["rounds"]) == (event["cuts"], event["interval"], event["plan"]["rounds"])
    assert plan["total_latency_s"] == pytest.approx(event["plan"]["total_latency_s"], rel=1e-12)
    assert main(["plan", "--pilots", ",".join(pilots), "--target-accuracy", str(TARGET)]) == 0
    text = capsys.readouterr().out
    assert f"rounds R = {plan['rounds']:,} (to 40.0% test accuracy, Corollary 1 calibrated)" in text
    assert f"the setting of {pilots[0]}" in text


@pytest.mark.parametrize("argv, flag, words", [
    (["--target-accuracy", "0.4"], "--target-accuracy", "goes with pilot runs: add --pilots"),
    (["--rounds-law", "linear"], "--rounds-law", "--rounds-law linear goes with pilot runs"),
    (["--pilots", "PILOTS"], "--pilots", "give --target-accuracy A"),
    (["--pilots", "PILOTS", "--target-accuracy", "0.4", "--epsilon", "0.5"], "--epsilon", "the pilots' run gives"),
    (["--pilots", "PILOTS,nowhere", "--target-accuracy", "0.4"], "--pilots", "'nowhere' holds no history.json"),
])
def test_plan_refuses_pilots_it_cannot_use_in_one_line_exit_2(pilots, argv, flag, words, capsys) -> None:
    argv = [a.replace("PILOTS", ",".join(pilots)) for a in argv]
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"adaptplan plan: error: {flag}: ") and words in err and len(err.splitlines()) == 1


def test_a_run_refuses_pilots_it_cannot_use(pilots, tmp_path) -> None:
    joined = ",".join(pilots)
    cases = [(dict(pilots=joined), "pilots", "give --target-accuracy A"),
             (dict(pilots=joined, target_accuracy=TARGET, cuts=(1,)), "pilots", "cuts leaves nothing to calibrate"),
             (dict(pilots=" , ", target_accuracy=TARGET), "pilots", "must name at least one run folder"),
             (dict(pilots=joined, target_accuracy=TARGET, lr=0.1), "--pilots", "trained with lr = 0.05, this run with 0.1"),
             (dict(pilots=joined, target_accuracy=0.99), "--pilots", "never reached 99.0% test accuracy"),
             (dict(rounds_law="linear"), "rounds_law", "a rounds law is fitted to pilot runs"),
             (dict(pilots=joined, target_accuracy=TARGET, rounds_law="linear", reestimate=True, replan_every=4),
              "rounds_law", "drop --reestimate"),
             (dict(pilots=joined, target_accuracy=TARGET, rounds_law="linear", policy="rma+ms"), "rounds_law",
              "drop --policy rma+ms"),
             (dict(pilots=pilots[0], target_accuracy=TARGET, rounds_law="linear"), "--pilots",
              "needs pilots at two intervals at least, got [1]"),
             (dict(pilots=joined, target_accuracy=TARGET, rounds_law="quadratic"), "rounds_law", "eq15")]
    for extra, field, words in cases:
        with pytest.raises(InputError) as info:
            Trainer(TrainConfig.flat(**{**SMALL, "rounds": 8, **extra}))
        assert info.value.field == field and words in info.value.message


def test_train_says_the_measured_beside_the_predicted_at_the_end(pilots, tmp_path, capsys) -> None:
    assert main(["train", "--dataset", "synthetic", "--model", "mlp", "--devices", "2", "--batch-size", "8",
                 "--lr", "0.05", "--rounds", "8", "--eval-every", "1", "--max-test-samples", "100", "--threads", "1",
                 "--no-progress", "--pilots", ",".join(pilots), "--target-accuracy", "0.4",
                 "--out", str(tmp_path / "r")]) == 0
    captured = capsys.readouterr()
    found = json.loads(captured.out)["to_target"]
    line = next(line for line in captured.err.splitlines() if line.startswith("to 40.0% test accuracy: "))
    assert f"predicted {found['predicted_rounds']} rounds, {found['predicted_seconds']:.4g} s" in line
    assert f"{found['rounds']:.4g} rounds" in line and f"(measured/predicted {found['measured_over_predicted']:.2f})" in line


def test_the_linear_rounds_law_is_fitted_to_the_pilots_alone_and_train_plan_and_planner_plan_the_same(
        pilots, tmp_path, capsys) -> None:
    from adaptplan.linear_rounds import as_plan, fit_linear_rounds, plan_linear_rounds
    from adaptplan.planner import Planner

    config = TrainConfig.flat(**SMALL, rounds=8, pilots=",".join(pilots), target_accuracy=TARGET, rounds_law="linear",
                              out=str(tmp_path / "r"))
    trainer = Trainer(config)
    law = fit_linear_rounds([read_pilot(p, TARGET) for p in pilots])       # the line through the two pilots
    assert trainer.calibration == law and trainer.constants is None         # nothing estimated
    expected = as_plan(plan_linear_rounds(law, trainer.profile, trainer.clock.system(1)), law, trainer.profile,
                       trainer.clock.system(1))
    event = trainer.history.events[0]
    assert (event["cuts"], event["interval"]) == (list(expected.cuts), expected.interval)
    assert event["plan"]["rounds"] == expected.rounds and event["plan"]["solver"]["method"] == "linear-rounds"
    assert trainer.describe_plan().endswith(f"to 40.0% test accuracy (eq. 26, calibrated on 2 pilots: {law.message})")
    history = trainer.run()
    assert history.meta["calibration"]["law"] == "linear" and history.meta["calibration"]["kappa"] == law.kappa
    found = history.summary(TARGET)["to_target"]
    assert found["predicted_seconds"] == pytest.approx(expected.total_latency_s)
    # `adaptplan plan --pilots ... --rounds-law linear` plans the same, and so does the Planner API
    assert main(["plan", "--pilots", ",".join(pilots), "--target-accuracy", str(TARGET), "--rounds-law", "linear",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["cuts"], plan["interval"], plan["rounds"]) == (event["cuts"], event["interval"], event["plan"]["rounds"])
    assert main(["plan", "--pilots", ",".join(pilots), "--target-accuracy", str(TARGET), "--rounds-law", "linear"]) == 0
    text = capsys.readouterr().out
    assert "(to 40.0% test accuracy, the rounds law linear in I)" in text and "rounds linear in I" in text
    planner = Planner(trainer.profile, trainer.clock.system(1))
    assert planner.calibrate([read_pilot(p, TARGET) for p in pilots], law="linear") == law
    api = planner.plan()
    assert (list(api.cuts), api.interval, api.rounds) == (event["cuts"], event["interval"], event["plan"]["rounds"])
    other = planner.evaluate([1, 1], 3)                                         # a given plan, scored by the law
    assert other.rounds == math.ceil(law.rounds(3) * (1 - 1e-12)) and other.solver["rounds_law"] == "linear"
    prediction = planner.predict(api)
    assert (prediction.rounds, prediction.target_accuracy) == (api.rounds, TARGET)
    with pytest.raises(InputError) as info:
        planner.calibrate([read_pilot(p, TARGET) for p in pilots], law="cubic")
    assert info.value.field == "law" and "eq15, linear" in info.value.message


def test_the_rounds_law_per_cut_is_fitted_to_pilots_at_each_cut_and_train_plan_and_planner_plan_the_same(
        pilots, tmp_path, capsys) -> None:
    """Pilots: cut 1 at I = 1, cut 2 at I = 4 (the module's) and cut 2 at I = 1: cut 1 known at I = 1 only, cut 2 its
    own line across I = 1..4."""
    from adaptplan.linear_rounds import as_plan, fit_per_cut_rounds
    from adaptplan.planner import Planner

    third = str(tmp_path / "cut2-I1")
    Trainer(TrainConfig.flat(**SMALL, rounds=8, cuts=(2,), interval=1, out=third)).run()
    folders = [*pilots, third]
    law = fit_per_cut_rounds([read_pilot(p, TARGET) for p in folders])
    assert law.intervals == {1: (1, 1), 2: (1, 4)}
    config = TrainConfig.flat(**SMALL, rounds=8, pilots=",".join(folders), target_accuracy=TARGET, rounds_law="per-cut",
                              out=str(tmp_path / "r"))
    trainer = Trainer(config)
    assert trainer.calibration == law and trainer.constants is None
    system = trainer.clock.system(1)
    expected = as_plan(law.plan(trainer.profile, system), law, trainer.profile, system)
    event = trainer.history.events[0]
    assert (event["cuts"], event["interval"]) == (list(expected.cuts), expected.interval)
    assert set(event["cuts"]) <= {1, 2} and event["plan"]["solver"]["method"] == "per-cut-rounds"
    assert trainer.run().meta["calibration"]["law"] == "per-cut"
    assert main(["plan", "--pilots", ",".join(folders), "--target-accuracy", str(TARGET), "--rounds-law", "per-cut",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["cuts"], plan["interval"], plan["rounds"]) == (event["cuts"], event["interval"], event["plan"]["rounds"])
    assert main(["plan", "--pilots", ",".join(folders), "--target-accuracy", str(TARGET), "--rounds-law", "per-cut"]) == 0
    assert "the rounds law linear in I per cut" in capsys.readouterr().out
    planner = Planner(trainer.profile, system)
    assert planner.calibrate([read_pilot(p, TARGET) for p in folders], law="per-cut") == law
    api = planner.plan()
    assert (list(api.cuts), api.interval, api.rounds) == (event["cuts"], event["interval"], event["plan"]["rounds"])
    other = planner.evaluate([2, 2], 3)                                        # cut 2's own line at I = 3
    assert other.rounds == math.ceil(law.laws[2].rounds(3) * (1 - 1e-12)) and other.solver["rounds_law"] == "per-cut"
    assert planner.evaluate([2, 1], 1).rounds == math.ceil(max(law.laws[1].rounds(1), law.laws[2].rounds(1)) * (1 - 1e-12))
    for cuts, interval in (([3, 1], 1), ([2, 1], 2)):                          # never piloted; cut 1 not across I = 2
        with pytest.raises(InputError) as info:
            planner.evaluate(cuts, interval)
        assert info.value.field == "cuts"
    assert main(["plan", "--pilots", pilots[1], "--target-accuracy", str(TARGET), "--rounds-law", "per-cut",
                 "--json"]) == 0                                            # one pilot: its cut at its interval
    assert (json.loads(capsys.readouterr().out)["cuts"], ) == ([2, 2], )
    assert main(["plan", "--pilots", pilots[1], "--target-accuracy", str(TARGET), "--rounds-law", "per-cut",
                 "--cuts", "1"]) == 2                                       # a candidate never piloted
    assert "--pilots: no cut the plan may use was piloted" in capsys.readouterr().err
