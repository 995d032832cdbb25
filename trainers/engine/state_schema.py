"""What an engine's checkpoint state must be before an engine continues from it (docs/formats.md "Checkpoint"):
the checks :meth:`trainers.engine.split_engine.SplitEngine.load_state_dict` runs, next to the state they guard
(:mod:`trainers.engine.state`); the run's own fields are :mod:`trainers.run.checkpoint_schema`'s."""

from __future__ import annotations

from typing import Any

from adaptplan.fileio import is_int, show
from adaptplan.limits import MAX_ROUNDS

ENGINE_KEYS = {"cuts", "interval", "rounds_since_aggregation", "devices", "edge", "fed", "rng", "strategy", "async"}
ENGINE_OPTIONAL = {"absent", "period", "stale"}       # absent from checkpoints written before them


def check_generator_state(value: Any, where: str) -> None:
    """``value`` is numpy's PCG64 generator state as ``bit_generator.state`` gives it (the engine's and each
    device sampler's): its 128-bit ``state`` and odd ``inc`` integers, ``has_uint32`` 0 or 1 and a 32-bit
    ``uinteger``; ValueError naming ``where`` otherwise (issue 67 C3: numpy took ``true`` for 1)."""
    inner = value.get("state") if isinstance(value, dict) else None
    ok = (isinstance(value, dict) and set(value) == {"bit_generator", "state", "has_uint32", "uinteger"}
          and value["bit_generator"] == "PCG64" and isinstance(inner, dict) and set(inner) == {"state", "inc"}
          and all(is_int(inner[k]) and 0 <= inner[k] < 2 ** 128 for k in ("state", "inc")) and inner["inc"] % 2 == 1
          and is_int(value["has_uint32"]) and value["has_uint32"] in (0, 1)
          and is_int(value["uinteger"]) and 0 <= value["uinteger"] < 2 ** 32)
    if not ok:
        raise ValueError(f"{where} must be numpy's PCG64 state {{bit_generator: 'PCG64', state: {{state, inc: "
                         f"integers below 2**128, inc odd}}, has_uint32: 0 or 1, uinteger: below 2**32}}, "
                         f"got {str(value)[:80]}")


def is_device_list(value: Any, num_devices: int) -> bool:
    """Whether ``value`` is a list of distinct device indices 0..num_devices−1 (a checkpoint's device lists)."""
    return (isinstance(value, list) and all(is_int(d) and 0 <= d < num_devices for d in value)
            and len(set(value)) == len(value))


def check_engine_state(state: Any, num_devices: int, strategy: Any) -> dict[str, Any]:
    """The engine part of a checkpoint, checked against an engine of ``num_devices`` devices running ``strategy``
    (its ``legacy_period_key``, ``allows_absence``, ``asynchronous``, ``state_dict`` keys and ``optional_state``), with the lists older
    checkpoints lack filled in (``period`` None, ``stale`` and ``absent`` empty) and an old strategy state's period
    moved to ``period``. ValueError naming the part that does not fit."""
    if not isinstance(state, dict) or not ENGINE_KEYS <= set(state) <= ENGINE_KEYS | ENGINE_OPTIONAL:
        raise ValueError(f"engine state must hold exactly {sorted(ENGINE_KEYS)} (and the absent, period and stale "
                         "devices)")
    legacy = strategy.legacy_period_key
    if legacy is not None and isinstance(state.get("strategy"), dict) and legacy in state["strategy"]:
        state = {**state, "strategy": {k: v for k, v in state["strategy"].items() if k != legacy},
                 "period": state.get("period", state["strategy"][legacy] or None)}
    period, stale = state.get("period"), state.get("stale", [])
    if period is not None and not (period and is_device_list(period, num_devices)):
        raise ValueError(f"engine period must list one or more distinct devices of 0..{num_devices - 1} or be null, "
                         f"got {str(period)[:80]}")
    if not is_device_list(stale, num_devices):
        raise ValueError(f"engine stale must list distinct devices of 0..{num_devices - 1}, got {str(stale)[:80]}")
    absent = state.get("absent", [])
    if not is_device_list(absent, num_devices) or (absent and not strategy.allows_absence):
        raise ValueError(f"engine absent must list distinct devices of 0..{num_devices - 1} of an algorithm "
                         f"that allows absence, got {str(absent)[:80]}")
    for name in ("interval", "rounds_since_aggregation"):
        value = state[name]
        if not is_int(value) or not (1 if name == "interval" else 0) <= value <= MAX_ROUNDS:
            raise ValueError(f"engine {name} must be an integer in [{1 if name == 'interval' else 0}, {MAX_ROUNDS:,}], "
                             f"got {show(value)}")
    if (not isinstance(state["devices"], list) or len(state["devices"]) != num_devices
            or any((s is None) != (d in absent) for d, s in enumerate(state["devices"]))):
        raise ValueError(f"engine devices must hold the state of each of the {num_devices} devices "
                         "(None for exactly the absent ones)")
    check_generator_state(state["rng"], "engine rng")
    cuts = state["cuts"]
    if not isinstance(cuts, list) or len(cuts) != num_devices or not all(is_int(c) for c in cuts):
        raise ValueError(f"engine cuts must list one integer cut per device ({num_devices}), got {str(cuts)[:80]}")
    if not isinstance(state["edge"], dict) or state["edge"].get("cuts") != cuts:
        raise ValueError(f"engine edge state must hold the engine's cuts {str(cuts)[:80]} (the edge server serves them)")
    for d, device in enumerate(state["devices"]):
        if device is not None:
            _check_device_state(d, device, cuts[d])
    _check_fed_state(state["fed"], num_devices)
    mine, optional = set(strategy.state_dict()), set(strategy.optional_state)
    if not isinstance(state["strategy"], dict) or not mine - optional <= set(state["strategy"]) <= mine:
        raise ValueError(f"engine strategy state must hold exactly {sorted(mine)}"
                         + (f" (or without {sorted(optional)}, as written before them)" if optional else ""))
    if state["async"] is not None and (not strategy.asynchronous or not isinstance(state["async"], dict)):
        raise ValueError("engine async state belongs to an asynchronous algorithm's loop only")
    if state["async"] is None and strategy.asynchronous and any(s is not None and s["step"] for s in state["devices"]):
        raise ValueError("engine async state is null only before an asynchronous algorithm's first global iteration "
                         "(no device has stepped)")
    return {**state, "period": period, "stale": stale, "absent": absent}


def _check_fed_state(fed: Any, num_devices: int) -> None:
    """The fed server's state: its global blocks and, where the devices are averaged in groups, one group ≥ 0 per
    device and the global blocks of the groups after the first, keyed by group (ValueError)."""
    if (not isinstance(fed, dict) or "global_blocks" not in fed or not set(fed) <= {"global_blocks", "groups", "group_blocks"}
            or ("groups" in fed) != ("group_blocks" in fed)):
        raise ValueError("engine fed state must hold exactly ['global_blocks'], or with ['group_blocks', 'groups'] "
                         "where the devices are averaged in groups")
    if "groups" not in fed:
        return
    groups = fed["groups"]
    if not isinstance(groups, list) or len(groups) != num_devices or not all(is_int(g) and g >= 0 for g in groups):
        raise ValueError(f"engine fed groups must list one integer group ≥ 0 per device ({num_devices}), "
                         f"got {str(groups)[:80]}")
    blocks = fed["group_blocks"]
    if not isinstance(blocks, dict) or not all(is_int(g) and g > 0 and g in groups for g in blocks):
        raise ValueError(f"engine fed group_blocks must be keyed by groups of the devices after group 0 "
                         f"({sorted(set(groups) - {0})}), got {str(list(blocks) if isinstance(blocks, dict) else blocks)[:80]}")


def _check_device_state(index: int, device: Any, cut: int) -> None:
    """Device ``index``'s state: its cut the engine's cut of it, its step count an integer ≥ 0 (ValueError)."""
    if not isinstance(device, dict) or not {"cut", "blocks", "optimizer", "sampler", "step"} <= set(device):
        raise ValueError(f"engine devices[{index}] must hold the device's cut, blocks, optimizer, sampler and step")
    if not is_int(device["cut"]) or device["cut"] != cut:
        raise ValueError(f"engine devices[{index}].cut must be the engine's cut of device {index} ({show(cut)}), "
                         f"got {show(device['cut'])}")
    if not is_int(device["step"]) or not 0 <= device["step"] <= MAX_ROUNDS:
        raise ValueError(f"engine devices[{index}].step must be an integer in [0, {MAX_ROUNDS:,}], "
                         f"got {show(device['step'])}")
    sampler = device["sampler"]
    if not isinstance(sampler, dict) or "rng" not in sampler:
        raise ValueError(f"engine devices[{index}].sampler must hold its generator's state (rng), order and position")
    check_generator_state(sampler["rng"], f"engine devices[{index}].sampler.rng")
