"""One training setting for every method of a comparison (``bench algorithms|training|papers``).

A method's own defaults (:data:`trainers.config.train_config.ALGORITHM_DEFAULTS`) are right for a run of that method
alone; inside a comparison they would rank optimizers and learning rates instead of algorithms. A
:class:`Setting` fixes what every method of one table trains with — optimizer, per-role learning rates,
momentum, weight decay, clipping, batch size, participation, local rounds between averages and rounds — and
each value says where it comes from (a paper, with its section or table, or a stated scaling rule). It is
printed once above the table it produced (:meth:`Setting.describe`).

How one setting maps onto each algorithm (:meth:`Setting.fields`):

* ``participation`` ρ: the ``--participation`` of every algorithm that samples devices; GAS keeps
  C = ⌈ρN⌉ devices active; vanilla SL trains every device in turn and takes only ρ = 1.
* ``client_state``: whether a device that loads the global client model keeps its optimizer state (momentum) or
  restarts it — one convention for every method (``--client-state keep|restart``; the papers' codes differ: SCALA's
  and GAS's restart, their SplitFed baselines and CycleSL keep).
* ``local_steps``: the local rounds between two averages — the aggregation interval I of the synchronous
  algorithms (it changes nothing for those that never average: SL, PSL, GAPSL, CyclePSL), GAS's local
  iterations E. A method whose planning policy decides the interval (AdaptSFL's) is left to it.

Torch-free: the CLI builds settings before anything loads torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

from adaptplan.errors import InputError
from trainers.algorithms import algorithm as registered
from trainers.config.train_config import CLIENT_STATES

COMPARISON_CLIENT_STATES = tuple(s for s in CLIENT_STATES if s != "algorithm")
"""A comparison's one convention for a device's optimizer state when it loads the global client model (the run option
``--client-state``; its third value, each algorithm's own, would differ inside one table)."""


@dataclass(frozen=True)
class Setting:
    """The training setting of one comparison; ``sources`` says where each value comes from (field → text)."""

    optimizer: str
    client_lr: float
    server_lr: float
    momentum: float
    weight_decay: float
    clip_norm: float                  # 0 = no clipping
    batch_size: int                   # b, samples per device per step
    participation: float              # ρ, fraction of the devices per round (GAS: active C = ⌈ρN⌉)
    local_steps: int | None           # local rounds between averages (I; GAS's E); None = each algorithm's own
    rounds: int
    client_state: str = "keep"        # a device that loads the global client model: "keep" or "restart" its optimizer state
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.participation <= 1:
            raise InputError(f"must be a fraction in (0, 1], got {self.participation!r}", field="--participation")
        if self.local_steps is not None and self.local_steps < 1:
            raise InputError(f"must be an integer ≥ 1, got {self.local_steps!r}", field="--local-steps")
        if self.client_state not in COMPARISON_CLIENT_STATES:
            raise InputError(f"a comparison gives every method one convention: keep or restart, got "
                             f"{self.client_state!r}", field="--client-state")

    def fields(self, algorithm: str, devices: int, planned: bool = False) -> dict[str, Any]:
        """TrainConfig fields (``extra`` included) that make ``algorithm`` on ``devices`` devices train with this
        setting; ``planned``: a planning policy decides the interval (not set here)."""
        out: dict[str, Any] = dict(optimizer=self.optimizer, lr=self.server_lr, client_lr=self.client_lr,
                                   server_lr=self.server_lr, momentum=self.momentum, weight_decay=self.weight_decay,
                                   clip_norm=self.clip_norm, batch_size=self.batch_size, rounds=self.rounds,
                                   client_state=self.client_state, extra={})
        entry = registered(algorithm)
        if entry.active_option is not None:              # it counts its active devices (GAS's C = ⌈ρN⌉)
            out["extra"][entry.active_option] = max(1, math.ceil(self.participation * devices - 1e-9))
        elif "participation" in entry.option_names:
            out["extra"]["participation"] = self.participation
        elif self.participation != 1.0:
            raise InputError(f"{algorithm} trains every device (no --participation); this comparison's ρ = "
                             f"{self.participation:g} cannot apply to it", field="participation")
        if self.local_steps is not None and entry.local_rounds_option is not None:   # its own local rounds (GAS's E)
            out["extra"][entry.local_rounds_option] = self.local_steps
        elif self.local_steps is not None and not planned:
            out["interval"] = self.local_steps
        return out

    def describe(self) -> str:
        """The setting in one line, as printed above a comparison's table."""
        rates = (f"lr {self.client_lr:g}" if self.client_lr == self.server_lr
                 else f"lr client {self.client_lr:g} / server {self.server_lr:g}")
        momentum = f", momentum {self.momentum:g}" if self.optimizer == "sgd" else ""
        steps = "each algorithm's own" if self.local_steps is None else str(self.local_steps)
        return (f"every method: {self.optimizer.upper()}, {rates}{momentum}, weight decay {self.weight_decay:g}, "
                f"clipping {'off' if not self.clip_norm else format(self.clip_norm, 'g')}, batch {self.batch_size}, "
                f"participation {self.participation:g}, local rounds between averages {steps}, {self.rounds} rounds, "
                f"a device's optimizer state {'kept' if self.client_state == 'keep' else 'restarted'} when it loads "
                f"the global model")

    def to_json(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "sources"},
                "sources": dict(self.sources)}

    def with_overrides(self, **values: Any) -> "Setting":
        """This setting with the given fields replaced (None leaves a field as it is); ``lr`` sets both roles.
        A replaced value's source becomes "given on the command line"."""
        given = {k: v for k, v in values.items() if v is not None}
        if "lr" in given:
            lr = given.pop("lr")
            given.setdefault("client_lr", lr)
            given.setdefault("server_lr", lr)
        data = {**asdict(self), **given}
        data["sources"] = {**self.sources, **{k: "given on the command line" for k in given}}
        return Setting(**data)


GAPSL_SETTING = Setting(
    "sgd", 0.005, 0.01, 0.9, 0.0, 0.0, 16, 1.0, 1, 100,
    sources={"optimizer": "GAPSL's paper §IV-A4 (its one setting for SL, SFL, EPSL, PSL and GAPSL on VGG-16): SGD",
             "client_lr": "GAPSL §IV-A4: 0.005 for the clients", "server_lr": "GAPSL §IV-A4: 0.01 for the server",
             "momentum": "GAPSL §IV-A4: 0.9", "weight_decay": "GAPSL §IV-A4 names none",
             "clip_norm": "GAPSL §IV-A4 names none",
             "batch_size": "rule: b = 16 on the shipped 5,085-image subset (AdaptSFL's b; the papers' 32–128 are for "
                           "50,000 images)",
             "participation": "GAPSL §IV-A4: all S devices every round",
             "local_steps": "SplitFed's I = 1 (an average every round), the same for every method that averages",
             "rounds": "the command's --rounds"})
"""``bench algorithms``' default: the one paper that trains SL, SFL and PSL beside its own method with one
stated setting (GAPSL §IV-A4)."""
