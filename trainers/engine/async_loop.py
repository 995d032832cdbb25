"""The asynchronous loop of an :class:`~trainers.api.AsyncStrategy` (GAS, docs/algorithms.md "GAS", B.2): one part of the
simulation runtime, apart from the synchronous round.

A global iteration pops the active device whose activation reaches the edge server first (its ready time + T^F +
T^A; ties to the first slot), serves it at once (the server busy while it works), sends the reply back; after
``local_steps`` such steps the device uploads its model (``on_model``) and the strategy's replacement takes its
slot, downloading the global client model. The iteration ends when ``on_model`` aggregates. Between iterations
the loop's state is :class:`AsyncLoopState` (checkpointed as a plain dict, the format of docs/formats.md).

Arrivals the strategy lets wait (``AsyncStrategy.defer``: their replies and the server state would be the same
served later) are :class:`Waiting`: timed as they arrive (the clock does not depend on the values), served
together — one pass instead of one per 16-sample arrival — before any of their devices forwards again or uploads,
when they reach the edge server's pass budget, when the strategy no longer lets them wait, and at the end of the
iteration. Nothing waits between iterations, so a checkpoint never holds a waiting arrival.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from trainers.engine.aggregation import average_at_fed, load_global
from trainers.engine.clock import StageTimes
from trainers.engine.round_data import AsyncLoopState
from trainers.engine.seams import EngineParts
from trainers.engine.sync_round import charged_server_seconds, take_replies
from trainers.roles.messages import Activation, CutGradient, DevicesLost, MessageMismatchError
from trainers.roles.protocol import EDGE, FED, Forward, Upload

if TYPE_CHECKING:  # pragma: no cover
    from trainers.api import AsyncStrategy, RoundContext

Engine = EngineParts   # the engine as its parts see it (trainers.engine.seams)
"""A :class:`trainers.engine.split_engine.SplitEngine` (not imported: the engine imports this module)."""


class Waiting:
    """Arrivals received and not yet served (module docstring), in arrival order."""

    def __init__(self) -> None:
        self.arrivals: list[Activation] = []
        self.devices: set[int] = set()
        self.samples = 0

    def __contains__(self, device: int) -> bool:
        return device in self.devices

    def add(self, arrival: Activation) -> None:
        self.arrivals.append(arrival)
        self.devices.add(arrival.device)
        self.samples += int(arrival.tensor.shape[0])

    def take(self) -> list[Activation]:
        """Every waiting arrival, in arrival order; none waits afterwards."""
        arrivals, self.arrivals, self.devices, self.samples = self.arrivals, [], set(), 0
        return arrivals


def run_async_round(engine: Engine, round_index: int) -> Any:
    """One global iteration of ``engine``'s asynchronous strategy (module docstring): its ``RoundStats``."""
    s = cast("AsyncStrategy", engine.strategy)
    ctx = engine.context(round_index)
    times = engine.stage_times(round_index)
    if engine.async_state is None:
        s.begin(ctx, {j: {k: v.detach().clone() for k, v in engine.template[j].state_dict().items()}
                      for j in range(engine.num_blocks)})
        engine.async_state = AsyncLoopState.start(s.first_devices(ctx))
    st = engine.async_state
    round_start = st.now
    lead: dict[int, float] = {}                # device → T^F + T^A of its batch this round (simulated s)
    waiting = Waiting()
    while True:
        d, arrive = _next_arrival(st, s, ctx, times, lead)
        if d in waiting:                       # its reply first: it forwards with the model its backward leaves
            _serve_waiting(engine, ctx, waiting, times)
        if not _local_step(engine, ctx, st, d, arrive, times, waiting):
            _refill(engine, ctx, st, d, times)            # lost (a real runtime): its slot goes on
            continue
        if st.steps[d] < s.local_steps:
            continue
        if d in waiting:                       # it uploads the model its last backward leaves
            _serve_waiting(engine, ctx, waiting, times)
        uploaded, aggregated = _upload(engine, ctx, st, d, times)
        finished_at = st.clock.get(d, 0.0)
        _refill(engine, ctx, st, d, times)
        if uploaded and aggregated:
            _serve_waiting(engine, ctx, waiting, times)
            st.now = max(st.now, finished_at)
            break
    engine.check_models_finite(round_index)
    stepped = sorted(int(d) for d in engine.timeline.ledger.seconds["device FP"])    # device indices
    return engine.round_stats(ctx, True, stepped, st.now - round_start)


def _next_arrival(st: AsyncLoopState, s: "AsyncStrategy", ctx: "RoundContext", times: StageTimes,
                  lead: dict[int, float]) -> tuple[int, float]:
    """The active device whose activation reaches the edge server first, and when (ready time + T^F + T^A; ties
    to the first slot, B.2). ``lead`` caches each device's T^F + T^A for the round: one pass over the C active
    devices per arrival (it was C² through ``list.index``: minutes a global iteration at 1,000 devices)."""
    best, first = -1, 0.0
    for slot, j in enumerate(st.active):
        if j not in lead:
            lead[j] = (float(times.client_fp[j]) + float(times.upload[j])) * times.scale(j, int(s.batch_size(ctx, j)))
        arrive = st.clock[j] + lead[j]
        if best < 0 or arrive < first:            # strictly earlier: a tie stays with the first slot
            best, first = slot, arrive
    return st.active[best], first


def _local_step(engine: Engine, ctx: "RoundContext", st: AsyncLoopState, d: int, arrive: float,
                times: StageTimes, waiting: Waiting) -> bool:
    """Device ``d``'s step, its activation arriving at ``arrive``: forward, the arrival served at once (or left
    waiting, module docstring), the reply, its backward; False if it was lost."""
    s = cast("AsyncStrategy", engine.strategy)
    b = int(s.batch_size(ctx, d))
    k = times.scale(d, b)
    engine.net.send(d, Forward(ctx.round, [(d, b)]))
    got = engine.net.receive([d], allow_absent=True)
    if not got:
        return False
    (msg,) = got
    engine.timeline.count(msg)
    begin = max(arrive, engine.timeline.server_free)
    answered = begin + float(times.server[d]) * k                 # the reply is computed first (GAS-10) ...
    waiting.add(msg)
    budget = engine.passes.pass_samples
    charged = 0.0
    if not s.defer(engine.passes, ctx, waiting.arrivals) or (budget is not None and waiting.samples >= budget):
        charged = _serve_waiting(engine, ctx, waiting, times, last=True)
    busy = answered - begin + charged                               # ... then the server works on (GAS-5b–8)
    engine.timeline.server_free = begin + busy
    st.clock[d] = answered + (float(times.download[d]) + float(times.client_bp[d])) * k
    for stage, sec in (("device FP", times.client_fp[d] * k), ("uplink", times.upload[d] * k),
                       ("downlink", times.download[d] * k), ("device BP", times.client_bp[d] * k)):
        engine.timeline.ledger.add(d, stage, float(sec))
    engine.timeline.ledger.add("edge", "server", busy)
    st.steps[d] += 1
    return True


def _serve_waiting(engine: Engine, ctx: "RoundContext", waiting: Waiting, times: StageTimes,
                   last: bool = False) -> float:
    """The waiting arrivals served in one call of the strategy's ``serve``, each reply sent to its device (its
    backward); the server seconds the strategy charged, which only ``last`` (served as the last of them arrives)
    may have: a strategy that lets arrivals wait charges nothing for them (``AsyncStrategy.defer``)."""
    arrivals = waiting.take()
    if not arrivals:
        return 0.0
    s = cast("AsyncStrategy", engine.strategy)
    out = s.serve(engine.passes, ctx, arrivals)
    charged = charged_server_seconds(ctx, times)
    if charged and not last:
        raise RuntimeError(f"the asynchronous strategy {s.name} charged server work for arrivals it let wait")
    pending = {a.device: a for a in arrivals}
    replies: dict[int, tuple[float, CutGradient]] = {}
    take_replies(out, pending, replies, 0.0)
    if pending:
        raise MessageMismatchError(f"the asynchronous strategy {s.name} did not answer devices {sorted(pending)}")
    for a in arrivals:
        reply = replies[a.device][1]
        engine.timeline.tally.down += reply.num_bytes
        engine.net.send(a.device, reply)
    return charged


def _upload(engine: Engine, ctx: "RoundContext", st: AsyncLoopState, d: int, times: StageTimes) -> tuple[bool, bool]:
    """Device ``d``'s model to the edge server, which buffers whole models (GAS-11) and sends the flushed ones on
    to the fed server: (uploaded, aggregated); not uploaded if the device was lost meanwhile."""
    s = cast("AsyncStrategy", engine.strategy)
    engine.net.send(d, Upload(d, ctx.round, list(range(engine.num_blocks)), float(ctx.data_sizes[d]), to=EDGE))
    got = engine.net.receive([d], allow_absent=True)
    if not got:
        return False, False
    (upload,) = got
    engine.timeline.tally.up += upload.num_bytes
    st.clock[d] += float(times.model_up[d])
    engine.timeline.ledger.add(d, "model upload", float(times.model_up[d]))
    flushed = s.on_model(ctx, upload)
    if not flushed:
        return True, False
    for u in flushed:
        engine.net.send(FED, u)
    return True, bool(average_at_fed(engine, ctx.round, {j for u in flushed for j in u.blocks}))


def _refill(engine: Engine, ctx: "RoundContext", st: AsyncLoopState, d: int, times: StageTimes) -> None:
    """Device ``d`` leaves its active slot (its local steps done, or lost): the strategy's replacement takes it,
    downloading the global client model when there is one; a lost device with no device present to replace it
    frees its slot (:class:`DevicesLost` when none is left)."""
    s = cast("AsyncStrategy", engine.strategy)
    engine.present()
    ctx.absent = frozenset(engine.absent)
    slot = st.active.index(d)
    new = s.replace(ctx, d, st.active)
    del st.steps[d]
    join = st.clock.pop(d)
    if new in engine.absent:
        del st.active[slot]
        if not st.active:
            raise DevicesLost(f"no device is left to train (lost: {sorted(engine.absent)})")
        return
    st.active[slot] = new
    st.steps[new] = 0
    engine.timeline.tally.down += load_global(engine, new, ctx.round, engine.fresh_client_state)
    st.clock[new] = join + float(times.model_down[new])
    engine.timeline.ledger.add(new, "model download", float(times.model_down[new]))
