"""Whether a checkpoint may be continued (trainers/run/resume_check.py), each rule at its edge: the options a resumed
run may not change, --rounds where the schedule depends on it, the input files' SHA-256, and the sample indices
below the data set's training samples."""

from __future__ import annotations

import numpy as np
import pytest

from adaptplan.errors import InputError
from trainers.config.train_config import RESUMABLE, TrainConfig
from trainers.run.resume_check import check_same_run, checked_partitions

BASE = dict(dataset="synthetic", devices=2, batch_size=4, rounds=6, lr=0.05, cuts=(1,), progress=False)


def state_of(config: TrainConfig, inputs: dict[str, str] | None = None) -> dict:
    return {"config": config.to_json(), "inputs": inputs}


def refused(call) -> InputError:
    with pytest.raises(InputError) as caught:
        call()
    return caught.value


def test_an_option_that_shapes_the_run_must_be_the_checkpointed_runs() -> None:
    saved = TrainConfig.flat(**BASE)
    assert check_same_run(saved, state_of(saved), {}, uses_total_rounds=False) == saved.to_json()
    assert "lr" not in RESUMABLE and "rounds" in RESUMABLE
    e = refused(lambda: check_same_run(TrainConfig.flat(**{**BASE, "lr": 0.06}), state_of(saved), {}, False))
    assert (e.field, e.message) == ("lr", "differs from the checkpointed run (0.05 vs 0.06)")
    more = TrainConfig.flat(**{**BASE, "rounds": 9})                 # --rounds may grow ...
    assert check_same_run(more, state_of(saved), {}, uses_total_rounds=False)["rounds"] == 9
    e = refused(lambda: check_same_run(more, state_of(saved), {}, uses_total_rounds=True))   # ... unless T is in eq. 2
    assert e.field == "rounds" and "keeps --rounds 6 (asked: 9)" in e.message
    assert check_same_run(saved, state_of(saved), {}, uses_total_rounds=True)["rounds"] == 6


def test_an_input_file_must_have_the_sha256_it_had_when_the_run_started() -> None:
    config = TrainConfig.flat(**BASE)
    assert check_same_run(config, state_of(config, {"system": "ab12"}), {"system": "ab12"}, False)
    assert check_same_run(config, state_of(config, None), {"system": "ab12"}, False)    # a checkpoint of no input files
    e = refused(lambda: check_same_run(config, state_of(config, {"system": "ab12"}), {"system": "ab13"}, False))
    assert e.field == "system_path" and e.message.startswith("the system file None changed since the run started")
    e = refused(lambda: check_same_run(config, state_of(config, {"constants": "ff"}), {}, False))   # now none given
    assert e.field == "constants_path"


def test_sample_indices_must_be_below_the_training_samples() -> None:
    state = {"partitions": [np.array([0, 9]), np.array([3])], "local_test": [np.array([]), np.array([5])]}
    parts, held_out = checked_partitions(state, 10, "synthetic", "checkpoint")        # 9 < 10: the last sample
    assert [p.tolist() for p in parts] == [[0, 9], [3]] and [p.tolist() for p in held_out] == [[], [5]]
    e = refused(lambda: checked_partitions(state, 9, "synthetic", "checkpoint"))       # 9 = n_train: beyond
    assert e.field == "--resume" and "gives device 0 sample index 9, beyond the 9 training samples" in e.message
    held = {"partitions": [np.array([0]), np.array([1])], "local_test": [np.array([]), np.array([4])]}
    e = refused(lambda: checked_partitions(held, 4, "synthetic", "checkpoint"))        # a held-out index: its device
    assert "gives device 1 sample index 4" in e.message
    older = {"partitions": [np.array([0]), np.array([1])]}                            # before local test splits
    parts, held_out = checked_partitions(older, 2, "synthetic", "checkpoint")
    assert [p.size for p in held_out] == [0, 0] and all(p.dtype == np.int64 for p in held_out)
