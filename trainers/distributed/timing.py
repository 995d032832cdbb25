"""Measured seconds per stage, and the link emulation of ``--emulate-links``.

Every message between ranks travels in an :class:`~trainers.distributed.control.Envelope` with
``t_send`` (:func:`time.time` just before it was handed to torch.distributed) and gets
``arrived`` when it has fully arrived. A stage's measured seconds are
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

from trainers.distributed.control import Envelope, LinkRates
from trainers.engine.clock import StageLedger
from trainers.roles.messages import Activation, CutGradient, HeadForward, HeadGradient, ModelDownload, ModelUpload
from trainers.roles.protocol import EDGE, FED


def emulated_arrival(envelope: Envelope, num_bytes: int) -> float:
    """When the message counts as arrived: its real arrival, or with a link rate in the envelope
    (bit/s) no earlier than ``t_send + 8·bytes/rate`` (``bytes``: the envelope's charged bytes, else
    ``num_bytes``) — waiting here until then."""
    arrived = float(envelope.arrived)
    if envelope.rate:
        charged = envelope.charged_bytes if envelope.charged_bytes is not None else num_bytes
        due = float(envelope.t_send) + 8.0 * charged / float(envelope.rate)
        wait = due - time.time()
        if wait > 0:
            time.sleep(wait)
        arrived = max(arrived, due)
    return arrived


def link_rate(rates: LinkRates | None, msg: Any, sender: Any, to: Any) -> float | None:
    """The emulated rate (bit/s) of the link ``msg`` takes from ``sender`` to ``to`` (``EDGE``,
    ``FED`` or a device index); None for control messages or without emulation."""
    if rates is None:
        return None
    if isinstance(msg, (Activation, HeadGradient)):
        return rates.devices[msg.device]["up_bps"]
    if isinstance(msg, (CutGradient, HeadForward)):
        return rates.devices[msg.device]["down_bps"]
    if isinstance(msg, ModelUpload):
        if sender == EDGE:
            return rates.edge_to_fed_bps
        return rates.devices[msg.device]["fed_up_bps" if to == FED else "up_bps"]
    if isinstance(msg, ModelDownload):
        return rates.fed_to_edge_bps if to == EDGE else rates.devices[msg.device]["fed_down_bps"]
    return None


TRANSFER_STAGES = {Activation: "uplink", CutGradient: "downlink", ModelUpload: "model upload",
                   ModelDownload: "model download", HeadGradient: "uplink", HeadForward: "downlink"}
"""The stage a message's transfer time is booked to (the latency model's, docs/model.md §2)."""


def book_transfer(ledger: StageLedger, envelope: Envelope, receiver: Any) -> Any:
    """Book ``envelope``'s transfer time (arrival − send, emulated) to its message's stage for the
    participant it concerns (its device; ``"edge"`` for the edge server's blocks); the message."""
    msg = envelope.msg
    stage = TRANSFER_STAGES.get(type(msg))
    if stage is None:
        return msg
    arrived = emulated_arrival(envelope, msg.num_bytes)
    edge_side = (isinstance(msg, ModelDownload) and receiver == EDGE) or \
        (isinstance(msg, ModelUpload) and msg.sender == "edge")
    ledger.add("edge" if edge_side else msg.device, stage, arrived - envelope.t_send)
    return msg
