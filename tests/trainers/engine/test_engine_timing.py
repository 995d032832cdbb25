"""The simulation runtime's event times (trainers.engine.split_engine, docs/architecture.md "The runtime") against
hand-computed rounds: a clock with fixed, distinct per-device stage seconds, and the round's
simulated seconds and per-stage seconds written out below from the rules of the module docstring —
barrier vs arrival order at the edge server, SL's hand-offs, per-device batch sizes scaling the
per-sample terms, and the aggregation's device and edge-server model messages."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.engine_builders import (
    BP,
    DOWN,
    E2F,
    EDGE_BITS,
    F2E,
    FP,
    MODEL_DOWN,
    MODEL_UP,
    UP,
    B,
    FixedClock,
    make_data,
    small_model,
)
from trainers.engine.clock import StageTimes
from trainers.engine.split_engine import SplitEngine
from trainers.strategies import make_strategy

torch.set_num_threads(1)



def run_one_round(algorithm: str, cuts, batches: dict[int, int] | None = None):
    strategy = make_strategy(algorithm)
    if batches:                          # b_i of the devices named, b for the others
        strategy.batch_size = lambda ctx, d: batches.get(d, ctx.batch_size)
    clock = FixedClock()
    engine = SplitEngine(small_model(), cuts, strategy, make_data(3), {"lr": 0.05}, batch_size=B, seed=0,
                         clock=clock)
    stats = engine.run_round(1)
    assert clock.rounds == [1]
    return stats


def check(stats, seconds: float, stages: dict[str, float]) -> None:
    assert stats.sim_seconds == pytest.approx(seconds, rel=1e-12)
    assert stats.stage_seconds.keys() == stages.keys()
    for name, value in stages.items():
        assert stats.stage_seconds[name] == pytest.approx(value, rel=1e-12), name


def test_barrier_round_waits_for_the_last_arrival() -> None:
    # PSL: one group, the server starts when the last activation arrives (device 0 at 3 + 2 = 5) and works
    # 0.5 + 0.25 + 0.125 = 0.875 s; every reply leaves at 5.875, the round ends at the slowest
    # downlink + backward: 5.875 + max(0.5 + 1, 0.25 + 2, 1 + 0.5) = 8.125; no aggregation
    check(run_one_round("psl", [3, 3, 3]), 8.125,
          {"device FP": 3.0, "uplink": 2.0, "server": 0.875, "downlink": 1.0, "device BP": 2.0})


def test_arrival_order_server_and_aggregation() -> None:
    # SFL-V2: served one at a time in arrival order 1 (1.5), 2 (2.25), 0 (5):
    #   device 1: 1.5 → 1.75, back at 1.75 + 0.25 + 2 = 4.0
    #   device 2: 2.25 → 2.375, back at 2.375 + 1 + 0.5 = 3.875
    #   device 0: 5 → 5.5, back at 5.5 + 0.5 + 1 = 7.0
    # then FedAvg of the client blocks (all on the devices): uploads end at 7 + max(4, 8, 2) = 15, downloads
    # at 15 + max(1, 3, 5) = 20; the shared server model sends nothing
    check(run_one_round("sfl-v2", [3, 3, 3]), 20.0,
          {"device FP": 3.0, "uplink": 2.0, "server": 0.875, "downlink": 1.0, "device BP": 2.0,
           "model upload": 8.0, "model download": 5.0})


def test_an_arrival_waits_while_the_server_works_on_the_one_before() -> None:
    # SFL-V2 with device 2's server share 3 s: device 1 1.5 → 1.75, back at 4.0; device 2 2.25 → 5.25, back
    # at 5.25 + 1 + 0.5 = 6.75; device 0 arrives at 5 while the server is busy: 5.25 → 5.75, back at
    # 5.75 + 0.5 + 1 = 7.25; aggregation + 8 + 5 = 20.25 (served alone at 5 it would end at 20.0)
    slow = StageTimes(FP, UP, np.array([0.5, 0.25, 3.0]), DOWN, BP, MODEL_UP, MODEL_DOWN, E2F, F2E, B)
    engine = SplitEngine(small_model(), [3, 3, 3], make_strategy("sfl-v2"), make_data(3), {"lr": 0.05}, batch_size=B,
                         seed=0, clock=FixedClock(slow))
    check(engine.run_round(1), 20.25,
          {"device FP": 3.0, "uplink": 2.0, "server": 3.75, "downlink": 1.0, "device BP": 2.0,
           "model upload": 8.0, "model download": 5.0})


def test_batch_size_scales_the_per_sample_stages() -> None:
    # device 0 trains on b_0 = 32 = 2b samples: its FP, uplink, server share, downlink and BP double
    # PSL: arrival 2·(3 + 2) = 10, server 2·0.5 + 0.25 + 0.125 = 1.375 → 11.375,
    # end max(11.375 + 2·(0.5 + 1), 11.375 + 2.25, 11.375 + 1.5) = 14.375
    check(run_one_round("psl", [3, 3, 3], {0: 32}), 14.375,
          {"device FP": 6.0, "uplink": 4.0, "server": 1.375, "downlink": 1.0, "device BP": 2.0})
    # SFL-V2 (arrival order 1, 2, 0): devices 1 and 2 as above (back at 4.0 and 3.875); device 0 arrives at
    # 10, served until 10 + 2·0.5 = 11, back at 11 + 2·(0.5 + 1) = 14; aggregation + 8 + 5 = 27
    check(run_one_round("sfl-v2", [3, 3, 3], {0: 32}), 27.0,
          {"device FP": 6.0, "uplink": 4.0, "server": 1.375, "downlink": 1.0, "device BP": 2.0,
           "model upload": 8.0, "model download": 5.0})
    # a smaller batch shrinks them: b_2 = 8, device 2's terms halve (PSL: last arrival still device 0 at 5)
    # server 0.5 + 0.25 + 0.0625 = 0.8125 → 5.8125, end 5.8125 + max(1.5, 2.25, 0.75) = 8.0625
    check(run_one_round("psl", [3, 3, 3], {2: 8}), 8.0625,
          {"device FP": 3.0, "uplink": 2.0, "server": 0.8125, "downlink": 0.5, "device BP": 2.0})


def test_sl_runs_devices_one_after_the_other_with_handoffs() -> None:
    # device 0: 3 + 2 + 0.5 + 0.5 + 1 = 7; hand-off 0 → 1: T^mU_0 + T^mD_1 = 4 + 3 → 14
    # device 1: 14 + 1 + 0.5 + 0.25 + 0.25 + 2 = 18; hand-off 1 → 2: 8 + 5 → 31
    # device 2: 31 + 2 + 0.25 + 0.125 + 1 + 0.5 = 34.875; hand-off 2 → 0 (the next round starts at device 0):
    # 2 + 1 → 37.875. Stage seconds: the largest device's sum per stage; "server" is the edge server's busy
    # time over the round, 0.5 + 0.25 + 0.125
    check(run_one_round("sl", [3, 3, 3]), 37.875,
          {"device FP": 3.0, "uplink": 2.0, "server": 0.875, "downlink": 1.0, "device BP": 2.0,
           "model upload": 8.0, "model download": 5.0})


def test_adaptsfl_aggregation_times_the_edge_servers_model_messages() -> None:
    # cuts (1, 4, 4): L_c = 4; device 0's blocks 1..3 are its non-common part w_{n,0} on the edge server.
    # Training as PSL above: 8.125. Aggregation of blocks 0..3: device uploads end at 8.125 + 8, the edge
    # server's upload of w_{n,0} (EDGE_BITS over E2F) at 8.125 + 20 = 28.125, whichever is later; then the
    # device downloads (28.125 + max(1, 3, 5)) and the edge server's download of the average of w_{n,0}
    # (28.125 + 16 = 44.125)
    stats = run_one_round("adaptsfl", [1, 4, 4])
    check(stats, 44.125, {"device FP": 3.0, "uplink": 2.0, "server": 0.875, "downlink": 1.0, "device BP": 2.0,
                          "model upload": 20.0, "model download": 16.0})
    assert stats.bytes_server == 2 * EDGE_BITS // 8            # w_{n,0} up to the fed server and its average back


# the small CNN cut after block 3 (conv 1→4, ReLU, 2×2 pool): activations of 4×4×4 values per sample, a
# client model of 4·9 + 4 = 40 parameters
ACTIVATION_BYTES = B * 4 * 4 * 4 * 4
LABEL_BYTES = B * 8
CLIENT_BYTES = 40 * 4


def test_gas_asynchronous_loop_times_by_hand() -> None:
    # GAS with N = C = 2 active devices, E = 1 local step: a device's model upload follows each step, a
    # finished device takes its own slot back (no idle device), and two buffered models end a round.
    times = StageTimes(np.array([3.0, 1.0]), np.array([2.0, 0.5]), np.array([4.0, 6.0]), np.array([0.5, 0.25]),
                       np.array([1.0, 2.0]), np.array([4.0, 8.0]), np.array([1.0, 3.0]), 1.0, 1.0, B)
    engine = SplitEngine(small_model(), [3, 3], make_strategy("gas", {"active": 2, "local_steps": 1}), make_data(2),
                         {"lr": 0.05}, batch_size=B, seed=0, clock=FixedClock(times))
    # round 1, both clocks at 0:
    #   device 1 arrives first (1 + 0.5 = 1.5), served 1.5 → 7.5, back at 7.5 + 0.25 + 2 = 9.75, uploads its model
    #     → 17.75, downloads (no global model yet: nothing to load, the time is charged) → 20.75
    #   device 0 arrives at 3 + 2 = 5 but the server is busy until 7.5: served 7.5 → 11.5 (its reply), back at 13,
    #     uploads → 17: the second model, the fed server averages, the round ends at 17; device 0 downloads → 18.
    #     After the reply the buffer (Q_s = 2 batches) flushes: 2·16 real rows, none generated yet (not every label
    #     seen), one forward+backward each at T^S_0/b = 4/16 s: 8 s more, the server busy until 19.5
    # round 2:
    #   device 1 arrives at 20.75 + 1.5 = 22.25, served → 28.25, back at 30.5, uploads → 38.5, downloads → 41.5
    #   device 0 arrives at 18 + 5 = 23, waits for the server until 28.25, served → 32.25, back at 33.75, uploads
    #     → 37.75: the round ends; 37.75 − 17 = 20.75 s. Its flush: 32 real + 128 generated rows, 40 s of server
    stages = {"device FP": 3.0, "uplink": 2.0, "server": 10.0 + 8.0, "downlink": 0.5, "device BP": 2.0,
              "model upload": 8.0, "model download": 3.0}
    first, second = engine.run_round(1), engine.run_round(2)
    check(first, 17.0, stages)
    assert second.metrics["generated"] == 128
    check(second, 20.75, {**stages, "server": 10.0 + 160 * 4.0 / B})
    assert first.participants == second.participants == [0, 1] and first.aggregated
    # bytes: two activations (+ labels) and two model uploads up; two cut gradients down, plus the global client
    # model for every replacement after the first average (one in round 1, two in round 2)
    assert first.bytes_up == second.bytes_up == 2 * (ACTIVATION_BYTES + LABEL_BYTES) + 2 * CLIENT_BYTES
    assert first.bytes_down == 2 * ACTIVATION_BYTES + CLIENT_BYTES
    assert second.bytes_down == 2 * ACTIVATION_BYTES + 2 * CLIENT_BYTES


def test_gas_scales_a_devices_per_sample_stages_with_its_batch() -> None:
    # the GAS case above with device 1 on b_1 = 32 = 2b samples: its FP, uplink, server share, downlink and BP double
    times = StageTimes(np.array([3.0, 1.0]), np.array([2.0, 0.5]), np.array([4.0, 6.0]), np.array([0.5, 0.25]),
                       np.array([1.0, 2.0]), np.array([4.0, 8.0]), np.array([1.0, 3.0]), 1.0, 1.0, B)
    strategy = make_strategy("gas", {"active": 2, "local_steps": 1})
    strategy.batch_size = lambda ctx, d: 32 if d == 1 else ctx.batch_size
    engine = SplitEngine(small_model(), [3, 3], strategy, make_data(2), {"lr": 0.05}, batch_size=B, seed=0,
                         clock=FixedClock(times))
    # round 1: device 1 arrives at 2·1.5 = 3, served 3 → 3 + 2·6 = 15, back at 15 + 2·(0.25 + 2) = 19.5, uploads → 27.5,
    #   downloads → 30.5; device 0 arrives at 5, waits until 15, served → 19, back at 20.5, uploads → 24.5: round ends.
    #   After device 0's reply the buffer flushes: 16 + 32 real + 112 generated rows at T^S_0/b = 4/16 s: 40 s, the
    #   server busy until 59 (2·6 + 4 + 40 = 56 s in the round)
    # round 2: device 0 (ready at 24.5 + 1 = 25.5) arrives at 30.5, waits until 59, served → 63, back at 64.5, uploads →
    #   68.5, downloads → 69.5; device 1 arrives at 30.5 + 3 = 33.5, waits until 63, served → 75, back at 79.5, uploads →
    #   87.5: 87.5 − 24.5 = 63 s. Its flush: 160 rows at T^S_1/b = 6/16 s: 60 s (server 4 + 12 + 60 = 76 s)
    stages = {"device FP": 3.0, "uplink": 2.0, "server": 56.0, "downlink": 0.5, "device BP": 4.0, "model upload": 8.0,
              "model download": 3.0}
    check(engine.run_round(1), 24.5, stages)
    check(engine.run_round(2), 63.0, {**stages, "server": 76.0})   # device 1, replaced at the end, downloads in 3 s
