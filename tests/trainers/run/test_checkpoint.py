"""Fuzz a run's checkpoint field by field (issue 25): every case is one bad value — a wrong type, an out-of-range
or non-finite number, a missing or unknown field, an inconsistent pair — written back with its checksum
recomputed, then ``adaptplan train --out RUN --resume``. Each must end with exit code 2 and exactly one line
``adaptplan train: error: ...`` (the checkpoint's own refusals name the checkpoint), never an internal error and
never a run that goes on. Configuration edits are made in ``config`` and in the configuration its history
recorded alike, so that they reach the option checks rather than the consistency check."""

from __future__ import annotations

import contextlib
import copy
import io
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

from adaptplan.cli import main
from trainers.run.checkpoint import CHECKPOINT_NAME, encode, load_checkpoint

NAN, INF = float("nan"), float("inf")
BAD_SCALARS: list[Any] = [None, "text", [], {}, True, -1, -1.5, NAN, INF, 10 ** 30, [1, 2], {"a": 1}]
BAD_TEXT: list[Any] = [None, 5, 1.5, True, [], {}, ["a"]]
BAD_FLAG: list[Any] = [None, "yes", 2, [], {}]


def run_folder(tmp: Path) -> Path:
    out = tmp / "run"
    assert main(["train", "--algorithm", "scala", "--dataset", "synthetic", "--model", "mlp", "--devices", "3",
                 "--cuts", "1", "--rounds", "2", "--checkpoint-every", "1", "--batch-size", "8", "--interval", "2",
                 "--participation", "0.7", "--eval-every", "1", "--threads", "1", "--no-progress", "--out", str(out)]) == 0
    return out


Edit = tuple[str, Callable[[dict[str, Any]], None]]


def setter(path: list[Any], value: Any, *, delete: bool = False) -> Callable[[dict[str, Any]], None]:
    def apply(state: dict[str, Any]) -> None:
        target = state
        for key in path[:-1]:
            target = target[key]
        if delete:
            del target[path[-1]]
        else:
            target[path[-1]] = copy.deepcopy(value)
    return apply


def config_setter(name: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(state: dict[str, Any]) -> None:
        state["config"][name] = copy.deepcopy(value)
        state["history"]["meta"]["config"][name] = copy.deepcopy(value)
    return apply


OPTIONAL = {"plan_path", "policy", "system_path", "constants_path", "data_root", "device_data", "replan_every", "max_test_samples",
            "interval", "target_accuracy", "ranks", "mlflow", "pilots", "label_epsilon", "leakage_table",
            "max_leakage"}   # None is a valid value of these


def bad_config_values(name: str, value: Any) -> list[Any]:
    """Values no run could have had for option ``name`` (currently ``value``)."""
    if isinstance(value, bool):
        return BAD_FLAG
    if name == "server_pass_samples":                    # "auto" or a number of samples
        return [-1, 0, 1.5, "3", "often", [], 10 ** 30, None]
    if isinstance(value, str) or name.endswith("_path") or name in ("data_root", "device_data", "policy", "mlflow", "pilots",
                                                                     "leakage_table", "max_leakage"):
        return [v for v in BAD_TEXT if not (v is None and name in OPTIONAL)]
    if isinstance(value, int) or name in ("replan_every", "max_test_samples", "interval"):
        return [-1, 1.5, "3", [], 10 ** 30] + ([] if name in OPTIONAL else [None])
    if isinstance(value, float) or name in ("target_accuracy", "label_epsilon"):
        huge = [] if name == "clip_norm" else [10 ** 30]    # any clip norm > 0 is a clip norm
        return [-1.0, NAN, INF, "0.1", []] + huge + ([] if name in OPTIONAL else [None])
    if name == "cuts":
        return [5, "1", [0, 0, 0], [1, 1], [1.5, 1, 1], {"a": 1}]
    if name == "extra":
        return [[], "x", {"participation": "all"}, {"no_such_option": 1}, {"participation": NAN},
                {"participation": 5.0}, {"la_tau": -1.0}]
    return BAD_SCALARS


def edits(state: dict[str, Any]) -> Iterator[Edit]:
    for key in list(state):
        if key != "history_beside":          # a checkpoint without it is one written before it: resumed as those
            yield f"del {key}", setter([key], None, delete=True)
        for value in BAD_SCALARS:
            if not (key == "inputs" and value == state["inputs"]) and not (key == "history_beside" and value is True):
                # {}: this run names no input file; true: the one valid value of history_beside
                yield f"{key} = {value!r}"[:80], setter([key], value)
    yield "unknown field", setter(["colour"], "red")
    yield "round beyond the history", setter(["round"], state["round"] + 1)
    yield "round behind the history", setter(["round"], state["round"] - 1)
    yield "last_replan after round", setter(["last_replan"], state["round"] + 1)
    for name, value in state["config"].items():
        if name in ("resume", "overwrite", "progress", "threads", "eval_every", "checkpoint_every", "rounds", "out",
                    "target_accuracy", "device", "client_batching", "distributed", "ranks", "emulate_links",
                    "rank_timeout"):
            continue                         # given anew on --resume: the command line's value is used
        for bad in bad_config_values(name, value):
            yield f"config.{name} = {bad!r}"[:80], config_setter(name, bad)
    for name in state["config"]:           # issue 36 C1: a tensor is no run option (its truth value would raise)
        yield f"config.{name} = a tensor", config_setter(name, torch.zeros(2))
    yield "config alone edited", setter(["config", "seed"], 5)
    yield "history's config alone edited", setter(["history", "meta", "config", "lr"], 0.5)
    for i, value in enumerate(["PCG64", torch.zeros(3, dtype=torch.int64), -1, 2, NAN]):
        yield f"numpy_rng[{i}] = {value!r}"[:80], setter(["numpy_rng", i], value)
    yield "numpy_rng short", setter(["numpy_rng"], state["numpy_rng"][:3])
    for label, keys in (("of zeros", torch.zeros(624, dtype=torch.int64)), ("of floats", torch.ones(624)),
                        ("of flags", torch.ones(624, dtype=torch.bool)), ("negative", torch.full((624,), -1)),
                        ("beyond 32 bits", torch.full((624,), 2 ** 32))):      # issue 36 harness: zeros were taken
        yield f"numpy_rng keys {label}", setter(["numpy_rng", 1], keys)
    for value in [torch.zeros(3), torch.zeros(0, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8)]:
        yield f"torch_rng = {value!r}"[:80], setter(["torch_rng"], value)
    parts = state["partitions"]
    yield "partitions emptied", setter(["partitions"], [])
    yield "a partition emptied", setter(["partitions", 0], torch.zeros(0, dtype=torch.int64))
    yield "a partition of floats", setter(["partitions", 0], parts[0].double())
    yield "a partition 2-D", setter(["partitions", 0], parts[0].reshape(1, -1))
    yield "a negative sample", setter(["partitions", 0], torch.cat([parts[0][:-1], torch.tensor([-4])]))
    yield "a sample beyond the data", setter(["partitions", 0], torch.cat([parts[0][:-1], torch.tensor([10 ** 9])]))
    yield "a shared sample", setter(["partitions", 1], torch.cat([parts[1][:-1], parts[0][:1]]))
    yield "one partition too many", setter(["partitions"], parts + [parts[0]])
    yield "an input digest for no file", setter(["inputs", "system"], "0" * 64)
    for value in ["abc", "z" * 32, 5, ["a"]]:
        yield f"run_id = {value!r}", setter(["run_id"], value)
    yield from _engine_edits(state)


def _engine_edits(state: dict[str, Any]) -> Iterator[Edit]:
    """The edits of the engine's part of the checkpoint (and, last, of its history)."""
    engine = state["engine"]
    for key in list(engine):
        if key not in ("absent", "period", "stale"):          # a checkpoint from before has none: none absent, all fresh
            yield f"del engine.{key}", setter(["engine", key], None, delete=True)
        for value in BAD_SCALARS[:9]:
            # [] is a valid stale list (no device missed an average: each trains on from what it holds)
            if not (key in ("async", "period") and value is None) and not (key in ("absent", "stale", "strategy")
                                                                          and value == engine[key]) \
                    and not (key == "stale" and value == []):
                yield f"engine.{key} = {value!r}"[:80], setter(["engine", key], value)
    yield "engine.fed without its global model", setter(["engine", "fed"], {})
    yield "engine.strategy with a foreign key", setter(["engine", "strategy"], {"holder": 0})
    yield "engine.cuts beyond the model", setter(["engine", "cuts"], [99, 1, 1])
    yield "engine.cuts too few", setter(["engine", "cuts"], [1])
    yield "engine.cuts as a tensor", setter(["engine", "cuts"], torch.tensor(engine["cuts"]))        # issue 36 harness
    yield "engine.devices[0].blocks emptied", setter(["engine", "devices", 0, "blocks"], [])
    for name, weight in engine["devices"][0]["blocks"][0].items():
        yield f"engine.devices[0].blocks[0].{name} of integers", setter(
            ["engine", "devices", 0, "blocks", 0, name], weight.to(torch.int64))
        yield f"engine.devices[0].blocks[0].{name} of float64", setter(
            ["engine", "devices", 0, "blocks", 0, name], weight.to(torch.float64))
        break
    yield "engine.interval 0", setter(["engine", "interval"], 0)
    yield "engine.interval 10**30", setter(["engine", "interval"], 10 ** 30)             # issue 36 C3
    yield "engine.rounds_since_aggregation True", setter(["engine", "rounds_since_aggregation"], True)
    for value in (-1, 0, 2, True, 1.0, "1"):                                             # issue 36 C2: its cut is 1
        yield f"engine.devices[0].cut = {value!r}", setter(["engine", "devices", 0, "cut"], value)
    for value in (-1, True, 1.5, "3", 10 ** 30):                                         # issue 36 C3
        yield f"engine.devices[0].step = {value!r}", setter(["engine", "devices", 0, "step"], value)
    yield "engine.devices[0] without its step", setter(["engine", "devices", 0, "step"], None, delete=True)
    yield "engine.rng.state = True", setter(["engine", "rng", "state"], True)
    yield "engine.devices short", setter(["engine", "devices"], engine["devices"][:1])
    yield "engine.rng of another generator", setter(["engine", "rng"], {"bit_generator": "MT19937", "state": {}})
    yield "engine.period beyond the devices", setter(["engine", "period"], [0, 7])
    yield "engine.period with a device twice", setter(["engine", "period"], [1, 1])
    yield "engine.stale beyond the devices", setter(["engine", "stale"], [9])
    yield "engine.stale of a flag", setter(["engine", "stale"], [True])

    def old_scala(state: dict[str, Any]) -> None:         # before the engine kept the period, SCALA did
        del state["engine"]["period"]
        state["engine"]["strategy"] = {"current": [0, 7]}
    yield "an old checkpoint's participants beyond the devices", old_scala
    yield "engine.absent names a device whose state is kept", setter(["engine", "absent"], [0])
    yield "engine.absent beyond the devices", setter(["engine", "absent"], [7])
    yield "history.records[0].round", setter(["history", "records", 0, "round"], 5)
    yield "history.records[0].accuracy", setter(["history", "records", 0, "accuracy"], 7.5)
    yield "history.meta", setter(["history", "meta"], "text")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, bytes, dict[str, Any]]:
    out = run_folder(tmp_path_factory.mktemp("fuzz"))
    data = (out / CHECKPOINT_NAME).read_bytes()
    return out, data, load_checkpoint(out)


def resume(out: Path) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["train", "--out", str(out), "--resume", "--rounds", "3", "--threads", "1"])
    return code, err.getvalue()


def test_the_unedited_checkpoint_resumes(checkpoint, tmp_path) -> None:
    out, data, _ = checkpoint
    copy_dir = tmp_path / "copy"
    copy_dir.mkdir()
    for name in ("history.json", "history.csv", CHECKPOINT_NAME):
        (copy_dir / name).write_bytes((out / name).read_bytes())
    assert resume(copy_dir)[0] == 0


def test_every_edited_checkpoint_is_refused_with_one_line(checkpoint) -> None:
    out, original, state = checkpoint
    outcomes: Counter[str] = Counter()
    failures = []
    cases = list(edits(state))
    assert len(cases) >= 500
    for label, apply in cases:
        edited = copy.deepcopy(state)
        try:
            apply(edited)
        except (KeyError, IndexError, TypeError):
            continue                                                   # the field is not in this checkpoint
        (out / CHECKPOINT_NAME).write_bytes(encode(edited))
        code, err = resume(out)
        lines = [line for line in err.strip().splitlines() if not line.startswith("plan from")]
        clean = code == 2 and len(lines) == 1 and lines[0].startswith("adaptplan train: error: ")
        outcomes["refused" if clean else "internal error" if code == 1 else f"exit {code}"] += 1
        if not clean:
            failures.append((label, code, err.strip()[-300:]))
        (out / CHECKPOINT_NAME).write_bytes(original)
    assert not failures, f"{len(failures)} of {sum(outcomes.values())}: {failures[:80]}"
    assert outcomes["refused"] >= 500


def resume_edited(run: Path, state: dict, folder: Path) -> int:
    """Resume a copy of the run folder ``run`` whose checkpoint holds ``state`` (its frame recomputed); the exit code."""
    from adaptplan.cli import main
    from trainers.run.checkpoint import CHECKPOINT_NAME, save_checkpoint

    folder.mkdir()
    for f in run.iterdir():
        if f.is_file() and f.name != CHECKPOINT_NAME:
            (folder / f.name).write_bytes(f.read_bytes())
    save_checkpoint(state, folder)
    return main(["train", "--out", str(folder), "--resume", "--rounds", "3", "--no-progress"])


GENERATOR_EDITS = {"sampler generator true", "sampler generator state true", "sampler has_uint32 true",
                   "sampler inc even", "sampler state 2**128", "sampler uinteger 2**32", "sampler generator MT19937",
                   "sampler without generator"}


def test_a_devices_optimizer_or_sampler_state_that_does_not_fit_is_refused_on_resume(tmp_path, capsys) -> None:
    """Found by the issue 36 harness: these were accepted, then internal errors rounds later (or trained on)."""
    import copy

    import torch

    from adaptplan.cli import main
    from trainers.run.checkpoint import load_checkpoint

    out = tmp_path / "run"
    assert main(["train", "--algorithm", "psl", "--dataset", "synthetic", "--model", "mlp", "--devices", "3",
                 "--cuts", "2", "--rounds", "2", "--checkpoint-every", "1", "--out", str(out), "--no-progress"]) == 0
    base = load_checkpoint(out)
    edits = {
        "sampler position -1": lambda d: d["sampler"].update(position=-1),
        "sampler order out of range": lambda d: d["sampler"].update(order=torch.full_like(torch.as_tensor(
            d["sampler"]["order"]), 10 ** 9)),
        "sampler order 2-D": lambda d: d["sampler"].update(order=torch.zeros(2, 2, dtype=torch.int64)),
        "lr text": lambda d: d["optimizer"]["param_groups"][0].update(lr="x"),
        "momentum 1e30": lambda d: d["optimizer"]["param_groups"][0].update(momentum=10 ** 30),
        "optimizer emptied": lambda d: d.update(optimizer={}),
        "momentum buffer of another shape": lambda d: d["optimizer"]["state"].update({0: {"momentum_buffer":
                                                                                          torch.ones(1)}}),
        "sampler generator true": lambda d: d["sampler"].update(rng=True),                       # issue 67 C3
        "sampler generator state true": lambda d: d["sampler"]["rng"]["state"].update(state=True),  # numpy took it for 1
        "sampler has_uint32 true": lambda d: d["sampler"]["rng"].update(has_uint32=True),
        "sampler inc even": lambda d: d["sampler"]["rng"]["state"].update(inc=2),
        "sampler state 2**128": lambda d: d["sampler"]["rng"]["state"].update(state=2 ** 128),
        "sampler uinteger 2**32": lambda d: d["sampler"]["rng"].update(uinteger=2 ** 32),
        "sampler generator MT19937": lambda d: d["sampler"]["rng"].update(bit_generator="MT19937"),
        "sampler without generator": lambda d: d["sampler"].pop("rng"),
    }
    for name, edit in edits.items():
        state = copy.deepcopy(base)
        edit(state["engine"]["devices"][0])
        assert resume_edited(out, state, tmp_path / name.replace(" ", "_")) == 2, name
        err = capsys.readouterr().err
        assert "--resume" in err and "does not fit this run" in err and "internal error" not in err, (name, err)
        if name in GENERATOR_EDITS:
            assert "engine devices[0].sampler" in err, (name, err)
    for name, edit in {"engine generator state true": lambda e: e["rng"]["state"].update(state=True),
                       "engine generator true": lambda e: e.update(rng=True)}.items():
        state = copy.deepcopy(base)
        edit(state["engine"])
        assert resume_edited(out, state, tmp_path / name.replace(" ", "_")) == 2, name
        assert "engine rng must be numpy's PCG64 state" in capsys.readouterr().err, name
    state = copy.deepcopy(base)                            # the generator states at their edges are taken
    state["engine"]["rng"]["state"].update(state=2 ** 128 - 1, inc=1)
    state["engine"]["devices"][0]["sampler"]["rng"].update(has_uint32=1, uinteger=2 ** 32 - 1)
    assert resume_edited(out, state, tmp_path / "edges") == 0


def test_sls_holder_that_is_not_a_device_is_refused_on_resume(tmp_path, capsys) -> None:
    """Found by the issue 36 harness: SL's holder 10³⁰, −1, 5 (of 3 devices), '0', 1.5 were taken."""
    import copy

    from adaptplan.cli import main
    from trainers.run.checkpoint import load_checkpoint

    out = tmp_path / "run"
    assert main(["train", "--algorithm", "sl", "--dataset", "synthetic", "--model", "mlp", "--devices", "3",
                 "--cuts", "2", "--rounds", "2", "--checkpoint-every", "1", "--out", str(out), "--no-progress"]) == 0
    base = load_checkpoint(out)
    for holder in (10 ** 30, -1, 3, "0", 1.5, True):
        state = copy.deepcopy(base)
        state["engine"]["strategy"]["holder"] = holder
        assert resume_edited(out, state, tmp_path / f"h{len(list(tmp_path.iterdir()))}") == 2, holder
        assert "SL's holder must be a device index in 0..2" in capsys.readouterr().err


def test_gas_state_that_does_not_fit_is_refused_on_resume(tmp_path, capsys) -> None:
    """Found by the issue 36 harness: GAS's buffer 'x' and models [1] were internal errors rounds later; version −1,
    a local count −1 and active 10³⁰ were taken."""
    import copy

    from adaptplan.cli import main
    from trainers.run.checkpoint import load_checkpoint

    out = tmp_path / "run"
    assert main(["train", "--algorithm", "gas", "--dataset", "synthetic", "--model", "mlp", "--devices", "4",
                 "--cuts", "2", "--active", "2", "--local-steps", "2", "--rounds", "2", "--checkpoint-every", "1",
                 "--out", str(out), "--no-progress"]) == 0
    base = load_checkpoint(out)
    edits = {"version": -1, "updates": -1, "active": 10 ** 30, "buffer": "x", "models": [1],
             "local": {0: -1}, "join": {99: 0}}
    for key, value in edits.items():
        state = copy.deepcopy(base)
        state["engine"]["strategy"][key] = value
        assert resume_edited(out, state, tmp_path / f"gas_{key}") == 2, key
        err = capsys.readouterr().err
        assert "does not fit this run" in err and "internal error" not in err, (key, err)
    assert base["engine"]["strategy"]["updates"] > 0 and base["engine"]["async"] is not None
    loop_edits = {"stats emptied": ("strategy", "stats", {}), "now NaN": ("async", "now", float("nan")),
                  "server_free infinite": ("async", "server_free", float("inf")),
                  "a clock negative": ("async", "clock", {d: -1.0 for d in base["engine"]["async"]["active"]}),
                  "steps of text": ("async", "steps", {d: "1" for d in base["engine"]["async"]["active"]}),
                  "active of a flag": ("async", "active", [True]), "the loop's state dropped": ("async", None, None)}
    for name, (part, key, value) in loop_edits.items():     # found by the issue 36 harness: taken, the run went on
        state = copy.deepcopy(base)
        if key is None:
            state["engine"][part] = value
        else:
            state["engine"][part][key] = value
        assert resume_edited(out, state, tmp_path / name.replace(" ", "_")) == 2, name
        err = capsys.readouterr().err
        assert "does not fit this run" in err and "internal error" not in err, (name, err)
    assert resume_edited(out, copy.deepcopy(base), tmp_path / "unchanged") == 0          # the real state resumes


def test_hostile_files_findings_of_2026_12_04_are_refused_on_resume(tmp_path, capsys) -> None:
    """Found by tools/hostile_files.py (issue 67 item 5): a momentum buffer that is a number, a parameter group without
    its momentum (the step read group['momentum']: KeyError), the edge server's cuts shorter than the engine's
    (IndexError rounds later) were internal errors; the fed server's global blocks of any value (text, NaN, another
    shape, another block) were taken."""
    import copy

    import torch

    from adaptplan.cli import main
    from trainers.run.checkpoint import load_checkpoint

    out = tmp_path / "run"
    assert main(["train", "--dataset", "synthetic", "--devices", "2", "--rounds", "2", "--interval", "1",
                 "--checkpoint-every", "1", "--out", str(out), "--no-progress"]) == 0
    base = load_checkpoint(out)
    engine = base["engine"]
    (block, entries), = [(j, s) for j, s in engine["fed"]["global_blocks"].items()][:1]
    name = next(iter(entries))
    edits = {
        "momentum buffer a number": (lambda e: e["devices"][0]["optimizer"]["state"][0].update(momentum_buffer=1.5),
                                     "optimizer state momentum_buffer of parameter 0 must be a tensor, got 1.5"),
        "no momentum": (lambda e: e["devices"][0]["optimizer"]["param_groups"][0].pop("momentum"),
                        "an optimizer parameter group must hold ['dampening', 'lr', 'momentum', 'params', "
                        "'weight_decay']"),
        "edge cuts short": (lambda e: e["edge"]["cuts"].pop(), "engine edge state must hold the engine's cuts"),
        "global block text": (lambda e: e["fed"]["global_blocks"][block].update({name: "x"}),
                              f"the fed server's global block {block}['{name}'] must be a torch.float32 tensor"),
        "global block NaN": (lambda e: e["fed"]["global_blocks"][block].update(
            {name: torch.full_like(entries[name], float("nan"))}),
            f"the fed server's global block {block} holds NaN or infinite values"),
        "global block 99": (lambda e: e["fed"]["global_blocks"].update({99: entries}),
                            "the fed server's global blocks name block 99, not one of 0..4"),
        "global block 5": (lambda e: e["fed"]["global_blocks"].update({5: entries}),     # one past the last
                           "the fed server's global blocks name block 5, not one of 0..4"),
        "global blocks a list": (lambda e: e["fed"].update(global_blocks=[]),
                                 "the fed server's global blocks must map block indices to states, got list"),
        "global block one NaN": (lambda e: e["fed"]["global_blocks"][block].update(
            {name: entries[name].clone().index_fill_(0, torch.tensor([0]), float("nan"))}),
            f"the fed server's global block {block} holds NaN or infinite values"),
    }
    for label, (edit, text) in edits.items():
        state = copy.deepcopy(base)
        edit(state["engine"])
        assert resume_edited(out, state, tmp_path / label.replace(" ", "_")) == 2, label
        err = capsys.readouterr().err
        assert "does not fit this run" in err and text in err and "internal error" not in err, (label, err)
    state = copy.deepcopy(base)
    state["engine"]["devices"][0]["optimizer"]["param_groups"][0].pop("nesterov")   # a flag torch sets itself
    state["engine"]["devices"][0]["optimizer"]["state"][0].pop("momentum_buffer")   # as at a fresh optimizer
    assert resume_edited(out, state, tmp_path / "flag_and_buffer_absent") == 0


def test_an_integer_beyond_a_float_in_a_checkpoints_numbers_is_refused(tmp_path, capsys) -> None:
    """tools/hostile_files.py: an integer of 400 digits as the clock's or the wall clock's seconds or numpy's cached
    Gaussian raised OverflowError (an internal error); each is refused naming the field."""
    import copy

    from adaptplan.cli import main
    from trainers.run.checkpoint import load_checkpoint

    out = tmp_path / "run"
    assert main(["train", "--dataset", "synthetic", "--devices", "2", "--rounds", "1", "--checkpoint-every", "1",
                 "--out", str(out), "--no-progress"]) == 0
    base = load_checkpoint(out)
    for field in ("clock_seconds", "wall_seconds", "numpy_rng"):
        state = copy.deepcopy(base)
        if field == "numpy_rng":
            state["numpy_rng"] = [*state["numpy_rng"][:4], 10 ** 400]
        else:
            state[field] = 10 ** 400
        assert resume_edited(out, state, tmp_path / field) == 2, field
        err = capsys.readouterr().err
        assert f"not a valid run state: {field}: " in err and "internal error" not in err, (field, err)
