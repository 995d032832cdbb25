"""Re-partition (Algorithm 1, docs/model.md §5.4): layers move between devices and the edge server without losing
state, through model messages — one part of the simulation runtime.
"""

from __future__ import annotations

from trainers.engine.seams import EngineParts
from trainers.roles.core import weighted_mean
from trainers.roles.messages import BlockState, ModelDownload
from trainers.roles.optim import mean_param_state
from trainers.roles.protocol import EDGE, Upload

Engine = EngineParts   # the engine as its parts see it (trainers.engine.seams)
"""A :class:`trainers.engine.split_engine.SplitEngine` (not imported: the engine imports this module)."""


def repartition(engine: Engine, new: list[int], round_index: int) -> None:
    """Every device and the edge server upload every block with its optimizer state; each instance of the new
    layout ``new`` takes the (count-weighted) average of the old instances its devices used — an exact copy when
    those are identical, as at an aggregation boundary; the devices whose cut moved receive their new blocks.
    The devices that missed the last average have loaded the global model first (the engine's ``set_cuts``;
    neither that nor these transfers are charged on the clock)."""
    old = list(engine.cuts)
    every = range(engine.num_blocks)
    for d in range(engine.num_devices):
        engine.net.send(d, Upload(d, round_index, list(every), 1.0, with_optimizer=True, to=EDGE))
    dev_up = {u.device: u for u in engine.net.receive(list(range(engine.num_devices)))}
    edge_up = {d: engine.edge.upload(d, round_index, every, 1.0, with_optimizer=True, shared=True)
               for d in range(engine.num_devices)}

    def state(d: int, j: int) -> BlockState:
        return dev_up[d].blocks[j] if j < old[d] else edge_up[d].blocks[j]

    old_deepest, new_deepest = max(old), max(new)

    def source(d: int, j: int) -> tuple:
        return ("device", d) if j < old[d] else ("edge", engine.edge.key(d, j, old_deepest))

    edge_msgs = []
    for key in engine.edge.layout(new):
        j = key[1]
        members = [d for d in range(engine.num_devices) if new[d] <= j and engine.edge.key(d, j, new_deepest) == key]
        sources: dict[tuple, list[int]] = {}
        for d in members:
            sources.setdefault(source(d, j), []).append(d)
        if list(sources) == [("edge", key)]:
            continue                                  # untouched instance: keeps its object and state
        states = [state(ds[0], j) for ds in sources.values()]
        merged = BlockState(weighted_mean([s.state for s in states], [float(len(ds)) for ds in sources.values()]),
                            [mean_param_state(list(ps)) for ps in zip(*[s.optimizer or [] for s in states])])
        edge_msgs.append(ModelDownload(members[0], round_index, "edge", {j: merged}))
    for d in range(engine.num_devices):
        if new[d] != old[d]:
            moving = {j: state(d, j) for j in range(old[d], new[d])}
            engine.net.send(d, ModelDownload(d, round_index, "device", moving, cut=new[d]))
    engine.edge.download(edge_msgs, new_cuts=new)
    engine.cuts = new
