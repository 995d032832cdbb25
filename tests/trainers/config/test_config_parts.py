"""Issue 35 item 4: the run's configuration by part (trainers.config.train_config), each field carrying its metadata
(trainers.config.fields), from which the range checks, the resumable set and the command line's options are
generated; run folders written before the parts existed still resume."""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adaptplan.cli import main
from adaptplan.cli.config_flags import add_part, part_values
from adaptplan.errors import InputError
from adaptplan.fileio import MAX_COUNT
from trainers.config.fields import check_fields, described, option, resumable_keys
from trainers.config.train_config import DEFAULTS, FLAT_KEYS, PARTS, RESUMABLE, TrainConfig, as_saved_run_trained

OLD_RUN = Path(__file__).parents[2] / "data" / "run_before_config_parts"
# how tests/data/run_before_config_parts was written, by the flat TrainConfig of commit 7e9769b (2 of the rounds;
# checkpoint at round 2)
OLD_FLAGS = ["--algorithm", "sfl-v1", "--dataset", "synthetic", "--model", "mlp", "--devices", "3", "--cuts", "1",
             "--batch-size", "8", "--eval-every", "1", "--checkpoint-every", "2", "--participation", "0.67",
             "--threads", "1", "--no-progress"]


ADDED_SINCE = {"mlflow"}
"""Run options added after the parts (train --mlflow, issue 37)."""
TRAINED_WITHOUT = {"pilots", "aggregation", "trim", "rounds_law", "client_state", "labels_per_device", "size_exponent",
                   "activation_clip", "activation_noise", "nopeek", "privacy_delta", "label_epsilon",
                   "clip_per_value", "u_shaped", "head_clip", "head_noise", "leakage_table", "max_leakage"}
"""Options added after the parts (train --pilots and --rounds-law, issue 66; --aggregation and --trim, issue 67;
--client-state, issue 69; --labels-per-device and --size-exponent, issue 70; the defences of issue 71): a folder of before trained without them (SAVED_BEFORE: no pilots, eq. 15's law, FedAvg's
mean, each algorithm's own optimizer state), and a resumed run may not change them."""


def _records(folder: Path) -> list[tuple]:
    history = json.loads((folder / "history.json").read_text())
    return [(r["round"], r["train_loss"], r["accuracy"], r["sim_seconds"]) for r in history["records"]]


def test_a_run_folder_written_before_the_parts_resumes_and_goes_on_as_an_uninterrupted_run(tmp_path) -> None:
    saved = json.loads((OLD_RUN / "history.json").read_text())["meta"]["config"]
    assert "data" not in saved and saved["dirichlet_alpha"] == 0.5     # the flat form of before
    old = tmp_path / "old"
    shutil.copytree(OLD_RUN, old)
    assert main(["train", "--out", str(old), "--resume", "--rounds", "4", "--no-progress"]) == 0
    fresh = tmp_path / "fresh"
    assert main(["train", *OLD_FLAGS, "--rounds", "4", "--out", str(fresh)]) == 0
    resumed, whole = _records(old), _records(fresh)
    assert [r[0] for r in resumed] == [1, 2, 3, 4]
    assert resumed == whole                      # the checkpointed state, read by the parts, trains on identically


def test_the_saved_form_keeps_every_flat_key_of_before() -> None:
    """The flat keys a run folder holds (docs/formats.md) are the parts' keys, none lost, none renamed; the keys
    added since (ADDED_SINCE) are options a resumed run may give anew, so a folder of before resumes with their
    defaults."""
    saved = json.loads((OLD_RUN / "history.json").read_text())["meta"]["config"]
    assert set(saved) | ADDED_SINCE | TRAINED_WITHOUT == set(FLAT_KEYS) == set(TrainConfig().to_json()) == set(DEFAULTS)
    assert not (ADDED_SINCE | TRAINED_WITHOUT) & set(saved) and ADDED_SINCE <= set(RESUMABLE)
    assert not TRAINED_WITHOUT & set(RESUMABLE)
    assert {k: as_saved_run_trained(saved)[k] for k in TRAINED_WITHOUT} == {k: DEFAULTS[k] for k in TRAINED_WITHOUT}
    config = TrainConfig.from_json({**saved, **{k: DEFAULTS[k] for k in ADDED_SINCE | TRAINED_WITHOUT}})
    assert config.to_json() == {**saved, **{k: DEFAULTS[k] for k in ADDED_SINCE | TRAINED_WITHOUT}}
    assert (config.data.devices, config.model.name, config.optim.lr, config.plan.cuts, config.run.rounds,
            config.extra) == (3, "mlp", saved["lr"], (1, 1, 1), 2, {"participation": 0.67})


def test_resumable_is_generated_from_the_fields_and_equals_the_set_before() -> None:
    before = {"rounds", "resume", "overwrite", "progress", "out", "checkpoint_every", "threads", "target_accuracy",
              "eval_every", "device", "client_batching", "client_recompute", "server_pass_samples", "distributed",
              "transport", "ranks", "emulate_links", "rank_timeout"}
    assert set(RESUMABLE) == before | ADDED_SINCE and len(RESUMABLE) == len(before | ADDED_SINCE)
    # every execution and runtime option may change on --resume; nothing of the data, model, optimizer or plan
    assert {d.key for d in described(PARTS["execution"]) if d.flag} <= set(RESUMABLE)
    assert {d.key for d in described(PARTS["runtime"])} <= set(RESUMABLE)
    for part in ("data", "model", "optim", "plan", "system"):
        assert not {d.key for d in described(PARTS[part])} & set(RESUMABLE), part


def test_resume_refuses_a_change_of_an_option_the_metadata_does_not_mark_resumable(tmp_path) -> None:
    old = tmp_path / "old"
    shutil.copytree(OLD_RUN, old)
    code = main(["train", "--out", str(old), "--resume", "--rounds", "3", "--batch-size", "4", "--no-progress"])
    assert code == 2


@dataclass
class _Part:
    count: int = option(3, "a count", high=10, unit="things")
    ratio: float = option(0.5, "a ratio", low=0.0, high=1.0, low_open=True)
    name: str = option("a", "a name", choices=("a", "b"))
    size: int | str = option("auto", "a size", auto=True, high=100, key="part_size", flag="--size")
    quiet: bool = option(True, "no noise", flag="--loud", negated=True)
    hidden: int | None = option(None, "not on the command line", flag=None, high=5)
    seed: int = option(0, "a seed", low=0, high=7, resumable=True)
    plain: int = option(1, "no upper limit given")
    tags: dict[str, Any] = option(help="options", factory=dict, flag=None)
    note: str = "not described"                          # a field without metadata: neither checked nor a flag


@pytest.mark.parametrize("field, value, message", [
    ("count", 0, "must be an integer ≥ 1 things, got 0"),
    ("count", 11, "must be at most 10 things, got 11"),
    ("count", True, "must be an integer ≥ 1 things, got True"),
    ("ratio", 0.0, "must be in (0, 1], got 0.0"),
    ("ratio", 1.5, "must be in (0, 1], got 1.5"),
    ("name", "c", "unknown value 'c'; valid: a, b"),
    ("name", 3, "must be text, got int"),
    ("size", 101, "must be at most 100, got 101"),
    ("size", "big", "must be auto or an integer, got 'big'"),
    ("quiet", "yes", "must be true or false, got str"),
    ("hidden", 6, "must be at most 5, got 6"),
    ("seed", -1, "must be an integer in 0..7, got -1"),
    ("plain", MAX_COUNT + 1, f"must be at most {MAX_COUNT:,}"),
    ("tags", [], "must be an object, got list"),
])
def test_the_checks_are_generated_from_each_fields_annotation_and_limits(field, value, message) -> None:
    part = _Part()
    check_fields(part)                                   # the defaults pass
    setattr(part, field, value)
    with pytest.raises(InputError) as info:
        check_fields(part)
    assert info.value.field == ("part_size" if field == "size" else field)
    assert message in info.value.message


def test_the_limits_themselves_pass() -> None:
    for field, value in (("count", 10), ("count", 1), ("ratio", 1.0), ("size", 100), ("size", "auto"),
                         ("hidden", None), ("hidden", 5), ("seed", 7), ("seed", 0), ("plain", MAX_COUNT),
                         ("note", 5)):
        part = _Part()
        setattr(part, field, value)
        check_fields(part)


def test_the_options_are_generated_from_the_same_fields() -> None:
    parser = argparse.ArgumentParser()
    add_part(parser, _Part)
    flags = {a.option_strings[0] for a in parser._actions if a.option_strings and a.dest != "help"}
    assert flags == {"--count", "--ratio", "--name", "--size", "--loud", "--seed", "--plain"}   # not hidden, tags
    usage = " ".join(parser.format_usage().split())
    assert "[--count COUNT]" in usage and "[--size SIZE]" in usage and "[--name {a,b}]" in usage
    assert [d.name for d in described(_Part)][-1] == "tags"                 # `note` carries no metadata
    assert next(d.default for d in described(_Part) if d.name == "tags") == {}
    assert _Part().tags == {} and _Part().tags is not _Part().tags          # a fresh default per instance
    args = parser.parse_args(["--count", "4", "--size", "auto", "--loud", "--name", "b"])
    assert part_values(args, _Part) == {"count": 4, "ratio": 0.5, "name": "b", "part_size": "auto", "quiet": False,
                                        "seed": 0, "plain": 1}
    assert part_values(parser.parse_args([]), _Part)["quiet"] is True
    assert resumable_keys(_Part) == ("seed",)
    with pytest.raises(SystemExit):
        parser.parse_args(["--name", "c"])               # a choice outside the field's choices, at parse time
    for bad in ("0", "101", "x"):                       # "auto" or an integer in its limits, at parse time
        with pytest.raises(SystemExit):
            parser.parse_args(["--size", bad])


def test_every_flat_key_belongs_to_one_part_and_names_one_flag() -> None:
    keys = [d.key for cls in PARTS.values() for d in described(cls)]
    assert len(keys) == len(set(keys))
    from adaptplan.cli import build_parser
    from adaptplan.cli.commands.train import flag_of

    train = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "train")[1]
    flags = {s for a in train._actions for s in a.option_strings}
    for cls in PARTS.values():
        for d in described(cls):
            if d.flag is not None:
                assert d.flag in flags and flag_of(d.key) == d.flag, d.key
            else:
                assert flag_of(d.key) == d.key, d.key     # a Python-only option is named by its key


def test_a_part_of_the_wrong_type_is_refused_with_its_name() -> None:
    with pytest.raises(InputError) as info:
        TrainConfig(data="cifar10")                    # type: ignore[arg-type]
    assert info.value.field == "data"
    with pytest.raises(InputError) as info:
        TrainConfig.flat(colour="red")
    assert info.value.field == "config" and "colour" in info.value.message
