"""A checkpoint's fields at the edges docs/formats.md "Checkpoint" gives them (trainers/run/checkpoint_schema.py),
on a small state built here field by field: ``round`` an integer in [0, 10⁹], ``clock_seconds``/``wall_seconds``
finite in [0, 10¹²], ``last_replan`` in [0, round], ``partitions`` one non-empty 1-D tensor per device, the
held-out samples (``local_test``) possibly none for a device, ``run_id`` 32 hexadecimal digits. Each limit is taken
at its last valid value and refused one beyond it, the refusal naming the field."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from adaptplan.errors import InputError
from trainers.run.checkpoint_schema import check_state

LAST_ROUND = 10 ** 9              # docs: `round` an integer in [0, 10⁹]
LAST_SECONDS = 1e12               # docs: finite seconds in [0, 10¹²]


def state(round_index: int = 2, **changes: Any) -> dict[str, Any]:
    """A well-formed state of a 2-device run at ``round_index`` (history rounds 1..round), then ``changes``."""
    config = {"devices": 2, "local_test_fraction": 0.0}
    base = {"round": round_index, "engine": {}, "torch_rng": torch.zeros(8, dtype=torch.uint8),
            "numpy_rng": ["MT19937", torch.arange(1, 625, dtype=torch.int64), 624, 0, 0.0],
            "clock_seconds": 1.5, "wall_seconds": 0.5, "last_replan": 0,
            "history": {"meta": {"config": config}, "records": [{"round": t} for t in range(1, round_index + 1)]},
            "config": config, "partitions": [torch.tensor([0, 1]), torch.tensor([2])], "inputs": {},
            "run_id": "0123456789abcdef" * 2}
    return {**base, **changes}


def refused_field(candidate: dict[str, Any]) -> str:
    """The field the refusal of ``candidate`` names (the text between "valid run state: " and the cause)."""
    with pytest.raises(InputError) as caught:
        check_state(candidate, "RUN/checkpoint.pt")
    assert caught.value.field == "--resume"
    return caught.value.message.split("is not a valid run state: ", 1)[1].split(":", 1)[0]


def test_the_state_built_here_is_valid() -> None:
    check_state(state(), "RUN/checkpoint.pt")
    check_state(state(0), "RUN/checkpoint.pt")                     # round 0: nothing trained yet


def test_a_round_beyond_1e9_is_refused_for_its_round() -> None:
    assert refused_field(state(2, round=LAST_ROUND + 1)) == "round"
    assert refused_field(state(2, round=10 ** 30)) == "round"
    assert refused_field(state(2, round=-1)) == "round"
    assert refused_field(state(2, round=3)) == "history.records"        # within the range: its history must match


ROUND_AT_THE_LIMIT = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))    # a bug must not take the machine's memory
import torch
from adaptplan.errors import InputError
from trainers.run.checkpoint_schema import check_state
config = {"devices": 2, "local_test_fraction": 0.0}
state = {"round": 10 ** 9, "engine": {}, "torch_rng": torch.zeros(8, dtype=torch.uint8),
         "numpy_rng": ["MT19937", torch.arange(1, 625, dtype=torch.int64), 624, 0, 0.0],
         "clock_seconds": 1.5, "wall_seconds": 0.5, "last_replan": 0,
         "history": {"meta": {"config": config}, "records": [{"round": 1}, {"round": 2}]},
         "config": config, "partitions": [torch.tensor([0, 1]), torch.tensor([2])], "inputs": {},
         "run_id": "0123456789abcdef" * 2}
try:
    check_state(state, "RUN/checkpoint.pt")
    print("taken")
except InputError as exc:
    print("refused", exc.message.split("is not a valid run state: ", 1)[1].split(":", 1)[0])
except MemoryError:
    print("MemoryError")
"""


def test_round_1e9_passes_the_round_rule() -> None:
    """A history of 10⁹ rounds cannot be built here: at round 10⁹ the state is refused for its history (which must
    hold rounds 1..10⁹), not for its round (the state is :func:`state`'s at round 10⁹). Run in a process of at most
    4 GiB of address space: the check once built the list of 10⁹ rounds before comparing lengths (about 24 GB)."""
    root = str(Path(__file__).resolve().parents[3])
    done = subprocess.run([sys.executable, "-c", ROUND_AT_THE_LIMIT], capture_output=True, text=True, timeout=120,
                          cwd=root)
    assert done.stdout.strip() == "refused history.records", (done.stdout, done.stderr[-500:])


@pytest.mark.parametrize("name", ["clock_seconds", "wall_seconds"])
def test_seconds_of_1e12_are_taken_and_beyond_refused(name: str) -> None:
    check_state(state(**{name: LAST_SECONDS}), "RUN/checkpoint.pt")
    check_state(state(**{name: 10 ** 12}), "RUN/checkpoint.pt")          # an integer is a number of seconds
    check_state(state(**{name: 0.0}), "RUN/checkpoint.pt")
    for beyond in (math.nextafter(LAST_SECONDS, math.inf), 10 ** 12 + 1, -1e-300, math.inf):
        assert refused_field(state(**{name: beyond})) == name


def test_last_replan_may_be_the_checkpoints_round_not_after_it() -> None:
    check_state(state(2, last_replan=2), "RUN/checkpoint.pt")           # re-planned in the round it was written
    check_state(state(0, last_replan=0), "RUN/checkpoint.pt")
    assert refused_field(state(2, last_replan=3)) == "last_replan"
    assert refused_field(state(2, last_replan=-1)) == "last_replan"


def test_a_device_without_training_samples_is_refused() -> None:
    empty = torch.zeros(0, dtype=torch.int64)
    assert refused_field(state(partitions=[torch.tensor([0, 1]), empty])) == "partitions[1]"
    assert refused_field(state(partitions=[empty, torch.tensor([2])])) == "partitions[0]"
    assert refused_field(state(partitions=[torch.tensor([0, 1])])) == "partitions"            # one per device


def test_a_device_that_holds_nothing_out_is_taken() -> None:
    """The local protocol's held-out samples: one tensor per device, possibly empty (a device too small to hold a
    sample out), never shared with a training partition."""
    config = {"devices": 2, "local_test_fraction": 0.2}
    held = [torch.zeros(0, dtype=torch.int64), torch.tensor([3])]
    history = {"meta": {"config": config}, "records": [{"round": 1}, {"round": 2}]}
    check_state(state(config=config, history=history, local_test=held), "RUN/checkpoint.pt")
    nothing = [torch.zeros(0, dtype=torch.int64)] * 2
    check_state(state(config=config, history=history, local_test=nothing), "RUN/checkpoint.pt")
    assert refused_field(state(config=config, history=history)) == "local_test"               # the field absent
    shared = [torch.tensor([2]), torch.tensor([3])]                                          # 2 is device 1's
    assert refused_field(state(config=config, history=history, local_test=shared)) == "partitions"


@pytest.mark.parametrize("run_id, taken", [("ab" * 16, True), ("0" * 32, True), ("a" * 31, False), ("a" * 33, False),
                                           ("A" * 32, False), ("g" * 32, False)])
def test_a_run_id_is_32_hexadecimal_digits(run_id: str, taken: bool) -> None:
    if taken:
        check_state(state(run_id=run_id), "RUN/checkpoint.pt")
    else:
        assert refused_field(state(run_id=run_id)) == "run_id"
