"""Measured seconds per stage, and the link emulation of ``--emulate-links``.

Every message between ranks carries ``t_send`` (:func:`time.time` just before it was handed to
torch.distributed) and gets ``arrived`` when it has fully arrived. A stage's measured seconds are
``arrived − t_send`` for the transfers and the compute time for device FP/BP and the server.
Ranks on one machine share its clock; across machines the transfer figures are only as good as
the machines' clock synchronisation (docs/distributed.md).

With ``--emulate-links`` a message over a link of rate r (bit/s, from the round's system) is
delivered no earlier than ``t_send + 8·bytes / r``: the receiver holds it until then. This is a
per-message token bucket of one message's size (the link is idle between a device's messages in a
round) applied where the message is taken in, so one sender's several links do not queue behind
each other; on loopback it makes the measured transfer time the latency model's, plus the real
transfer and the message overhead.
"""

from __future__ import annotations

import time
from typing import Any

from trainers.clock import STAGES


class StageLedger:
    """Seconds per stage and per participant (device index or ``"edge"``) within a round."""

    def __init__(self) -> None:
        self.seconds: dict[str, dict[Any, float]] = {s: {} for s in STAGES}

    def add(self, who: Any, stage: str, seconds: float) -> None:
        self.seconds[stage][who] = self.seconds[stage].get(who, 0.0) + max(0.0, float(seconds))

    def merge(self, other: dict[str, dict[Any, float]]) -> None:
        for stage, by_who in other.items():
            for who, seconds in by_who.items():
                self.add(who, stage, seconds)

    def summary(self) -> dict[str, float]:
        """The longest participant's seconds per stage (as the simulator's stage_seconds)."""
        return {s: max(v.values()) for s, v in self.seconds.items() if v}

    def take(self) -> dict[str, dict[Any, float]]:
        out = {s: dict(v) for s, v in self.seconds.items() if v}
        self.seconds = {s: {} for s in STAGES}
        return out


def emulated_arrival(envelope: dict[str, Any], num_bytes: int) -> float:
    """When the message counts as arrived: its real arrival, or with a link rate in the envelope
    (``rate``, bit/s) no earlier than ``t_send + 8·num_bytes/rate`` — waiting here until then."""
    arrived = float(envelope["arrived"])
    rate = envelope.get("rate")
    if rate:
        due = float(envelope["t_send"]) + 8.0 * num_bytes / float(rate)
        wait = due - time.time()
        if wait > 0:
            time.sleep(wait)
        arrived = max(arrived, due)
    return arrived
