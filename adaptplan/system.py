"""`SystemSpec`: devices, edge server and fed server (docs/formats.md "System").

Units: compute in FLOP/s, link rates in bit/s, batch size in samples. ``up_bps``/``down_bps`` are
device ↔ edge server (r_i^U, r_i^D), ``fed_up_bps``/``fed_down_bps`` device ↔ fed server
(r_i^{fU}, r_i^{fD}), ``edge_to_fed_bps``/``fed_to_edge_bps`` are r_{e→f}, r_{f→e}.
Optional ``memory_bytes`` (bytes) is a device's memory budget for its client part: given on every
device or on none; a cut j is admissible for device i only if the profile's
``client_memory_bytes`` of j is ≤ it (:mod:`solvers.memory`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from adaptplan.errors import InputError
from adaptplan.fileio import (
    MAX_MAGNITUDE,
    MIN_POSITIVE,
    check_keys,
    int_in_range,
    load_file,
    non_empty_list,
    number_in_range,
    positive_int,
    positive_number,
    save_json,
    save_text,
    toml_value,
)
from adaptplan.limits import MAX_BATCH_SIZE, MAX_DEVICES, MAX_NOISE_CV, MAX_SEED

DEVICE_FIELDS = ("flops", "up_bps", "down_bps", "fed_up_bps", "fed_down_bps")
DEVICE_OPTIONAL = ("memory_bytes",)
_TOP_FIELDS = ("batch_size", "server_flops", "edge_to_fed_bps", "fed_to_edge_bps", "devices")
UNITS = {"flops": "FLOP/s", "server_flops": "FLOP/s", "memory_bytes": "bytes"}   # every other rate is in bit/s


def unit_of(name: str) -> str:
    """The unit of a system field (``flops`` → FLOP/s, ``up_bps`` → bit/s)."""
    return UNITS.get(name, "bit/s")


@dataclass(frozen=True)
class DeviceSpec:
    """One edge device: ``flops`` f_i in FLOP/s, its four link rates in bit/s and an optional memory
    budget ``memory_bytes`` (bytes) for its client part (``None`` = unconstrained)."""

    flops: float
    up_bps: float
    down_bps: float
    fed_up_bps: float
    fed_down_bps: float
    memory_bytes: float | None = None

    def to_json(self) -> dict[str, float]:
        data = {name: getattr(self, name) for name in DEVICE_FIELDS}
        if self.memory_bytes is not None:
            data["memory_bytes"] = self.memory_bytes
        return data


def _plainly_positive(devices: tuple[DeviceSpec, ...]) -> bool:
    """Whether every device field, and ``memory_bytes`` where a device gives it, is an int or float in
    [MIN_POSITIVE, MAX_MAGNITUDE] — exactly what :func:`~adaptplan.fileio.positive_number` accepts of those
    types: :meth:`SystemSpec.validate`'s per-value checks in one pass, without building a message per value.
    False for anything else (a subclass of float included), which the per-value checks then judge and name."""
    return all(type(v) in (int, float) and MIN_POSITIVE <= v <= MAX_MAGNITUDE
               for d in devices for v in [*(getattr(d, name) for name in DEVICE_FIELDS),
                                          *(() if d.memory_bytes is None else (d.memory_bytes,))])


@dataclass(frozen=True)
class SystemSpec:
    """The network and compute resources of one round; see the module docstring for units."""

    batch_size: int
    server_flops: float
    edge_to_fed_bps: float
    fed_to_edge_bps: float
    devices: tuple[DeviceSpec, ...]

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`InputError` naming the device and field of any non-positive value."""
        positive_int(self.batch_size, "system.batch_size", MAX_BATCH_SIZE, "samples")
        for name in _TOP_FIELDS[1:4]:
            positive_number(getattr(self, name), f"system.{name}", unit_of(name))
        if not self.devices:
            raise InputError("must list at least one device", field="system.devices")
        if len(self.devices) > MAX_DEVICES:
            raise InputError(f"must list at most {MAX_DEVICES:,} devices, got {len(self.devices):,}", field="system.devices")
        if not _plainly_positive(self.devices):    # the per-value checks, which name the first bad value
            for i, device in enumerate(self.devices):
                for name in DEVICE_FIELDS:
                    positive_number(getattr(device, name), f"system.devices[{i}].{name}", unit_of(name))
                if device.memory_bytes is not None:
                    positive_number(device.memory_bytes, f"system.devices[{i}].memory_bytes", "bytes")
        given = [d.memory_bytes is not None for d in self.devices]
        if any(given) and not all(given):
            missing = given.index(False) if given[0] else given.index(True)
            raise InputError(f"memory_bytes must be given on every device or on none; device {missing} "
                             f"{'lacks it' if given[0] else 'has it but device 0 does not'}",
                             field=f"system.devices[{missing}].memory_bytes")

    @property
    def memory_limited(self) -> bool:
        """Whether the devices carry memory budgets (``memory_bytes``)."""
        return self.devices[0].memory_bytes is not None

    def memory_budgets(self) -> np.ndarray | None:
        """Per-device memory budgets in bytes, shape (N,), or ``None`` when not given."""
        return self.device_array("memory_bytes") if self.memory_limited else None

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def device_array(self, name: str) -> np.ndarray:
        """One device field as an array of shape (N,), e.g. ``device_array("flops")``."""
        return np.array([getattr(d, name) for d in self.devices], dtype=float)

    def to_json(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "server_flops": self.server_flops,
            "edge_to_fed_bps": self.edge_to_fed_bps,
            "fed_to_edge_bps": self.fed_to_edge_bps,
            "devices": [d.to_json() for d in self.devices],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "SystemSpec":
        check_keys(data, _TOP_FIELDS, (), "system")
        devices_data = non_empty_list(data["devices"], "system.devices", "a non-empty list of devices", MAX_DEVICES)
        devices = []
        for i, entry in enumerate(devices_data):
            where = f"system.devices[{i}]"
            check_keys(entry, DEVICE_FIELDS, DEVICE_OPTIONAL, where)
            devices.append(DeviceSpec(**{name: positive_number(entry[name], f"{where}.{name}", unit_of(name))
                                         for name in DEVICE_FIELDS + DEVICE_OPTIONAL if name in entry}))
        return cls(
            batch_size=positive_int(data["batch_size"], "system.batch_size", MAX_BATCH_SIZE, "samples"),
            **{name: positive_number(data[name], f"system.{name}", unit_of(name)) for name in _TOP_FIELDS[1:4]},
            devices=tuple(devices),
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SystemSpec":
        return load_file(path, "system", cls.from_json)

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON, or TOML when the path ends in ``.toml``."""
        if str(path).endswith(".toml"):
            save_text(to_toml(self.to_json()), path)
        else:
            save_json(self.to_json(), path)


def to_toml(data: Mapping[str, Any]) -> str:
    """Serialise a system mapping (scalars + a ``devices`` array of tables) as TOML."""
    lines = [f"{k} = {toml_value(v)}" for k, v in data.items() if k != "devices"]
    for device in data["devices"]:
        lines += ["", "[[devices]]"] + [f"{k} = {toml_value(v)}" for k, v in device.items()]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class SystemRanges:
    """Uniform ranges for :func:`generate_system`.

    Defaults are the **placeholder** values of docs/model.md §6.1 [P] (the paper's Table II
    numbers were not recovered): device FLOP/s ~ U[0.5, 1.5]·10¹², server 50·10¹² FLOP/s,
    uplinks (edge and fed) ~ U[70, 80] Mbit/s, downlinks ~ U[350, 380] Mbit/s, edge↔fed
    500 Mbit/s, batch 16.
    """

    device_flops: tuple[float, float] = (0.5e12, 1.5e12)
    up_bps: tuple[float, float] = (70e6, 80e6)
    down_bps: tuple[float, float] = (350e6, 380e6)
    server_flops: float = 50e12
    edge_fed_bps: float = 500e6
    batch_size: int = 16

    def __post_init__(self) -> None:
        for name, unit in (("device_flops", "FLOP/s"), ("up_bps", "bit/s"), ("down_bps", "bit/s")):
            low, high = getattr(self, name)
            positive_number(low, f"{name} (low)", unit)
            positive_number(high, f"{name} (high)", unit)
            if high < low:
                raise InputError(f"range must have low ≤ high, got [{low}, {high}]", field=name)
        positive_number(self.server_flops, "server_flops", "FLOP/s")
        positive_number(self.edge_fed_bps, "edge_fed_bps", "bit/s")
        positive_int(self.batch_size, "batch_size", MAX_BATCH_SIZE, "samples")


def scaled_ranges(ranges: SystemRanges, device_flops: float = 1.0, bandwidth: float = 1.0) -> SystemRanges:
    """``ranges`` with the device FLOP/s range multiplied by ``device_flops`` and every link rate
    (uplinks, downlinks, edge↔fed) by ``bandwidth`` — the resource sweeps of AdaptSFL's Figs. 7–8."""
    if not (device_flops > 0 and bandwidth > 0 and np.isfinite(device_flops) and np.isfinite(bandwidth)):
        raise InputError(f"scale factors must be finite and > 0, got device-flops={device_flops}, "
                         f"bandwidth={bandwidth}", field="sweep")
    return replace(ranges, device_flops=(device_flops * ranges.device_flops[0], device_flops * ranges.device_flops[1]),
                   up_bps=(bandwidth * ranges.up_bps[0], bandwidth * ranges.up_bps[1]),
                   down_bps=(bandwidth * ranges.down_bps[0], bandwidth * ranges.down_bps[1]),
                   edge_fed_bps=bandwidth * ranges.edge_fed_bps)


def generate_system(num_devices: int, seed: int, ranges: SystemRanges = SystemRanges()) -> SystemSpec:
    """Draw a system with ``num_devices`` devices from uniform ``ranges`` (numpy ``default_rng(seed)``)."""
    positive_int(num_devices, "devices", MAX_DEVICES, "devices")
    int_in_range(seed, "seed", 0, MAX_SEED)
    rng = np.random.default_rng(seed)
    return SystemSpec(
        batch_size=ranges.batch_size,
        server_flops=ranges.server_flops,
        edge_to_fed_bps=ranges.edge_fed_bps,
        fed_to_edge_bps=ranges.edge_fed_bps,
        devices=tuple(_draw_device(rng, ranges) for _ in range(num_devices)),
    )


def with_memory_budgets(system: SystemSpec, memory_bytes: tuple[float, float], seed: int) -> SystemSpec:
    """``system`` with every device's ``memory_bytes`` drawn log-uniformly in [low, high] bytes (its own
    random stream, ``default_rng([seed, 1])``, so the other fields are unchanged)."""
    low, high = (positive_number(v, "memory_bytes") for v in memory_bytes)
    if high < low:
        raise InputError(f"range must have low ≤ high, got [{low}, {high}]", field="memory_bytes")
    draws = np.exp(np.random.default_rng([seed, 1]).uniform(np.log(low), np.log(high), system.num_devices))
    return replace(system, devices=tuple(replace(d, memory_bytes=float(m)) for d, m in zip(system.devices, draws)))


def _draw_device(rng: np.random.Generator, ranges: SystemRanges) -> DeviceSpec:
    return DeviceSpec(
        flops=float(rng.uniform(*ranges.device_flops)),
        up_bps=float(rng.uniform(*ranges.up_bps)),
        down_bps=float(rng.uniform(*ranges.down_bps)),
        fed_up_bps=float(rng.uniform(*ranges.up_bps)),
        fed_down_bps=float(rng.uniform(*ranges.down_bps)),
    )


class SystemProcess:
    """Per-round system states (the AdaptSFL experiments re-draw device FLOP/s and rates every round).

    ``state(t)`` is deterministic in (seed, t): round t's system, with device FLOP/s and uplink
    rates re-drawn from ``ranges`` when ``redraw`` is true (docs/model.md §6.1), and multiplicative Gaussian
    measurement noise of coefficient of variation ``noise_cv`` applied to ``measured(t)`` — what
    a planner sees — but not to ``state(t)`` — what the clock charges (the Fig. 9 robustness setting).
    """

    def __init__(self, base: SystemSpec, seed: int = 0, redraw: bool = False, noise_cv: float = 0.0,
                 ranges: SystemRanges = SystemRanges()) -> None:
        number_in_range(noise_cv, "noise_cv", 0.0, MAX_NOISE_CV)
        int_in_range(seed, "seed", 0, MAX_SEED)
        self.base, self.seed, self.redraw, self.noise_cv, self.ranges = base, seed, redraw, noise_cv, ranges

    def state(self, round_index: int) -> SystemSpec:
        """The true system in round ``round_index`` (1-based)."""
        if not self.redraw:
            return self.base
        rng = np.random.default_rng([self.seed, round_index])
        # per device, in this order: flops, up_bps, fed_up_bps — one call drawing them row by row, the same
        # numbers as one scalar draw after the other
        bounds = np.array([self.ranges.device_flops, self.ranges.up_bps, self.ranges.up_bps])
        draws = rng.uniform(bounds[:, 0], bounds[:, 1], size=(len(self.base.devices), 3)).tolist()
        devices = tuple(DeviceSpec(flops, up, d.down_bps, fed_up, d.fed_down_bps, d.memory_bytes)
                        for d, (flops, up, fed_up) in zip(self.base.devices, draws))
        return replace(self.base, devices=devices)

    def measured(self, round_index: int) -> SystemSpec:
        """What a planner measures in round ``round_index``: the true state with Gaussian noise (CV ``noise_cv``),
        clipped to stay positive."""
        truth = self.state(round_index)
        if self.noise_cv == 0:
            return truth
        rng = np.random.default_rng([self.seed, round_index, 1])

        def noisy(value: float) -> float:
            return float(value * max(1e-3, 1.0 + self.noise_cv * rng.standard_normal()))

        devices = tuple(DeviceSpec(**{name: noisy(getattr(d, name)) for name in DEVICE_FIELDS},
                                   memory_bytes=d.memory_bytes) for d in truth.devices)
        return replace(truth, devices=devices, server_flops=noisy(truth.server_flops),
                       edge_to_fed_bps=noisy(truth.edge_to_fed_bps), fed_to_edge_bps=noisy(truth.fed_to_edge_bps))
