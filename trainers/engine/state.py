"""A simulation engine's checkpoint state: what :meth:`trainers.engine.split_engine.SplitEngine.state_dict` saves and
:meth:`~trainers.engine.split_engine.SplitEngine.load_state_dict` restores, the latter after
:func:`trainers.engine.state_schema.check_engine_state` has checked it against the engine (docs/formats.md
"Checkpoint")."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from adaptplan.fileio import is_int, show
from trainers.engine.round_data import AsyncLoopState, RoundTimeline
from trainers.engine.seams import EngineParts
from trainers.engine.state_schema import check_engine_state
from trainers.roles.core import check_block_state
from trainers.roles.protocol import FED, GetState, SetState

Engine = EngineParts   # the engine as its parts see it (trainers.engine.seams)


def engine_state(engine: Engine) -> dict[str, Any]:
    """Everything needed to continue bit-identically: every role's state, cuts, I, the aggregation phase, the
    strategy's generator and state, the asynchronous loop's state, and the absent devices (their state is None;
    a run resumed from it takes them back as returning devices: the initial weights, then the global client
    model where there is one)."""
    states = role_states(engine, engine.present())
    return {"cuts": list(engine.cuts), "interval": engine.interval,
            "rounds_since_aggregation": engine.rounds_since_aggregation,
            "devices": [states.get(d) for d in range(engine.num_devices)], "edge": engine.edge.state_dict(),
            "fed": role_states(engine, [FED])[FED], "rng": engine.rng.bit_generator.state,
            "strategy": engine.strategy.state_dict(),
            "async": None if engine.async_state is None else engine.async_state.to_dict(engine.timeline.server_free),
            "absent": sorted(engine.absent), "period": None if engine.period is None else list(engine.period),
            "stale": sorted(engine.stale)}


def role_states(engine: Engine, sources: list[Any]) -> dict[Any, dict[str, Any]]:
    """The checkpoint states of these devices (or FED), by source; a device lost meanwhile has none and becomes
    absent."""
    for source in sources:
        engine.net.send(source, GetState(None if source == FED else source))
    replies = engine.net.receive(sources, allow_absent=engine.strategy.allows_absence)   # (never the fed server's)
    engine.absent |= engine.net.absent_devices()
    return {FED if reply.device is None else reply.device: reply.state for reply in replies}


def restore_engine(engine: Engine, state: dict[str, Any]) -> None:
    """Continue from :func:`engine_state`'s output, checked by :func:`trainers.engine.state_schema.check_engine_state`
    (a ValueError naming the part that does not fit this engine; the run turns it into one message about the
    checkpoint) before anything is restored."""
    state = check_engine_state(state, engine.num_devices, engine.strategy)
    fed_globals = {0: state["fed"]["global_blocks"], **state["fed"].get("group_blocks", {})}
    for blocks in fed_globals.values():
        _check_global_blocks(engine, blocks)
    period, stale, absent = state["period"], state["stale"], state["absent"]
    async_state, server_free = (None, 0.0) if state["async"] is None else \
        AsyncLoopState.from_dict(state["async"], engine.num_devices)
    engine.cuts = engine.check_cuts(state["cuts"])
    engine.interval = int(state["interval"])
    engine.rounds_since_aggregation = int(state["rounds_since_aggregation"])
    engine.absent = set()
    for d, s in enumerate(state["devices"]):
        if s is not None:
            engine.net.send(d, SetState(d, s))
    engine.edge.load_state_dict(state["edge"])
    engine.net.send(FED, SetState(None, state["fed"]))
    engine.global_sizes = {int(j): engine.block_bytes[int(j)] for blocks in fed_globals.values() for j in blocks}
    for d in absent:        # every device is back: the absent ones as returning devices (SplitEngine._take_back)
        engine.load_global(d, 0, fresh_optimizer=True)
    engine.rng.bit_generator.state = state["rng"]
    engine.strategy.load_state_dict(tensors_to(state["strategy"], engine.device))
    engine.strategy.check_state(engine.context(0))
    engine.async_state = async_state
    engine.timeline = RoundTimeline(server_free=server_free,           # releases: what each device's step counts
                                    releases={d: int(s["step"]) for d, s in enumerate(state["devices"]) if s is not None})
    engine.period = None if period is None else list(period)
    engine.stale = set(stale) - set(absent)          # the absent ones came back with the global model above


def _check_global_blocks(engine: Engine, blocks: Any) -> None:
    """ValueError unless ``blocks`` (the fed server's global blocks, its last averages, eq. 7) maps block indices of
    this model to states like the template's blocks, finite: a device that downloads one trains from it."""
    if not isinstance(blocks, dict):
        raise ValueError(f"the fed server's global blocks must map block indices to states, got {type(blocks).__name__}")
    for j, block in blocks.items():
        if not is_int(j) or not 0 <= j < engine.num_blocks:
            raise ValueError(f"the fed server's global blocks name block {show(j)}, not one of 0..{engine.num_blocks - 1}")
        check_block_state(engine.template[j], block, f"the fed server's global block {j}")
        if not all(bool(torch.isfinite(t).all()) for t in block.values() if t.is_floating_point()):
            raise ValueError(f"the fed server's global block {j} holds NaN or infinite values")


def tensors_to(value: Any, device: torch.device) -> Any:
    """``value`` (nested dicts, lists, tuples, dataclasses) with every tensor moved to ``device``."""
    if torch.is_tensor(value):
        return value.to(device)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: tensors_to(getattr(value, f.name), device)
                                             for f in dataclasses.fields(value) if f.init})
    if isinstance(value, dict):
        return {k: tensors_to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        moved = [tensors_to(v, device) for v in value]
        return moved if isinstance(value, list) else tuple(moved)
    return value
