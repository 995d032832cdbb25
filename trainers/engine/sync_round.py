"""The synchronous round's group (all algorithms but GAS): one part of the simulation runtime.

A group's participants forward and their activations reach the edge server at the latency model's times; the
server serves them as the strategy's ``server_mode`` says (``barrier``: all at once when the last has arrived;
``arrival``: one at a time in arrival order, busy while it works) — the default parallel step
(``server_step = "parallel"``) chunk by chunk as the devices forward where the runtime may (the devices of a chunk
forward only once the chunk before is answered), a strategy's own ``serve`` with the whole barrier; the replies go
back and the devices back-propagate. A strategy's step in parts (``barrier_step``: the default parallel step, GAPSL's)
is fed a chunk at a time, each chunk's replies delivered at once. SL's hand-offs pass a client model on between groups. Every stage is charged
on the round's :class:`~trainers.engine.round_data.RoundTimeline` (its stage ledger, server free time and bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from trainers.engine.aggregation import expected_upload
from trainers.engine.clock import StageTimes
from trainers.engine.head_split import device_blocks
from trainers.engine.seams import EngineParts
from trainers.roles.messages import Activation, CutGradient, MessageMismatchError
from trainers.roles.protocol import FED, Forward, Send, Take, Upload

if TYPE_CHECKING:  # pragma: no cover
    from trainers.api import BarrierStep, Handoff, RoundContext

Engine = EngineParts   # the engine as its parts see it (trainers.engine.seams)
"""A :class:`trainers.engine.split_engine.SplitEngine` (not imported: the engine imports this module)."""


def run_group(engine: Engine, ctx: "RoundContext", group: list[int], batch: dict[int, int], times: StageTimes,
              start: float) -> float:
    """Run one group of the round from ``start`` (simulated s); when its last device is done."""
    return GroupRun(engine, ctx, list(group), batch, times, start).run()


@dataclass
class GroupRun:
    """One synchronous group as the runtime serves it: what it was given, and its state as messages go — the
    activations not answered yet (``pending``), the replies taken but not yet delivered (``replies``: when each
    was ready), those delivered (``answered``: when, bytes, whether with a gradient); when the edge server is
    free (``server_free``, simulated s) is the round's timeline's. Every path of the group (a barrier or arrivals,
    served whole or chunk by chunk) works on this one state."""

    engine: Engine
    ctx: "RoundContext"
    group: list[int]
    batch: dict[int, int]
    times: StageTimes
    start: float
    pending: dict[int, Activation] = field(default_factory=dict)
    replies: dict[int, tuple[float, CutGradient]] = field(default_factory=dict)
    answered: dict[int, tuple[float, int, bool]] = field(default_factory=dict)
    early: dict[int, tuple[int, bool]] = field(default_factory=dict)   # delivered during a barrier: (bytes, gradient)

    def __post_init__(self) -> None:
        self.server_free = self.start       # the server is free when the group starts

    @property
    def server_free(self) -> float:
        """When the edge server is next free (simulated s): the round's timeline's (``RoundTimeline.server_free``)."""
        return self.engine.timeline.server_free

    @server_free.setter
    def server_free(self, at: float) -> None:
        self.engine.timeline.server_free = at

    def run(self) -> float:
        s, engine = self.engine.strategy, self.engine
        stream = chunk_server(engine, self.ctx, self.group)
        if stream is not None:
            return self._streamed_barrier(stream)
        if s.server_mode == "arrival" and engine.may_stream:
            return self._streamed_arrivals()
        return self._whole()

    def _whole(self) -> float:
        """Every device forwards, then the server serves the group (a barrier at once, or in arrival order)."""
        engine, ctx, s = self.engine, self.ctx, self.engine.strategy
        activations = forward_all(engine, ctx.round, self.group, self.batch)
        self.group = [d for d in self.group if d in activations]      # a lost device sent none (partial participation)
        if not self.group:
            return self.start
        arrival = self._arrivals(self.group)
        for d in self.group:
            self.engine.timeline.count(activations[d])
        events = sorted((arrival[d], d, activations[d]) for d in self.group)
        self.pending = {d: msg for _, d, msg in events}
        if s.server_mode == "barrier":
            out = self._serve_barrier([e[2] for e in events])
            self.server_free = max(e[0] for e in events) + self._server_busy()
            take_replies(out, self.pending, self.replies, self.server_free)
        else:
            for at, _, msg in events:
                self._serve_arrival(msg, at)
        self._flush()
        backward_all(engine, {d: self.replies[d][1] for d in self.group if d in self.replies})
        self.answered = {d: (at, reply.num_bytes, reply.tensor is not None) for d, (at, reply) in self.replies.items()}
        self._answered_at_barrier()
        return self._replies_done()

    def _streamed_arrivals(self) -> float:
        """A group served one arrival at a time (SplitFed V2), its devices forwarding in arrival order one server
        chunk's worth at a time (``EdgePasses.chunked``), each chunk's replies delivered once its arrivals are
        served: a device's forward reads only its own model and data, so this is bit for bit forwarding every
        device first, with the same simulated times, and the round holds one chunk's activations instead of every
        participant's."""
        arrival, chunks = self._chunks_by_arrival()
        for devices in chunks:
            activations = self._forward_chunk(devices)
            self.pending.update((a.device, a) for a in activations)
            for msg in activations:
                self._serve_arrival(msg, arrival[msg.device])
            self._deliver()
        self._flush()
        self._deliver()
        return self._replies_done()

    def _streamed_barrier(self, stream: "BarrierStep") -> float:
        """A barrier served as its devices forward: the devices, in their simulated arrival order, cut into the
        server's chunks (``EdgePasses.chunked``, each device's min(b_i, |𝒟_i|) samples); a chunk's devices forward
        only once the chunk before is served and answered, so the round holds one chunk's activations and client
        graphs. The same computations as serving the whole barrier (the forwards are independent of the server's
        pass) and the same simulated times: every reply arrives at the barrier's time."""
        arrival, chunks = self._chunks_by_arrival()
        for devices in chunks:
            activations = self._forward_chunk(devices)
            self.pending = {a.device: a for a in activations}
            self._answer_early(stream.serve_part(activations))
            if self.pending:
                _never_answered(self.engine, self.pending)
        stream.finish()
        self.server_free = max(arrival.values()) + self._server_busy()
        self._flush()
        self._answered_at_barrier()
        return self._replies_done()

    def _serve_barrier(self, arrivals: list[Activation]) -> list[CutGradient]:
        """A whole barrier: the strategy's step in parts (``barrier_step``; the default parallel step) in the server's
        passes, each pass's replies delivered at once (:meth:`_answer_early`), so the round holds one pass's replies
        and graphs; else its own ``serve`` with every arrival. The replies still to take."""
        s, edge = self.engine.strategy, self.engine.passes
        step = s.barrier_step(edge, self.ctx, [a.device for a in arrivals])
        if step is None:
            return list(s.serve(edge, self.ctx, arrivals))
        for part in edge.chunks(arrivals):
            self._answer_early(step.serve_part(part))
        step.finish()
        return []

    def _serve_arrival(self, msg: Activation, at: float) -> None:
        """``server_mode = "arrival"``: the server takes ``msg`` (arrived at ``at``) when it is free and works its
        share (eqs. 18, 19, and what the strategy charged); it is free again after that."""
        d = msg.device
        begin = max(at, self.server_free)
        out = self.engine.strategy.serve(self.engine.passes, self.ctx, [msg])
        share = float(self.times.server[d]) * self.times.scale(d, self.batch[d]) + charged_server_seconds(self.ctx,
                                                                                                        self.times)
        self.engine.timeline.ledger.add("edge", "server", share)
        take_replies(out, self.pending, self.replies, begin + share)
        self.server_free = begin + share

    def _deliver(self) -> None:
        """Send the replies taken so far to their devices (each back-propagates and steps) and keep only when each
        arrived, its size and whether it carried a gradient."""
        backward_all(self.engine, {d: reply for d, (_, reply) in self.replies.items()})
        self.answered.update((d, (at, reply.num_bytes, reply.tensor is not None))
                             for d, (at, reply) in self.replies.items())
        self.replies.clear()

    def _answer_early(self, out: Sequence[CutGradient]) -> None:
        """Replies of a part of a barrier, taken before the rest is served: checked like the
        others, delivered at once (the device back-propagates and both messages can go), remembered only by their
        size and whether they carry a gradient (they count as arriving at the barrier's time)."""
        taken: dict[int, tuple[float, CutGradient]] = {}
        take_replies(out, self.pending, taken, 0.0)
        for d, (_, reply) in taken.items():
            self.early[d] = (reply.num_bytes, reply.tensor is not None)
        backward_all(self.engine, {d: reply for d, (_, reply) in taken.items()})

    def _answered_at_barrier(self) -> None:
        self.answered.update((d, (self.server_free, size, grad)) for d, (size, grad) in self.early.items())

    def _chunks_by_arrival(self) -> tuple[dict[int, float], list[list[int]]]:
        """Each device's arrival time and the group in arrival order cut into the server's chunks
        (``EdgePasses.chunked``), each device counted by the min(b_i, |𝒟_i|) samples it will draw."""
        arrival = self._arrivals(self.group)
        order = sorted(self.group, key=lambda d: (arrival[d], d))
        return arrival, self.engine.passes.chunked(order, self._drawn)

    def _drawn(self, device: int) -> int:
        """The samples ``device`` draws for a step of ``batch[device]``: min(b_i, |𝒟_i|) (its sampler's rule)."""
        return min(int(self.batch[device]), int(self.ctx.data_sizes[device]))

    def _forward_chunk(self, devices: list[int]) -> list[Activation]:
        """The chunk's devices forward (:func:`forward_all`); their activations, counted, in the chunk's order, each
        checked to carry the min(b_i, |𝒟_i|) samples the chunk was cut for."""
        activations = forward_all(self.engine, self.ctx.round, devices, self.batch)
        for d in devices:
            n, expected = int(activations[d].tensor.shape[0]), self._drawn(d)
            if n != expected:
                raise MessageMismatchError(f"device {d} sent {n} samples in round {self.ctx.round}, expected "
                                           f"{expected} (min(b_i, |D_i|))")
            self.engine.timeline.count(activations[d])
        return [activations[d] for d in devices]

    def _arrivals(self, devices: list[int]) -> dict[int, float]:
        """When each device's activation reaches the edge server: its forward and uplink (eqs. 14, 16), charged to
        the ledger."""
        arrival = {}
        for d in devices:
            k = self.times.scale(d, self.batch[d])
            fp, up = float(self.times.client_fp[d]) * k, float(self.times.upload[d]) * k
            self.engine.timeline.ledger.add(d, "device FP", fp)
            self.engine.timeline.ledger.add(d, "uplink", up)
            arrival[d] = self.start + fp + up
        return arrival

    def _server_busy(self) -> float:
        """Seconds the edge server works on a barrier: every device's share (eqs. 18, 19) and the work the strategy
        charged."""
        times = self.times
        busy = sum(float(times.server[d]) * times.scale(d, self.batch[d]) for d in self.group) + \
            charged_server_seconds(self.ctx, times)
        self.engine.timeline.ledger.add("edge", "server", busy)
        return busy

    def _flush(self) -> None:
        """The strategy's replies still owed once the group's arrivals are served; every activation must be
        answered by then. The server is free after the work the strategy charged for them."""
        out = self.engine.strategy.flush(self.engine.passes, self.ctx)
        extra = charged_server_seconds(self.ctx, self.times)
        self.server_free += extra
        self.engine.timeline.ledger.add("edge", "server", extra)
        take_replies(out, self.pending, self.replies, self.server_free)
        if self.pending:
            _never_answered(self.engine, self.pending)

    def _replies_done(self) -> float:
        """Each reply's downlink and the device's backward (eqs. 15, 17; none for a skipped step): when the group's
        last device is done."""
        end = self.start
        for d in self.group:
            at, size, grad = self.answered[d]
            k = self.times.scale(d, self.batch[d])
            self.engine.timeline.tally.down += size
            down = float(self.times.download[d]) * k if grad else 0.0
            bp = float(self.times.client_bp[d]) * k if grad else 0.0
            self.engine.timeline.ledger.add(d, "downlink", down)
            self.engine.timeline.ledger.add(d, "device BP", bp)
            end = max(end, at + down + bp)
        return end


def chunk_server(engine: Engine, ctx: "RoundContext", group: list[int]) -> "BarrierStep | None":
    """How the runtime serves this barrier chunk by chunk as its devices forward: the strategy's step in parts
    (``barrier_step``: a :class:`~trainers.api.ParallelStep` for the default parallel one, whose chunks are
    independent until the final step; GAPSL's) where it has one and the runtime may (a barrier,
    :attr:`may_stream`, no BatchNorm: ``EdgePasses.concatenate``); else None (the whole barrier is forwarded
    first)."""
    s = engine.strategy
    if s.server_mode != "barrier" or not engine.may_stream or not engine.passes.concatenate:
        return None
    return s.barrier_step(engine.passes, ctx, group)


def _never_answered(engine: Engine, pending: dict) -> None:
    d, msg = next(iter(pending.items()))
    raise MessageMismatchError(f"the activation of device {d} (round {msg.round}, step {msg.step}) was never "
                               f"answered by the {engine.strategy.name} strategy")


def forward_all(engine: Engine, round_index: int, group: Sequence[int], batch: dict[int, int]) -> dict[int, Activation]:
    """Every device of ``group`` runs its client forward (eq. 2) and sends its activation: one
    :class:`~trainers.roles.protocol.Forward` per host (in one process one after the other, or
    devices sharing a cut as one batched call, ``client_batching``; on several processes
    concurrently)."""
    recompute = engine.recompute({d: batch[d] for d in group})
    for members in engine.net.hosts(group):
        engine.net.send(members[0], Forward(round_index, [(d, int(batch[d])) for d in members], recompute))
    out = {}
    for msg in engine.net.receive(list(group), allow_absent=engine.strategy.allows_absence):
        out[msg.device] = msg
    engine.awaiting.update(out)
    return {d: out[d] for d in group if d in out}


def backward_all(engine: Engine, replies: dict[int, CutGradient]) -> None:
    """Deliver each reply to its device, which back-propagates and steps (eq. 6)."""
    for d, reply in replies.items():
        engine.awaiting.discard(d)
        engine.net.send(d, reply)


def charged_server_seconds(ctx: "RoundContext", times: StageTimes) -> float:
    """Seconds of the server work the strategy charged since the last call (RoundContext.charge_server)."""
    samples, flops, backward = ctx.take_server_charges()
    return times.extra_server_seconds(samples, flops, backward) if samples or flops or backward else 0.0


def take_replies(out: Sequence[CutGradient], pending: dict, replies: dict, at: float) -> None:
    for reply in out:
        if reply.device not in pending:
            state = "was already answered" if reply.device in replies else "sent no activation in this group"
            raise MessageMismatchError(f"a gradient for device {reply.device} (round {reply.round}, step {reply.step}), "
                                       f"which {state}")
        del pending[reply.device]
        replies[reply.device] = (at, reply)


def handoff(engine: Engine, h: "Handoff", round_index: int, times: StageTimes, start: float) -> float:
    """Device ``h.source`` → fed server → device ``h.target``: client blocks (and head) with their optimizer state."""
    moved = device_blocks(engine, h.source, range(engine.num_blocks))
    engine.net.send(h.source, Upload(h.source, round_index, moved, 1.0, with_optimizer=True))
    key = engine.next_key()
    engine.net.send(FED, Take(h.source, keep=key, expect=expected_upload(engine, h.source, moved)))
    engine.net.send(FED, Send(h.target, h.target, round_index, "device", {j: ("kept", key, j) for j in moved}))
    engine.net.send(h.target, Take(FED))
    engine.timeline.tally.up += engine.blocks_bytes(moved)
    engine.timeline.tally.down += engine.blocks_bytes(moved)           # the same blocks, on to the next device
    engine.timeline.ledger.add(h.source, "model upload", float(times.model_up[h.source]))
    engine.timeline.ledger.add(h.target, "model download", float(times.model_down[h.target]))
    return start + float(times.model_up[h.source]) + float(times.model_down[h.target])

# ---- aggregation ----------------------------------------------------------------------------------
