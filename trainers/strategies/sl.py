"""Vanilla split learning (Gupta & Raskar 2018; Vepakomma et al.): one client model handed from
device to device, one server model; devices train one after the other.

One round = each device in turn processes one mini-batch (forward, eq. 2; the server forwards,
back-propagates and steps; the device steps with its cut gradient), then passes its client model
and optimizer state to the next device as a model message (:class:`~trainers.api.Handoff`); the
last device passes it to the first for the next round. All cuts must be equal. The runtime charges
the groups one after the other: Σ_i (T_i^F + T_i^A + server share + T_i^G + T_i^B) plus each
hand-off's T^{mU} of the sender and T^{mD} of the receiver (eqs. 16–24).
"""

from __future__ import annotations

from typing import Any, Sequence

from torch import nn

from trainers.api import Handoff, InputError, ModelViews, RoundContext, Strategy


class SL(Strategy):
    name = "sl"
    averages_clients = False

    def __init__(self) -> None:
        super().__init__()
        self.holder = 0            # the device holding the latest client model

    def validate(self, ctx) -> None:
        if len(set(ctx.cuts)) > 1:
            raise InputError(f"vanilla SL needs one cut for all devices, got {sorted(set(ctx.cuts))}", field="cuts")

    def schedule(self, ctx: RoundContext, participants: Sequence[int]) -> list[list[int]]:
        self._order = list(participants)
        return [[d] for d in participants]

    def after_group(self, ctx: RoundContext, group: Sequence[int]) -> list[Handoff]:
        order = self._order
        nxt = order[(order.index(group[0]) + 1) % len(order)]
        self.holder = nxt
        return [] if nxt == group[0] else [Handoff(group[0], nxt)]

    def eval_models(self, view: ModelViews) -> list[nn.Module]:
        return [view.device_model(self.holder)]

    def local_models(self, view: ModelViews) -> dict[int, nn.Module]:
        model = view.device_model(self.holder)          # the one client model, whoever holds it
        return {d: model for d in view.present()}

    def state_dict(self) -> dict[str, Any]:
        return {"holder": self.holder}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.holder = state.get("holder", 0)

    def check_state(self, ctx: RoundContext) -> None:
        """The holder must be one of the run's devices (a checkpoint's text, fraction or 10³⁰ was taken)."""
        if isinstance(self.holder, bool) or not isinstance(self.holder, int) or not 0 <= self.holder < ctx.num_devices:
            raise ValueError(f"SL's holder must be a device index in 0..{ctx.num_devices - 1}, got {str(self.holder)[:40]}")
