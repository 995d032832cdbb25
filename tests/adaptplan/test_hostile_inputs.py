"""Issue 17's hand-found cases: each ends in exit code 2 with one message naming the file/flag and the
field (or a documented, tested acceptance), unexpected exceptions in one line with exit code 1, and
outputs written atomically. The CLI runs in-process (tests/test_fuzz_cli.run_cli)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from adaptplan import cli
from adaptplan.errors import InputError
from adaptplan.fileio import atomic_write, save_json
from tests.cli_checks import run_cli
from tests.fuzz_corpus import base_documents


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    paths = {}
    for kind, doc in base_documents().items():
        paths[kind] = tmp_path / f"{kind}.json"
        paths[kind].write_text(json.dumps(doc))
    return paths


def plan_with(files: dict[str, Path], **replace: Path) -> tuple[int, str]:
    chosen = {k: str(replace.get(k, files[k])) for k in ("profile", "system", "constants")}
    code, _, err = run_cli(["plan", "--profile", chosen["profile"], "--system", chosen["system"],
                            "--constants", chosen["constants"], "--json"])
    return code, err


def one_error(code: int, err: str, command: str = "plan") -> str:
    """The single message of a clean exit-2 error (asserts there is exactly one line)."""
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"adaptplan {command}: error: "), err
    return lines[0].removeprefix(f"adaptplan {command}: error: ")


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---- files ------------------------------------------------------------------------------------------
def test_integer_of_400_digits_in_a_float_field(files, tmp_path):
    text = files["system"].read_text().replace("1000000000000.0", "1" + "0" * 400)
    bad = write(tmp_path / "s.json", text)
    assert one_error(*plan_with(files, system=bad)) == (
        f"{bad}: system.server_flops: must be at most 1e+30 FLOP/s in magnitude, got an integer of about 401 digits")


def test_null_in_a_required_profile_field(files, tmp_path):
    doc = base_documents()["profile"]
    doc["cut_points"][0]["fp_flops"] = None
    bad = write(tmp_path / "p.json", json.dumps(doc))
    assert one_error(*plan_with(files, profile=bad)) == (
        f"{bad}: profile.cut_points[0].fp_flops: must be a number in FLOPs, got None")


@pytest.mark.parametrize("value, message", [
    ("1e308", "must be at most 1e+30 bit/s in magnitude, got 1e+308"),
    ("5e-324", "must be at least 1e-30 bit/s (smaller positive values are not supported), got 5e-324"),
    ("Infinity", "must be a finite number in bit/s, got inf"),
    ("NaN", "must be a finite number in bit/s, got nan"),
    ('"fast"', "must be a number in bit/s, got 'fast'"),
    ("true", "must be a number in bit/s, got True"),
])
def test_extreme_or_wrong_values_in_a_system_rate(files, tmp_path, value, message):
    doc = base_documents()["system"]
    doc["devices"][1]["up_bps"] = "@@"
    bad = write(tmp_path / "s.json", json.dumps(doc).replace('"@@"', value))
    assert one_error(*plan_with(files, system=bad)) == f"{bad}: system.devices[1].up_bps: {message}"


@pytest.mark.parametrize("depth", [40, 1_000, 100_000])
def test_deep_nesting(files, tmp_path, depth):
    bad = write(tmp_path / "c.json", '{"beta": ' + "[" * depth + "]" * depth + "}")
    assert one_error(*plan_with(files, constants=bad)) == f"constants: constants file {str(bad)!r} nests deeper than 32 levels"


def test_a_folder_or_device_is_not_a_file(files, tmp_path):
    assert one_error(*plan_with(files, system=tmp_path)) == f"system: system file {str(tmp_path)!r} is not a regular file"
    assert one_error(*plan_with(files, system=Path("/dev/null"))) == "system: system file '/dev/null' is not a regular file"


def test_duplicate_keys_are_an_error(files, tmp_path):
    bad = write(tmp_path / "c.json", files["constants"].read_text().replace('"beta": 5.0', '"beta": 5.0, "beta": 1.0'))
    assert one_error(*plan_with(files, constants=bad)) == (
        f"constants: constants file {str(bad)!r} gives the key 'beta' twice in one object")


@pytest.mark.parametrize("field, path", [("model", ("model",)), ("name", ("cut_points", 1, "name"))])
def test_profile_model_and_cut_names_must_be_text(files, tmp_path, field, path):
    doc = base_documents()["profile"]
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = {"not": "text"}
    bad = write(tmp_path / "p.json", json.dumps(doc))
    where = "profile.model" if field == "model" else "profile.cut_points[1].name"
    assert one_error(*plan_with(files, profile=bad)) == f"{bad}: {where}: must be a string, got {{'not': 'text'}}"


def test_all_zero_profile_is_refused(files, tmp_path):
    doc = base_documents()["profile"]
    for cut in doc["cut_points"]:
        cut.update(fp_flops=0, bp_flops=0, activation_bits=0, gradient_bits=0, client_param_bits=0)
    bad = write(tmp_path / "p.json", json.dumps(doc))
    assert one_error(*plan_with(files, profile=bad)) == f"{bad}: profile.cut_points[0].activation_bits: must be > 0 bits, got 0"


def test_a_profile_that_computes_nothing_is_refused(files, tmp_path):
    doc = base_documents()["profile"]
    for cut in doc["cut_points"]:
        cut.update(fp_flops=0)
    bad = write(tmp_path / "p.json", json.dumps(doc))
    assert one_error(*plan_with(files, profile=bad)).startswith(f"{bad}: cut_points[2].fp_flops: must be > 0 at the model output")


def test_huge_round_count_is_refused_not_printed(files, tmp_path):
    bad = write(tmp_path / "c.json", json.dumps(dict(base_documents()["constants"], theta=1e30, gamma=1e-6)))
    message = one_error(*plan_with(files, constants=bad))
    assert message.startswith("plan.rounds: the plan needs 2e+37 rounds, more than the 1e+12 a plan may have")


def test_theta_1e300_is_out_of_range(files, tmp_path):
    bad = write(tmp_path / "c.json", json.dumps(dict(base_documents()["constants"], theta=1e300)))
    assert one_error(*plan_with(files, constants=bad)) == f"{bad}: constants.theta: must be at most 1e+30 in magnitude, got 1e+300"


def test_tiny_g2_interval_bound_is_refused(files, tmp_path):
    bad = write(tmp_path / "c.json", json.dumps(dict(base_documents()["constants"], G2=[1e-30, 1e-30, 1e-30])))
    assert one_error(*plan_with(files, constants=bad)).startswith(
        "constants.G2: the smallest non-zero G_j^2 gives an interval bound sqrt(c/d) of")


def test_latency_beyond_what_the_solver_handles_is_refused(files, tmp_path):
    doc = base_documents()["profile"]
    doc["cut_points"][1]["activation_bits"] = 1e30
    bad = write(tmp_path / "p.json", json.dumps(doc))
    assert one_error(*plan_with(files, profile=bad)).startswith(
        "system: client FP + upload of device 0 at cut 2 would take 1e+24 s, more than the 1e+09 s the planner handles")


@pytest.mark.parametrize("field, value, message", [
    ("solver", '"bcd"', "plan.solver: must be an object, got 'bcd'"),
    ("breakdown", "[1, 2]", "plan.breakdown: must be an object, got [1, 2]"),
    ("breakdown", '{"server FP": "slow"}', "plan.breakdown.server FP: must be a number in s, got 'slow'"),
    ("aggregations", "2.5", "plan.aggregations: must be an integer in 0..1,000,000,000,000, got 2.5"),
])
def test_plan_file_fields_of_the_wrong_type(files, tmp_path, field, value, message):
    doc = base_documents()["plan"]
    doc[field] = "@@"
    bad = write(tmp_path / "plan.json", json.dumps(doc).replace('"@@"', value))
    code, _, err = run_cli(["train", "--plan", str(bad), "--checkpoint-every", "1"])
    assert one_error(code, err, "train") == f"{bad}: {message}"


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["records"][0].update(sim_seconds=[1, 2]), "history.records[0].sim_seconds: must be a number in s, got [1, 2]"),
    (lambda d: d["meta"].update(config="adaptsfl"), "history.meta.config: must be an object, got 'adaptsfl'"),
    (lambda d: d["records"][1].update(accuracy=1.5), "history.records[1].accuracy: must be in [0, 1], got 1.5"),
    (lambda d: d["records"][1].update(aggregated="yes"), "history.records[1].aggregated: must be true or false, got 'yes'"),
])
def test_plot_refuses_malformed_histories(files, tmp_path, mutate, message):
    doc = base_documents()["history"]
    mutate(doc)
    bad = write(tmp_path / "history.json", json.dumps(doc))
    code, _, err = run_cli(["plot", str(bad), "-o", str(tmp_path / "out.png")])
    assert one_error(code, err, "plot") == f"{bad}: {message}"
    assert not (tmp_path / "out.png").exists()


# ---- output paths ------------------------------------------------------------------------------------
def test_plot_unknown_format_and_folder(files, tmp_path):
    code, _, err = run_cli(["plot", str(files["history"]), "-o", str(tmp_path / "out.xyz")])
    assert one_error(code, err, "plot").startswith(f"output: unknown image format '.xyz' of '{tmp_path}/out.xyz'; use one of")
    code, _, err = run_cli(["plot", str(files["history"]), "-o", str(tmp_path)])
    assert one_error(code, err, "plot") == (f"output: {str(tmp_path)!r} is a folder; give an image file name such as "
                                            f"{str(tmp_path / 'plot.png')!r}")
    # the output is checked before any history is read: a missing run is not reported first
    code, _, err = run_cli(["plot", str(tmp_path / "no-such-run"), "-o", str(tmp_path / "out.xyz")])
    assert one_error(code, err, "plot").startswith("output: unknown image format '.xyz'")


def test_plot_without_extension_reports_the_png_it_writes(files, tmp_path):
    code, out, err = run_cli(["plot", str(files["history"]), "-o", str(tmp_path / "curve")])
    assert code == 0, err
    assert out.strip() == str(tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["curve.png", *(f"{k}.json" for k in base_documents())])


def test_output_onto_a_symlink_writes_through_it(files, tmp_path):
    target, link = tmp_path / "real.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    code, _, err = run_cli(["system", "--devices", "2", "-o", str(link)])
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert len(json.loads(target.read_text())["devices"]) == 2


def test_disk_full_while_writing_names_the_path_and_keeps_the_old_file(tmp_path, monkeypatch):
    out = tmp_path / "system.json"
    out.write_text("previous")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    code, _, err = run_cli(["system", "--devices", "2", "-o", str(out)])
    assert one_error(code, err, "system") == f"output: cannot write {str(out)!r}: No space left on device"
    assert out.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["system.json"]     # no temporary file left


def test_unwritable_folder_names_the_path(tmp_path):
    blocker = write(tmp_path / "file", "x")
    code, _, err = run_cli(["system", "--devices", "2", "-o", str(blocker / "sub" / "s.json")])
    assert one_error(code, err, "system") == f"output: cannot write {str(blocker / 'sub' / 's.json')!r}: Not a directory"


def test_interrupted_write_leaves_no_temporary_file(tmp_path):
    def interrupted(fh):
        fh.write(b"partial")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "a.json", interrupted)
    assert list(tmp_path.iterdir()) == []
    save_json({"a": 1}, tmp_path / "a.json")
    assert json.loads((tmp_path / "a.json").read_text()) == {"a": 1} and len(list(tmp_path.iterdir())) == 1


# ---- flags ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["system", "--devices", "2", "--flops", "1e12", "inf"], "argument --flops: must be a finite number in FLOP/s, got inf"),
    (["system", "--devices", "2", "--flops", "1e12", "nan"], "argument --flops: must be a finite number in FLOP/s, got nan"),
    (["system", "--devices", "2", "--noise-cv", "nan"], "argument --noise-cv: must be a finite number, got nan"),
    (["system", "--devices", str(10**23)], f"argument --devices: must be an integer in 1..10,000 devices, got {10**23}"),
    (["system", "--devices", "2", "--seed", str(2**64)], f"argument --seed: must be an integer in 0..4,294,967,295, got {2**64}"),
    (["system", "--devices", "2", "--up-bps", "0", "1"], "argument --up-bps: must be in [1e-30, 1e+30] bit/s, got 0.0"),
    (["plan", "--seed", "-1"], "argument --seed: must be an integer in 0..4,294,967,295, got -1"),
    (["plan", "--devices", "ten"], "argument --devices: must be an integer, got 'ten'"),
    (["plan", "--cuts", "999999999999999"], "--cuts: cut index 999999999999999 is not a cut point of the profile (1..16)"),
    (["profile", "cnn", "--input", "3x100000x100000"],
     "--input: 3x100000x100000 is 30,000,000,000 values per sample, more than the 16,777,216 that can be profiled"),
    (["profile", "cnn", "--input", "3x8x8", "--bits", "0"], "argument --bits: must be an integer in 1..64 bits, got 0"),
    (["bench", "engine", "--threads", "0"], "argument --threads: must be an integer in 1..1,024 threads, got 0"),
    (["bench", "engine", "--rounds", "0"], "argument --rounds: must be an integer in 1..1,000,000,000 rounds, got 0"),
    (["bench", "engine", "--repeats", "0"], "argument --repeats: must be an integer in 1..10,000 repeats, got 0"),
    (["bench", "engine", "--devices", "10001"], "argument --devices: must be an integer in 1..10,000 devices, got 10001"),
    (["bench", "engine", "--batch-size", "0"], "argument --batch-size: must be an integer in 1..1,000,000 samples, got 0"),
    (["bench", "engine", "--server-pass-samples", "0"],
     "argument --server-pass-samples: must be auto or an integer in 1..1,000,000,000 samples, got 0"),
    (["train", "--server-pass-samples", "-3"],
     "argument --server-pass-samples: must be auto or an integer in 1..1,000,000,000 samples, got -3"),
    (["train", "--server-pass-samples", "often"], "argument --server-pass-samples: must be auto or an integer, got 'often'"),
    (["bench", "training", "--replan-every", "0"], "argument --replan-every: must be an integer in 1..1,000,000,000 rounds, "
                                                   "got 0"),
    (["bench", "training", "--noise-cv", "1.5"], "argument --noise-cv: must be in [0, 1], got 1.5"),
    (["bench", "algorithms", "--test-samples", "0"], "argument --test-samples: must be an integer in 1..1,000,000,000 "
                                                     "samples, got 0"),
    (["bench", "algorithms", "--target-accuracy", "0"], "argument --target-accuracy: must be in (0, 1], got 0.0"),
    (["bench", "solvers", "--devices", "0"], "argument --devices: must be an integer in 1..10,000 devices, got 0"),
])
def test_numeric_flags(argv, message):
    code, _, err = run_cli(argv)
    command = " ".join(argv[:2]) if argv[0] == "bench" else argv[0]
    assert one_error(code, err, command) == message


@pytest.mark.parametrize("field, value, message", [
    ("lr", 1e308, "lr: must be in (0, 1e+06], got 1e+308"),
    ("lr", 1e30, "lr: must be in (0, 1e+06], got 1e+30"),
    ("momentum", float("nan"), "momentum: must be a finite number, got nan"),
    ("momentum", float("inf"), "momentum: must be a finite number, got inf"),
    ("weight_decay", float("nan"), "weight_decay: must be a finite number, got nan"),
    ("devices", 10**30, f"devices: must be at most 10,000 devices, got {10**30}"),
    ("seed", -1, "seed: must be an integer in 0..4,294,967,295, got -1"),
    ("system_seed", 2**40, f"system_seed: must be an integer in 0..4,294,967,295, got {2**40}"),
    ("cuts", (999999999999999,), "cuts[0]: must be at most 10,000, got 999999999999999"),
])
def test_training_options(field, value, message):
    from trainers.config.train_config import TrainConfig

    with pytest.raises(InputError) as info:
        TrainConfig.flat(dataset="synthetic", **{field: value})
    assert str(info.value) == message


def test_training_flag_error_names_the_flag():
    code, _, err = run_cli(["train", "--dataset", "synthetic", "--momentum", "nan"])
    assert one_error(code, err, "train") == "--momentum: must be a finite number, got nan"


# ---- a user's model ---------------------------------------------------------------------------------------
USER_MODELS = '''
import torch
from torch import nn

def raises(num_classes=10):
    raise ValueError("width must be even")

def wrong_classes(num_classes=10):
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 7))

class NaNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(x.flatten(1)) * float("nan")

def nan(num_classes=10):
    return NaNNet()

class Broken(nn.Module):
    def forward(self, x):
        raise RuntimeError("forward is not implemented yet")

def broken(num_classes=10):
    return Broken()
'''


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    (tmp_path / "h17_user_models.py").write_text(USER_MODELS)
    (tmp_path / "h17_raises_on_import.py").write_text("raise RuntimeError('config file missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize("spec, message", [
    ("h17_user_models:raises", "MODEL: building model 'h17_user_models:raises' failed: ValueError: width must be even"),
    ("h17_raises_on_import:f", "MODEL: importing module 'h17_raises_on_import' of model 'h17_raises_on_import:f' failed: "
                               "RuntimeError: config file missing"),
    ("h17_user_models:wrong_classes", "MODEL: model 'h17_user_models:wrong_classes' returned shape (2, 7) for a batch of 2; "
                                      "expected (2, 10): one score per class (--num-classes 10)"),
    ("h17_user_models:nan", "MODEL: model 'h17_user_models:nan' returned NaN or inf scores for random input"),
    ("h17_user_models:broken", "MODEL: model 'h17_user_models:broken' failed on an input of shape 3x8x8: "
                               "RuntimeError: forward is not implemented yet"),
])
def test_user_model_errors_name_the_model(user_models, spec, message):
    code, _, err = run_cli(["profile", spec, "--input", "3x8x8"])
    assert one_error(code, err, "profile") == message


def test_debug_shows_the_user_models_traceback(user_models, monkeypatch):
    code, _, err = run_cli(["--debug", "profile", "h17_user_models:raises", "--input", "3x8x8"])
    assert code == 2 and "Traceback" in err and 'raise ValueError("width must be even")' in err
    monkeypatch.setenv("ADAPTPLAN_DEBUG", "1")
    code, _, err = run_cli(["profile", "h17_user_models:raises", "--input", "3x8x8"])
    assert code == 2 and "Traceback" in err


# ---- unexpected exceptions --------------------------------------------------------------------------------
def test_internal_error_is_one_line_with_exit_1(monkeypatch):
    import adaptplan.cli.commands.system as system_command

    def bug(args):
        raise ZeroDivisionError("division by zero\nsecond line")

    monkeypatch.setattr(system_command, "run", bug)
    monkeypatch.delenv("ADAPTPLAN_DEBUG", raising=False)
    code, _, err = run_cli(["system", "--devices", "2"])
    assert code == 1
    assert err == "adaptplan system: internal error: ZeroDivisionError: division by zero second line (rerun with --debug)\n"
    with pytest.raises(ZeroDivisionError):
        cli.main(["--debug", "system", "--devices", "2"])
    with pytest.raises(ZeroDivisionError):
        cli.main(["system", "--devices", "2", "--debug"])


def test_bench_plot_format_checked_before_the_benchmark(tmp_path):
    code, out, err = run_cli(["bench", "solvers", "--quick", "--plot", str(tmp_path / "s.xyz")])
    assert one_error(code, err, "bench").startswith(f"output: unknown image format '.xyz' of '{tmp_path}/s.xyz'")
    assert out == ""


# ---- documented acceptances ---------------------------------------------------------------------------------
def test_free_form_parts_are_accepted_as_written(tmp_path):
    from adaptplan.plan import Plan
    from trainers.run.history import History

    plan = dict(base_documents()["plan"], solver={"method": -2.5, "iterations": [None, {"deep": True}]})
    loaded = Plan.load(write(tmp_path / "plan.json", json.dumps(plan)))
    assert loaded.solver == plan["solver"]
    history = base_documents()["history"]
    events = [{"round": 3, "event": "replan", "solver": {"method": -2.5}, "note": [None, {"deep": True}]}]
    history.update(events=events, summary={"rounds": "many"})
    history["meta"]["config"]["devices"] = [1.5]
    history["records"][0].update(train_loss=float("nan"), test_loss=float("inf"))
    path = write(tmp_path / "history.json", json.dumps(history))
    code, out, err = run_cli(["plot", str(path), "-o", str(tmp_path / "p.png")])
    assert code == 0, err
    assert History.load(path).events == events


@pytest.mark.parametrize("event, message", [
    ({"round": 10 ** 400, "event": "plan"}, "history.events[0].round: must be an integer in 0..1,000,000,000,000, got an "
                                            "integer of about 401 digits"),
    ({"round": 1}, "history.events[0].event: must be one of plan, replan, replan-infeasible, model, got None"),
    ({"round": 0, "event": "plan", "source": "me"}, "history.events[0].source: must be one of cuts, plan, planner, "
                                                    "default, policy, whole-model, got 'me'"),
    ({"round": 2, "event": "replan", "old_cuts": [0]}, "history.events[0].old_cuts[0]: must be"),
    ({"round": 2, "event": "replan", "interval": 0}, "history.events[0].interval: must be"),
    ({"round": 0, "event": "plan", "plan": {"total_latency_s": "x"}}, "history.events[0].plan.total_latency_s: must be"),
])
def test_a_historys_plan_events_are_checked_where_they_are_read(files, tmp_path, event, message):
    """A calibrated run's summary divides by its first plan's predicted seconds (History.to_target): an event of
    another kind, round, source, plan or prediction is refused naming the field (tools/hostile_files.py)."""
    history = base_documents()["history"]
    history["events"] = [event]
    bad = write(tmp_path / "history.json", json.dumps(history))
    code, _, err = run_cli(["plot", str(bad), "-o", str(tmp_path / "out.png")])
    assert one_error(code, err, "plot").startswith(f"{bad}: {message}")


def test_clip_message_shortens_only_words_longer_than_the_limit() -> None:
    path = "/" + "d" * 197                                     # a 198- and a 200-character word stay whole
    assert cli.clip_message(f"cannot read {path}x: gone") == f"cannot read {path}x: gone"
    long = "v" * 201
    assert cli.clip_message(f"got {long!r} and {long}, or {long}:") == (
        f"got '{'v' * 59}… (203 characters) and {'v' * 60}… (201 characters), or {'v' * 60}… (201 characters):")


@pytest.mark.parametrize("argv", [["profile", "BIG", "--input", "3x8x8"], ["train", "--model", "BIG"],
                                  ["train", "--model", "BIG:factory"], ["train", "--dataset", "BIG"],
                                  ["train", "--cuts", "BIG"], ["plot", "BIG"], ["plan", "--profile", "BIG"],
                                  ["bench", "BIG"], ["train", "--out", "BIG", "--resume"]])
def test_a_huge_value_is_not_echoed_whole(argv, capsys) -> None:
    """A 10⁵-character value (a file pasted into a flag) is named by its start and length in the one error line."""
    assert cli.main([a.replace("BIG", "x" * 100_000) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 600, err[:300]
    assert "xxxxxxxxxx… (100,0" in err


def test_a_history_with_a_class_count_beyond_a_float_plots(files, tmp_path):
    """tools/hostile_files.py: meta.num_classes of 400 digits (a free-form meta key) made the convergence floor
    2/M raise OverflowError; an implausible count is read as unknown (floor 0)."""
    history = base_documents()["history"]
    history["meta"]["num_classes"] = 10 ** 400
    path = write(tmp_path / "history.json", json.dumps(history))
    code, out, err = run_cli(["plot", str(path), "-o", str(tmp_path / "p.png")])
    assert code == 0, err
