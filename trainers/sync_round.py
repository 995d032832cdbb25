"""The synchronous round's group (all algorithms but GAS): one part of the simulation runtime.

A group's participants forward and their activations reach the edge server at the latency model's times; the
server serves them as the strategy's ``server_mode`` says (``barrier``: all at once when the last has arrived;
``arrival``: one at a time in arrival order, busy while it works) — the default parallel step
(``server_step = "parallel"``) chunk by chunk as the devices forward where the runtime may (the devices of a chunk
forward only once the chunk before is answered), a strategy's own ``serve`` with the whole barrier; the replies go
back and the devices back-propagate. SL's hand-offs pass a client model on between groups. Every stage is charged
on the round's :class:`~trainers.clock.StageLedger` and the engine's byte counters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from trainers.clock import StageLedger, StageTimes
from trainers.messages import Activation, CutGradient, MessageMismatchError
from trainers.protocol import FED, Forward, Send, Take, Upload

if TYPE_CHECKING:  # pragma: no cover
    from trainers.api import Handoff, ParallelStep, RoundContext

Engine = Any
"""A :class:`trainers.engine.SplitEngine` (not imported: the engine imports this module)."""


def run_group(engine: Engine, ctx: "RoundContext", group: list[int], batch: dict[int, int], times: StageTimes,
               start: float, ledger: StageLedger) -> float:
    s = engine.strategy
    stream = chunk_server(engine, ctx, group)
    if stream is not None:
        return _run_streamed_group(engine, ctx, group, batch, times, start, ledger, stream)
    if s.server_mode == "arrival" and engine._may_stream:
        return _run_streamed_arrivals(engine, ctx, group, batch, times, start, ledger)
    activations = forward_all(engine, ctx.round, group, batch)
    group = [d for d in group if d in activations]      # a lost device sent none (partial participation)
    if not group:
        return start
    arrival = _arrivals(engine, group, batch, times, start, ledger)
    for d in group:
        _count_activation(engine, activations[d])
    events = sorted((arrival[d], d, activations[d]) for d in group)
    pending = {d: msg for _, d, msg in events}
    replies: dict[int, tuple[float, CutGradient]] = {}
    early: dict[int, tuple[int, bool]] = {}       # answered while the server worked: (bytes, with a gradient)
    server_free = start
    if s.server_mode == "barrier":
        at = max(e[0] for e in events)
        ctx.on_reply = lambda out: _answer_early(engine, out, pending, early)
        try:
            out = s.serve(engine.edge, ctx, [e[2] for e in events])
        finally:
            ctx.on_reply = None
        server_free = at + _server_busy(engine, ctx, group, batch, times, ledger)
        take_replies(out, pending, replies, server_free)
    else:
        for at, _, msg in events:
            server_free = _serve_arrival(engine, ctx, msg, at, batch, times, ledger, pending, replies, server_free)
    server_free = _flush(engine, ctx, times, ledger, pending, replies, server_free)
    backward_all(engine, {d: replies[d][1] for d in group if d in replies})
    answered = {d: (at, reply.num_bytes, reply.tensor is not None) for d, (at, reply) in replies.items()}
    answered.update((d, (server_free, size, grad)) for d, (size, grad) in early.items())   # at the barrier's time
    return _replies_done(engine, group, answered, batch, times, start, ledger)


def _serve_arrival(engine: Engine, ctx: "RoundContext", msg: Activation, at: float, batch: dict[int, int], times: StageTimes,
                   ledger: StageLedger, pending: dict, replies: dict, server_free: float) -> float:
    """``server_mode = "arrival"``: the server takes ``msg`` (arrived at ``at``) when it is free and
    works its share (eqs. 18, 19, and what the strategy charged); returns when it is free again."""
    d = msg.device
    begin = max(at, server_free)
    out = engine.strategy.serve(engine.edge, ctx, [msg])
    share = float(times.server[d]) * times.scale(d, batch[d]) + charged_server_seconds(ctx, times)
    ledger.add("edge", "server", share)
    take_replies(out, pending, replies, begin + share)
    return begin + share


def _run_streamed_arrivals(engine: Engine, ctx: "RoundContext", group: list[int], batch: dict[int, int], times: StageTimes,
                           start: float, ledger: StageLedger) -> float:
    """A group served one arrival at a time (SplitFed V2), its devices forwarding in arrival order
    one server chunk's worth at a time (``EdgeServer.chunked``), each chunk's replies delivered
    once its arrivals are served: a device's forward reads only its own model and data, so this
    is bit for bit forwarding every device first, with the same simulated times, and the round
    holds one chunk's activations instead of every participant's."""
    arrival, chunks = _chunks_by_arrival(engine, ctx, group, batch, times, start, ledger)
    pending: dict[int, Activation] = {}
    replies: dict[int, tuple[float, CutGradient]] = {}
    answered: dict[int, tuple[float, int, bool]] = {}
    server_free = start
    for devices in chunks:
        activations = _forward_chunk(engine, ctx, devices, batch)
        pending.update((a.device, a) for a in activations)
        for msg in activations:
            server_free = _serve_arrival(engine, ctx, msg, arrival[msg.device], batch, times, ledger, pending, replies,
                                              server_free)
        _deliver(engine, replies, answered)
    server_free = _flush(engine, ctx, times, ledger, pending, replies, server_free)
    _deliver(engine, replies, answered)
    return _replies_done(engine, group, answered, batch, times, start, ledger)


def _deliver(engine: Engine, replies: dict[int, tuple[float, CutGradient]], answered: dict[int, tuple[float, int, bool]]) -> None:
    """Send the replies taken so far to their devices (each back-propagates and steps) and keep
    only when each arrived, its size and whether it carried a gradient."""
    backward_all(engine, {d: reply for d, (_, reply) in replies.items()})
    answered.update((d, (at, reply.num_bytes, reply.tensor is not None)) for d, (at, reply) in replies.items())
    replies.clear()


def chunk_server(engine: Engine, ctx: "RoundContext", group: list[int]) -> "ParallelStep | None":
    """How the runtime serves this barrier chunk by chunk as its devices forward: a
    :class:`~trainers.api.ParallelStep` where the strategy's server step is the default parallel one
    (``server_step = "parallel"``, whose chunks are independent until the final step) and the runtime may (a
    barrier, :attr:`_may_stream`, no BatchNorm: ``EdgeServer.concatenate``); else None (the whole barrier goes
    to the strategy's ``serve``)."""
    from trainers.api import ParallelStep

    s = engine.strategy
    if s.server_step != "parallel" or s.server_mode != "barrier" or not engine._may_stream or not engine.edge.concatenate:
        return None
    return ParallelStep(engine.edge, ctx, group)


def _run_streamed_group(engine: Engine, ctx: "RoundContext", group: list[int], batch: dict[int, int], times: StageTimes,
                        start: float, ledger: StageLedger, stream: "ParallelStep") -> float:
    """A barrier served as its devices forward: the devices, in their simulated arrival order,
    cut into the server's chunks (``EdgeServer.chunked``, each device's min(b_i, |𝒟_i|) samples);
    a chunk's devices forward only once the chunk before is served and answered, so the round
    holds one chunk's activations and client graphs. The same computations as serving the
    whole barrier (the forwards are independent of the server's pass) and the same simulated
    times: every reply arrives at the barrier's time."""
    arrival, chunks = _chunks_by_arrival(engine, ctx, group, batch, times, start, ledger)
    early: dict[int, tuple[int, bool]] = {}
    for devices in chunks:
        activations = _forward_chunk(engine, ctx, devices, batch)
        pending = {a.device: a for a in activations}
        _answer_early(engine, stream.serve_chunk(activations), pending, early)
        if pending:
            _never_answered(engine, pending)
    stream.finish()
    server_free = max(arrival.values()) + _server_busy(engine, ctx, group, batch, times, ledger)
    server_free = _flush(engine, ctx, times, ledger, {}, {}, server_free)
    answered = {d: (server_free, size, grad) for d, (size, grad) in early.items()}
    return _replies_done(engine, group, answered, batch, times, start, ledger)


def _chunks_by_arrival(engine: Engine, ctx: "RoundContext", group: list[int], batch: dict[int, int], times: StageTimes,
                       start: float, ledger: StageLedger) -> tuple[dict[int, float], list[list[int]]]:
    """Each device's arrival time (:meth:`_arrivals`) and the group in arrival order cut into the
    server's chunks (``EdgeServer.chunked``), each device counted by the min(b_i, |𝒟_i|) samples
    it will draw."""
    arrival = _arrivals(engine, group, batch, times, start, ledger)
    order = sorted(group, key=lambda d: (arrival[d], d))
    return arrival, engine.edge.chunked(order, lambda d: _drawn(ctx, batch, d))


def _drawn(ctx: "RoundContext", batch: dict[int, int], device: int) -> int:
    """The samples ``device`` draws for a step of ``batch[device]``: min(b_i, |𝒟_i|) (its sampler's rule)."""
    return min(int(batch[device]), int(ctx.data_sizes[device]))


def _forward_chunk(engine: Engine, ctx: "RoundContext", devices: list[int], batch: dict[int, int]) -> list[Activation]:
    """The chunk's devices forward (:meth:`_forward_all`); their activations, counted, in the chunk's
    order, each checked to carry the min(b_i, |𝒟_i|) samples the chunk was cut for."""
    activations = forward_all(engine, ctx.round, devices, batch)
    for d in devices:
        n, expected = int(activations[d].tensor.shape[0]), _drawn(ctx, batch, d)
        if n != expected:
            raise MessageMismatchError(f"device {d} sent {n} samples in round {ctx.round}, expected {expected} "
                                       f"(min(b_i, |D_i|))")
        _count_activation(engine, activations[d])
    return [activations[d] for d in devices]


def _arrivals(engine: Engine, group: list[int], batch: dict[int, int], times: StageTimes, start: float,
              ledger: StageLedger) -> dict[int, float]:
    """When each device's activation reaches the edge server: its forward and uplink (eqs. 14, 16),
    charged to the ledger."""
    arrival = {}
    for d in group:
        k = times.scale(d, batch[d])
        fp, up = float(times.client_fp[d]) * k, float(times.upload[d]) * k
        ledger.add(d, "device FP", fp)
        ledger.add(d, "uplink", up)
        arrival[d] = start + fp + up
    return arrival


def _count_activation(engine: Engine, msg: Activation) -> None:
    engine.bytes_up += msg.num_bytes
    engine.samples += int(msg.tensor.shape[0])


def _server_busy(engine: Engine, ctx: "RoundContext", group: list[int], batch: dict[int, int], times: StageTimes,
                 ledger: StageLedger) -> float:
    """Seconds the edge server works on a barrier: every device's share (eqs. 18, 19) and the work
    the strategy charged."""
    busy = sum(float(times.server[d]) * times.scale(d, batch[d]) for d in group) + charged_server_seconds(ctx, times)
    ledger.add("edge", "server", busy)
    return busy


def _flush(engine: Engine, ctx: "RoundContext", times: StageTimes, ledger: StageLedger, pending: dict, replies: dict,
           server_free: float) -> float:
    """The strategy's replies still owed once the group's arrivals are served; every activation
    must be answered by then. Returns when the server is free."""
    out = engine.strategy.flush(engine.edge, ctx)
    extra = charged_server_seconds(ctx, times)
    server_free += extra
    ledger.add("edge", "server", extra)
    take_replies(out, pending, replies, server_free)
    if pending:
        _never_answered(engine, pending)
    return server_free


def _never_answered(engine: Engine, pending: dict) -> None:
    d, msg = next(iter(pending.items()))
    raise MessageMismatchError(f"the activation of device {d} (round {msg.round}, step {msg.step}) was never "
                               f"answered by the {engine.strategy.name} strategy")


def _replies_done(engine: Engine, group: list[int], answered: dict[int, tuple[float, int, bool]], batch: dict[int, int],
                  times: StageTimes, start: float, ledger: StageLedger) -> float:
    """Each reply's downlink and the device's backward (eqs. 15, 17; none for a skipped step): when
    the group's last device is done."""
    end = start
    for d in group:
        at, size, grad = answered[d]
        k = times.scale(d, batch[d])
        engine.bytes_down += size
        down = float(times.download[d]) * k if grad else 0.0
        bp = float(times.client_bp[d]) * k if grad else 0.0
        ledger.add(d, "downlink", down)
        ledger.add(d, "device BP", bp)
        end = max(end, at + down + bp)
    return end


def _answer_early(engine: Engine, out: Sequence[CutGradient], pending: dict, early: dict[int, tuple[int, bool]]) -> None:
    """Replies a barrier's serve handed over before returning (``RoundContext.reply_now``): checked
    like the others, delivered at once (the device back-propagates and both messages can go),
    remembered only by their size and whether they carry a gradient."""
    taken: dict[int, tuple[float, CutGradient]] = {}
    take_replies(out, pending, taken, 0.0)
    for d, (_, reply) in taken.items():
        early[d] = (reply.num_bytes, reply.tensor is not None)
    backward_all(engine, {d: reply for d, (_, reply) in taken.items()})


def forward_all(engine: Engine, round_index: int, group: Sequence[int], batch: dict[int, int]) -> dict[int, Activation]:
    """Every device of ``group`` runs its client forward (eq. 2) and sends its activation: one
    :class:`~trainers.protocol.Forward` per host (in one process one after the other, or
    devices sharing a cut as one batched call, ``client_batching``; on several processes
    concurrently)."""
    recompute = engine.recompute(sum(int(batch[d]) for d in group))
    for members in engine.net.hosts(group):
        engine.net.send(members[0], Forward(round_index, [(d, int(batch[d])) for d in members], recompute))
    out = {}
    for msg in engine.net.receive(list(group), allow_absent=engine.strategy.allows_absence):
        out[msg.device] = msg
    engine._awaiting.update(out)
    return {d: out[d] for d in group if d in out}


def backward_all(engine: Engine, replies: dict[int, CutGradient]) -> None:
    """Deliver each reply to its device, which back-propagates and steps (eq. 6)."""
    for d, reply in replies.items():
        engine._awaiting.discard(d)
        engine.net.send(d, reply)


def charged_server_seconds(ctx: "RoundContext", times: StageTimes) -> float:
    """Seconds of the server work the strategy charged since the last call (RoundContext.charge_server)."""
    samples, flops = ctx.take_server_charges()
    return times.extra_server_seconds(samples, flops) if samples or flops else 0.0


def take_replies(out: Sequence[CutGradient], pending: dict, replies: dict, at: float) -> None:
    for reply in out:
        if reply.device not in pending:
            state = "was already answered" if reply.device in replies else "sent no activation in this group"
            raise MessageMismatchError(f"a gradient for device {reply.device} (round {reply.round}, step {reply.step}), "
                                       f"which {state}")
        del pending[reply.device]
        replies[reply.device] = (at, reply)


def handoff(engine: Engine, h: "Handoff", round_index: int, times: StageTimes, start: float, ledger: StageLedger) -> float:
    """Device ``h.source`` → fed server → device ``h.target``: client blocks with their optimizer state."""
    moved = list(range(engine.cuts[h.source]))
    engine.net.send(h.source, Upload(h.source, round_index, moved, 1.0, with_optimizer=True))
    key = engine._key()
    engine.net.send(FED, Take(h.source, keep=key))
    engine.net.send(FED, Send(h.target, h.target, round_index, "device", {j: ("kept", key, j) for j in moved}))
    engine.net.send(h.target, Take(FED))
    engine.bytes_up += engine.blocks_bytes(moved)
    engine.bytes_down += engine.blocks_bytes(moved)           # the same blocks, on to the next device
    ledger.add(h.source, "model upload", float(times.model_up[h.source]))
    ledger.add(h.target, "model download", float(times.model_down[h.target]))
    return start + float(times.model_up[h.source]) + float(times.model_down[h.target])

# ---- aggregation ----------------------------------------------------------------------------------
