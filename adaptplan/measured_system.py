"""A system fitted to the seconds a run measured (docs/model.md §11 "The system from a run").

The latency model (eqs. 16–25) charges each role, per stage, the work of the stage over a resource of the system:

| role | stage | resource | equation |
|---|---|---|---|
| device i | ``device FP``, ``device BP`` | ``devices[i].flops`` f_i (FLOP/s) | (16), (21) |
| device i | ``uplink`` / ``downlink`` | ``devices[i].up_bps`` / ``down_bps`` (bit/s) | (17) / (20) |
| device i | ``model upload`` / ``model download`` | ``devices[i].fed_up_bps`` / ``fed_down_bps`` | (22) / (24) |
| edge server | ``server`` | ``server_flops`` f_s | (18)+(19) |
| edge server | ``model upload`` / ``model download`` | ``edge_to_fed_bps`` / ``fed_to_edge_bps`` | (23) / (25) |

In a round where the simulator charged role r s_pred seconds of a stage under the round's value v of its resource, the
stage's work is w = s_pred·v (FLOPs or bits, exactly what the model counted), and a runtime that measured s_meas
seconds for it ran at w / s_meas. Per role and resource, one such rate per round (a device's FP and BP pooled:
Σw / Σs_meas); the fitted value is the **median over rounds**, robust to the round in which the operating system did
not run a rank for a moment (tests/trainers/distributed saw one round of three at 10× its link time on 2 cores). A
resource nothing measured keeps the base system's value. Units: FLOP/s and bit/s.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from adaptplan.errors import InputError
from adaptplan.system import SystemSpec

DEVICE_RESOURCES = {"device FP": "flops", "device BP": "flops", "uplink": "up_bps", "downlink": "down_bps",
                    "model upload": "fed_up_bps", "model download": "fed_down_bps"}
"""A device's stage → the field of its ``DeviceSpec`` the stage runs on (module table)."""
EDGE_RESOURCES = {"server": "server_flops", "model upload": "edge_to_fed_bps", "model download": "fed_to_edge_bps"}
"""The edge server's stage → the field of ``SystemSpec`` it runs on."""
EDGE = "edge"
MAX_ROUNDS_KEPT = 100_000
"""Rates kept per resource (one per round): a history file holding more is refused."""
_KEY = re.compile(r"^(?:devices\[(\d{1,6})\]\.(flops|up_bps|down_bps|fed_up_bps|fed_down_bps)|"
                  r"server_flops|edge_to_fed_bps|fed_to_edge_bps)$")


def resource_of(role: str, stage: str) -> str | None:
    """The system field (``devices[3].up_bps``, ``server_flops``) that ``role`` (a device index as text, or
    ``"edge"``) uses in ``stage``; None for a stage no resource of the system times."""
    if role == EDGE:
        return EDGE_RESOURCES.get(stage)
    name = DEVICE_RESOURCES.get(stage)
    return None if name is None or not role.isdigit() else f"devices[{int(role)}].{name}"


def value_of(system: SystemSpec, key: str) -> float:
    """The value of field ``key`` (``devices[3].up_bps``, ``server_flops``) in ``system``."""
    match = _KEY.match(key)
    if match is None:
        raise InputError(f"{key!r} is not a field of a system", field="measured_system")
    if match[1] is None:
        return float(getattr(system, key))
    index = int(match[1])
    if index >= system.num_devices:
        raise InputError(f"{key!r} names device {index}, but the system has {system.num_devices} devices",
                         field="measured_system")
    return float(getattr(system.devices[index], match[2]))


@dataclass
class MeasuredRates:
    """Per system field, the rate a run measured in each round it was used (module docstring)."""

    rates: dict[str, list[float]] = field(default_factory=dict)

    def add_round(self, system: SystemSpec, simulated: Mapping[str, Mapping[str, float]],
                  measured: Mapping[str, Mapping[str, float]]) -> None:
        """One round: ``simulated`` and ``measured`` seconds per stage and role (``StageLedger.by_role``) under the
        round's ``system``; a (role, stage) with no simulated or no measured seconds adds nothing."""
        work: dict[str, float] = {}
        seconds: dict[str, float] = {}
        for stage, by_role in measured.items():
            for role, spent in by_role.items():
                key = resource_of(str(role), stage)
                predicted = simulated.get(stage, {}).get(str(role), 0.0)
                if key is None or not (predicted > 0 and spent > 0):
                    continue
                work[key] = work.get(key, 0.0) + predicted * value_of(system, key)
                seconds[key] = seconds.get(key, 0.0) + spent
        for key, done in work.items():
            self.rates.setdefault(key, []).append(done / seconds[key])

    def fitted(self, base: SystemSpec) -> SystemSpec:
        """``base`` with every measured field replaced by the median of its rates."""
        values = {key: statistics.median(rates) for key, rates in self.rates.items() if rates}
        devices = list(base.devices)
        top: dict[str, Any] = {}
        for key, value in values.items():
            value_of(base, key)                                   # the field exists in base
            match = _KEY.match(key)
            assert match is not None
            if match[1] is None:
                top[key] = value
            else:
                devices[int(match[1])] = replace(devices[int(match[1])], **{match[2]: value})
        return replace(base, devices=tuple(devices), **top)

    def table(self, base: SystemSpec) -> list[dict[str, Any]]:
        """Per measured field: its ``base`` value, the fitted one, fitted/base and the rounds it rests on."""
        fitted = self.fitted(base)
        return [{"field": key, "base": value_of(base, key), "fitted": value_of(fitted, key),
                 "ratio": value_of(fitted, key) / value_of(base, key), "rounds": len(self.rates[key])}
                for key in sorted(self.rates, key=_order)]

    def to_json(self) -> dict[str, list[float]]:
        return {key: list(rates) for key, rates in self.rates.items()}

    @classmethod
    def from_json(cls, data: Any, where: str = "measured_rates") -> MeasuredRates:
        """Read what :meth:`to_json` wrote (a run's ``history.json`` ``meta.measured_system.rates``), checked."""
        if not isinstance(data, dict):
            raise InputError(f"must be a table of rates per system field, got {type(data).__name__}", field=where)
        rates: dict[str, list[float]] = {}
        for key, values in data.items():
            if not isinstance(key, str) or _KEY.match(key) is None:
                raise InputError(f"{key!r} is not a field of a system", field=where)
            if not isinstance(values, list) or not 0 < len(values) <= MAX_ROUNDS_KEPT or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                    for v in values):
                raise InputError(f"must be a list of 1 to {MAX_ROUNDS_KEPT:,} positive finite rates",
                                 field=f"{where}.{key}")
            rates[key] = [float(v) for v in values]
        return cls(rates)


def _order(key: str) -> tuple[int, str]:
    match = _KEY.match(key)
    return (-1, key) if match is None or match[1] is None else (int(match[1]), match[2])


def run_measured_system(folder: str, flag: str = "--system-from") -> tuple[SystemSpec, MeasuredRates]:
    """The system fitted to what the run in ``folder`` measured (its history.json's ``meta.measured_system``: the
    round-1 system and the measured rates, written by a run of processes, ``train --distributed``), and the rates;
    one :class:`InputError` naming ``flag`` where the folder holds no such run."""
    from pathlib import Path

    from adaptplan.fileio import load_mapping

    path = Path(folder) / "history.json"
    if not path.is_file():
        raise InputError(f"{folder!r} holds no history.json: give the --out folder of a finished adaptplan train run",
                         field=flag)
    meta = load_mapping(path, flag).get("meta")
    measured = meta.get("measured_system") if isinstance(meta, dict) else None
    if not isinstance(measured, dict) or "rates" not in measured or "base" not in measured:
        raise InputError(f"the run in {folder!r} measured nothing: only a run of processes (train --distributed, over "
                         "torch.distributed or MQTT) measures its stages' seconds", field=flag)
    try:
        base = SystemSpec.from_json(measured["base"])
    except (InputError, TypeError, KeyError, AttributeError) as exc:
        raise InputError(f"{path}: meta.measured_system.base is not a system ({exc})", field=flag) from None
    rates = MeasuredRates.from_json(measured["rates"], f"{path}: meta.measured_system.rates")
    return rates.fitted(base), rates
