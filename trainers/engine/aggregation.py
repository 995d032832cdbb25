"""Client-side model averaging through model messages (eqs. 7, 22–25): one part of the simulation runtime, apart
from the round that asks for it. Devices and the edge server upload their device-specific blocks to the fed
server, which folds each into its running average (|𝒟_i| or equal weights) and finishes it; the averages, or the
global model for a device that missed one, are downloaded. Every transfer is charged on the round's clock and in
the engine's byte counters.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

from trainers.engine.clock import StageTimes
from trainers.engine.head_split import device_blocks, on_device, with_head
from trainers.engine.seams import EngineParts
from trainers.roles.core import robust_flops
from trainers.roles.messages import ModelDownload, ModelUpload
from trainers.roles.protocol import EDGE, FED, Average, Groups, Send, Take, Upload

if TYPE_CHECKING:  # pragma: no cover
    from trainers.api import Aggregation, RoundContext

Engine = EngineParts   # the engine as its parts see it (trainers.engine.seams)
"""A :class:`trainers.engine.split_engine.SplitEngine` (not imported: the engine imports this module)."""


def aggregate(engine: Engine, agg: "Aggregation", ctx: "RoundContext", participants: list[int], times: StageTimes,
              start: float) -> float:
    """Client-side model averaging through model messages: devices and the edge server upload
    device-specific blocks, the fed server averages (|𝒟_i| or equal weights), the averages are
    downloaded. Times: device uploads T_i^{mU} (22), the edge server's by the size it sends
    over r_{e→f} (23); downloads T_i^{mD} (24) and over r_{f→e} (25). Absent devices take no part."""
    devices = engine.present(list(agg.devices) if agg.devices is not None else participants)
    blocks = with_head(engine, agg.blocks)        # a U-shaped split's heads are averaged with the client blocks
    weight = {d: float(ctx.data_sizes[d]) if agg.weights == "data_size" else 1.0 for d in devices}
    send_groups(engine, agg, devices, blocks)
    relayed = relay_uploads(engine, devices, ctx.round, blocks, weight) if engine.strategy.allows_absence else None
    if relayed is not None:
        devices = [d for d in devices if d in relayed]
    edge_up_bits, up_done = 0.0, start
    uploaded: set[int] = set()
    holders: dict[int, int] = {}          # block → the uploads that hold it (what a robust rule sorts)
    for d in devices:   # each upload is folded into the fed server's running average as it is taken
        w = weight[d]
        if relayed is None:          # the fed server checks the upload and weighs it by the edge server's w
            engine.net.send(d, Upload(d, ctx.round, blocks, w))
            engine.net.send(FED, Take(d, weight=w, expect=expected_upload(engine, d, blocks)))
        else:                        # checked by the edge server as it came in; the weight is the edge server's
            engine.net.send(FED, dataclasses.replace(relayed[d], weight=w))
        e = engine.edge.upload(d, ctx.round, blocks, w)
        engine.net.send(FED, e)
        mine = device_blocks(engine, d, blocks)
        uploaded.update(mine, e.blocks)
        for j in {*mine, *e.blocks}:
            holders[j] = holders.get(j, 0) + 1
        engine.timeline.tally.up += engine.blocks_bytes(mine)
        engine.timeline.tally.server += e.num_bytes
        edge_up_bits += 8.0 * e.num_bytes
        if mine:
            seconds = float(times.model_up[d]) * model_share(engine, d, mine)
            engine.timeline.ledger.add(d, "model upload", seconds)
            up_done = max(up_done, start + seconds)
    edge_up = times.edge_up_seconds(edge_up_bits) if edge_up_bits else 0.0
    engine.timeline.ledger.add("edge", "model upload", edge_up)
    up_done = max(up_done, start + edge_up)
    averaged = average_at_fed(engine, ctx.round, uploaded)
    combined = sum(robust_flops(engine.aggregation[0], n, engine.block_values[j]) for j, n in holders.items())
    if combined:            # the fed server's sorts, at f_s (the system gives the fed server no FLOP/s of its own)
        engine.timeline.ledger.add("edge", "server", combined / times.server_flops)
        up_done += combined / times.server_flops
    present = engine.present()
    recipients = recipients_of(agg, devices, present)
    # the devices that did not receive this average hold an older model: a later draw brings them up to date
    engine.stale = (engine.stale | set(present)) - set(recipients)
    if not recipients:     # the next participants download the global model at the start of their round
        return up_done
    return download_global(engine, recipients, ctx.round, [j for j in blocks if j in averaged], "avg", times,
              up_done, edge_devices=devices)


def send_groups(engine: Engine, agg: "Aggregation", devices: Sequence[int], blocks: Sequence[int]) -> None:
    """Where ``agg`` groups the devices, tell the fed server before the uploads it sorts by group; ValueError for
    groups that do not name each device's, or that would average a block the edge server holds (one download of the
    edge server's copies serves every group)."""
    if agg.groups is None:
        return
    if len(agg.groups) != engine.num_devices:
        raise ValueError(f"Aggregation.groups names {len(agg.groups)} groups for {engine.num_devices} devices")
    held = sorted({j for d in devices for j in blocks if not on_device(engine, d, j)})
    if held:
        raise ValueError(f"grouped averaging covers client blocks only; block {held[0]} is on the edge server")
    engine.net.send(FED, Groups(tuple(int(g) for g in agg.groups)))


def recipients_of(agg: "Aggregation", averaged: Sequence[int], present: Sequence[int]) -> list[int]:
    """Who downloads the average of ``averaged`` now (``agg.recipients``); where the devices are grouped, only
    members of a group that had a member averaged (the others keep their group's global model for later)."""
    recipients = {"participants": list(averaged), "all": list(present), "none": []}[agg.recipients]
    if agg.groups is None:
        return recipients
    groups = {agg.groups[d] for d in averaged}
    return [d for d in recipients if agg.groups[d] in groups]


def start_from_global(engine: Engine, participants: Sequence[int], round_index: int, times: StageTimes) -> float:
    """FedAvg under sampling: a participant that missed the last aggregation (``engine.stale``) downloads the
    global model first: its client blocks, and its server copies where the edge server keeps one per device
    (SplitFed V1's, AdaptSFL's non-common part), all averaged blocks. The round's devices start when the last of
    those downloads is done (T_i^{mD}, eq. 24; the edge's over r_{f→e}, eq. 25); 0 s when none was stale."""
    late = [d for d in participants if d in engine.stale]
    engine.stale -= set(late)
    if not late:
        return 0.0
    return download_global(engine, late, round_index, sorted(engine.global_sizes), "global", times, 0.0)


def download_global(engine: Engine, devices: Sequence[int], round_index: int, blocks: Sequence[int], ref: str,
                    times: StageTimes, start: float,
                    edge_devices: Sequence[int] | None = None) -> float:
    """The fed server sends ``blocks`` (``ref``: the average just finished, or the global model) to
    ``devices``: each device its client blocks among them (T_i^{mD}, eq. 24), and the edge server the
    per-device server copies of ``edge_devices`` (default ``devices``) among them, once for all
    (eq. 25). Returns when the last download is done."""
    end, edge_down_bits, edge_msgs = start, 0.0, []
    for d in devices:
        mine = device_blocks(engine, d, blocks)
        if mine:
            engine.net.send(FED, Send(d, d, round_index, "device", {j: (ref, j) for j in mine},
                                      fresh_optimizer=engine.fresh_client_state))
            engine.net.send(d, Take(FED))
            engine.timeline.tally.down += engine.blocks_bytes(mine)
            seconds = float(times.model_down[d]) * model_share(engine, d, mine)
            engine.timeline.ledger.add(d, "model download", seconds)
            end = max(end, start + seconds)
    theirs = {d: [j for j in blocks if not on_device(engine, d, j) and engine.edge.key(d, j)[0] is not None]
              for d in (devices if edge_devices is None else edge_devices)}
    needed = sorted({j for js in theirs.values() for j in js})
    if needed:   # the edge server's blocks come once; it loads one copy per device instance (eq. 25)
        charged = sum(engine.block_bytes[j] for js in theirs.values() for j in js)
        engine.net.send(FED, Send(EDGE, -1, round_index, "edge", {j: (ref, j) for j in needed}, charged_bytes=charged))
        (got,) = engine.net.receive([FED])
        for d, js in theirs.items():
            if js:
                msg = ModelDownload(d, round_index, "edge", {j: got.blocks[j] for j in js})
                edge_down_bits += 8.0 * msg.num_bytes
                engine.timeline.tally.server += msg.num_bytes
                edge_msgs.append(msg)
        engine.edge.download(edge_msgs)
    edge_down = times.edge_down_seconds(edge_down_bits) if edge_down_bits else 0.0
    engine.timeline.ledger.add("edge", "model download", edge_down)
    return max(end, start + edge_down)


def model_share(engine: Engine, device: int, blocks: Sequence[int]) -> float:
    """The share, in bytes, of device ``device``'s own blocks that ``blocks`` (some of them) are: eqs. (22) and (24)
    charge a model transfer δ/r, so moving some blocks (FedConcat's classifier) takes that share of T_i^{mU},
    T_i^{mD}; exactly 1 when all of them move."""
    total = engine.blocks_bytes(device_blocks(engine, device, range(engine.num_blocks)))
    return engine.blocks_bytes(blocks) / total if total else 1.0


def expected_upload(engine: Engine, device: int, blocks: Sequence[int]) -> dict[int, dict[str, tuple[tuple[int, ...], str]]]:
    """What device ``device``'s upload of ``blocks`` holds: those below its cut, with the template's entries, shapes
    and dtypes (:func:`trainers.roles.checks.check_upload`); under a U-shaped split its head's too."""
    schema = engine.upload_schema
    return {j: dict(schema[j]) for j in device_blocks(engine, device, blocks)}


def relay_uploads(engine: Engine, devices: list[int], round_index: int, blocks: list[int],
                  weight: dict[int, float]) -> dict[int, ModelUpload]:
    """The uploads of ``devices`` through the edge server, all asked at once: where the algorithm
    allows absence (SCALA, CycleSL) the edge server waits on them itself, so that a device lost
    before its upload is left out of the average instead of awaited by the fed server."""
    for d in devices:
        engine.net.send(d, Upload(d, round_index, blocks, weight[d], to=EDGE))
    return {u.device: u for u in engine.net.receive(devices, allow_absent=True)}


def average_at_fed(engine: Engine, round_index: int, blocks: set[int]) -> dict[int, int]:
    """The fed server finishes its running average of ``blocks`` (it becomes the global model);
    {block: its size in bytes}."""
    engine.net.send(FED, Average(round_index))
    sizes = {j: engine.block_bytes[j] for j in sorted(blocks)}
    engine.global_sizes.update(sizes)
    return sizes


def load_global(engine: Engine, device: int, round_index: int, fresh_optimizer: bool) -> int:
    """Device ``device`` loads the fed server's global client blocks (those averaged so far; with
    ``fresh_optimizer`` its optimizer state restarts); the bytes downloaded."""
    mine = [j for j in device_blocks(engine, device, range(engine.num_blocks)) if j in engine.global_sizes]
    if not mine:
        return 0
    engine.net.send(FED, Send(device, device, round_index, "device", {j: ("global", j) for j in mine},
                              fresh_optimizer=fresh_optimizer))
    engine.net.send(device, Take(FED))
    return sum(engine.global_sizes[j] for j in mine)
