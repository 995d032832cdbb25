"""Vanilla split learning (Gupta & Raskar 2018; Vepakomma et al.): one client model handed from
device to device, one server model; devices train one after the other.

One round = each device in turn processes one mini-batch: forward (eq. 2), server forward,
backward and step, gradient back, client step; then the client model is handed to the next device.
All cuts must be equal (one client model). Clock: the devices' stages are sequential, so the round
costs Σ_i (T_i^F + T_i^A + T_i^G + T_i^B + T_i^{mU} + T_i^{mD}) + T_s^F + T_s^B — every term
taken from adaptplan's latency breakdown (hand-off of the client model ≈ one model upload and
download per device).
"""

from __future__ import annotations

from typing import Hashable, Sequence

from adaptplan.errors import InputError
from adaptplan.latency import LatencyBreakdown
from trainers.strategies.base import Strategy


class SL(Strategy):
    name = "sl"

    def client_owner(self, device: int) -> Hashable:
        return None

    def validate(self, engine) -> None:
        if len(set(engine.cuts)) > 1:
            raise InputError(f"vanilla SL needs one cut for all devices, got {sorted(set(engine.cuts))}", field="cuts")

    def schedule(self, engine, round_index: int, participants: Sequence[int]) -> list[list[int]]:
        return [[d] for d in participants]

    def server_step(self, engine, round_index, msgs):
        return engine.server_step_sequential(msgs)

    def round_seconds(self, breakdown: LatencyBreakdown, aggregated: bool) -> float:
        b = breakdown
        return float((b.client_fp + b.upload + b.download + b.client_bp + b.model_up + b.model_down).sum()
                     + b.server_fp + b.server_bp)
