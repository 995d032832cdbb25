"""What a device rank may send rank 0 about itself, checked before it is used (issue 67 item 1; its devices'
activations, uploads and blocks are checked by :mod:`trainers.roles.checks`).

* a :class:`~trainers.distributed.control.Ready` at set-up: exactly the devices it was given;
* a :class:`~trainers.distributed.control.Report` at a round's end: seconds per stage of
  :data:`~trainers.engine.clock.STAGES` for its own devices only, each finite, at least 0 and at most
  :data:`MAX_STAGE_SECONDS`. The measured seconds fit the system that distributed re-plans use (docs/model.md §11):
  a device rank may say that its own devices are slow (they may be), never how fast another device or a server is.

A rank's message that breaks a rule raises :class:`~trainers.roles.checks.BadMessageError` naming the rank and the
field; rank 0 turns it into that rank's failure (docs/distributed.md "A device that lies").
"""

from __future__ import annotations

from typing import Sequence

from adaptplan.fileio import is_finite_number, is_int, show
from trainers.distributed.control import Ready, Report
from trainers.engine.clock import STAGES
from trainers.roles.checks import BadMessageError

MAX_STAGE_SECONDS = 1e6
"""The most seconds a rank may report for one stage of one device in one round (11.6 days: far above any round, so
that only a lie reaches it)."""


def check_ready(msg: object, rank: int, devices: Sequence[int]) -> None:
    """Raise :class:`BadMessageError` unless ``msg`` is device rank ``rank``'s Ready for exactly ``devices``."""
    if not isinstance(msg, Ready):
        raise BadMessageError(f"rank {rank}", "set-up reply", "type", f"is {type(msg).__name__}, expected Ready")
    if sorted(msg.devices) != sorted(devices):
        raise BadMessageError(f"rank {rank}", "set-up reply", "devices",
                              f"are {show(msg.devices)}, expected {sorted(devices)} (the devices it was given)")


def check_report(msg: object, rank: int, devices: Sequence[int]) -> None:
    """Raise :class:`BadMessageError` unless ``msg`` is device rank ``rank``'s Report (module docstring) for its
    ``devices``."""
    def bad(field: str, why: str) -> BadMessageError:
        return BadMessageError(f"rank {rank}", "report", field, why)

    if not isinstance(msg, Report):
        raise bad("type", f"is {type(msg).__name__}, expected Report (the answer to RoundEnd)")
    for stage, by_who in msg.seconds.items():
        if stage not in STAGES:
            raise bad("seconds", f"names the stage {show(stage)}; the stages are {', '.join(STAGES)}")
        for who, seconds in by_who.items():
            if not is_int(who) or who not in devices:
                raise bad(f"seconds[{stage!r}]", f"names {show(who)}, not one of its devices {sorted(devices)}")
            if not is_finite_number(seconds) or not 0 <= seconds <= MAX_STAGE_SECONDS:
                raise bad(f"seconds[{stage!r}][{who}]",
                          f"is {show(seconds)}, expected a finite number of seconds in [0, {MAX_STAGE_SECONDS:g}]")
