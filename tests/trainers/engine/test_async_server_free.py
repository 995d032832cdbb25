"""The edge server's free time outlives a global iteration of the asynchronous loop (RoundTimeline.server_free):
with a slow server, still busy with a flush when an iteration's last model arrives, the next iteration's first
arrival waits for it. Checked against a run resumed from a checkpoint taken at that moment (which carries
``server_free`` in its ``async`` part, docs/formats.md) and against the rule written out: the first serve of
iteration 2 begins at max(its arrival, the server's free time at the end of iteration 1)."""

from __future__ import annotations

import copy

import numpy as np

from tests.engine_builders import FixedClock, make_data, small_model
from trainers.engine.clock import StageTimes
from trainers.engine.split_engine import SplitEngine
from trainers.strategies import make_strategy

N = 4


def _slow_server() -> FixedClock:
    quick = np.full(N, 0.1)
    return FixedClock(StageTimes(quick, quick, np.full(N, 3.0), quick, quick, np.full(N, 0.01), quick, 1e9, 1e9, 16))


def _engine() -> SplitEngine:
    return SplitEngine(small_model(), [3] * N, make_strategy("gas", {"active": 2, "local_steps": 1, "buffer": 2}),
                       make_data(N, "dirichlet"), {"lr": 0.05, "momentum": 0.0}, batch_size=16, seed=0,
                       clock=_slow_server())


def test_the_next_iteration_waits_for_a_server_still_busy() -> None:
    a = _engine()
    a.run_round(1)
    assert a.timeline.server_free > a.async_state.now      # the flush runs past the iteration's last upload
    busy_until = a.timeline.server_free
    b = _engine()
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert b.timeline.server_free == busy_until
    for t in (2, 3):
        ra, rb = a.run_round(t), b.run_round(t)
        assert ra.sim_seconds == rb.sim_seconds and a.async_state.now == b.async_state.now, t
        if t == 2:      # its first serve begins at busy_until at the earliest and takes 3 s: the iteration ends later
            assert a.async_state.now >= busy_until + 3.0
