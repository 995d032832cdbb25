"""Partial participation under churn (docs/mqtt.md "Churn"): where the algorithm allows absence
(SCALA, CycleSL, GAS) a device lost in a real runtime leaves the run and the others go on; it is never
chosen again, its model is left out of every average and evaluation, and a checkpoint keeps it absent.

The loss is played in one process by :class:`LosingNetwork`: the simulator's network in which the
host of some devices dies at the start of a round (nothing more reaches them, nothing comes back),
which is what the ranks' network reports after a device rank died or stayed silent past the time-out
(tests/trainers/distributed/test_mqtt.py kills a real device process)."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import pytest
import torch

from tests.engine_builders import flat, make_data, small_model
from trainers.api import AsyncStrategy, RoundContext, sample_devices
from trainers.engine.network import LocalNetwork
from trainers.engine.split_engine import SplitEngine, local_network
from trainers.roles.core import Device
from trainers.roles.messages import DevicesLost
from trainers.roles.protocol import Forward, GetState, Send, Upload
from trainers.strategies import make_strategy

torch.set_num_threads(1)


class LosingNetwork(LocalNetwork):
    """The simulator's network in which devices ``victims`` are lost from round ``at`` on (with
    ``die_on`` a message type, in round ``at`` only when sent one: an Upload, after their forward; a
    GetState, at a checkpoint); from round ``back`` their host is a new process (``fresh(d)``:
    device d as set up at the start)."""

    def __init__(self, local: LocalNetwork, victims: set[int], at: int, back: int = 10 ** 9,
                 fresh: Callable[[int], Device] | None = None, die_on: type | None = None) -> None:
        super().__init__(local.device_host, local.fed_host)
        self.victims, self.at, self.back, self.fresh, self.round = set(victims), at, back, fresh, 0
        self.die_on, self.die_from = die_on, at
        if die_on is not None:
            self.at = 10 ** 9

    @property
    def dead(self) -> set[int]:
        return self.victims if self.at <= self.round < self.back else set()

    def readmit(self) -> list[int]:
        self.round += 1                             # the engine takes devices back before the round begins
        if self.round != self.back or self.fresh is None:
            return []
        for d in self.victims:
            self.device_host.devices[d] = self.fresh(d)
        return sorted(self.victims)

    def begin_round(self, round_index: int, clock: Any) -> None:
        self.round = round_index

    def send(self, to: Any, msg: Any) -> None:
        if self.die_on is not None and isinstance(msg, self.die_on) and to in self.victims and self.round >= self.die_from:
            self.at, self.die_on = self.round, None                  # dies now, before it answers
        if isinstance(msg, Forward):
            items = [item for item in msg.items if item[0] not in self.dead]
            if items:
                super().send(items[0][0], Forward(msg.round, items, msg.recompute))
            return
        if to in self.dead or (isinstance(msg, Send) and msg.device in self.dead):
            return
        super().send(to, msg)

    def receive(self, sources: Sequence[Any], allow_absent: bool = False) -> list[Any]:
        lost = [s for s in sources if s in self.dead]
        if lost and not allow_absent:
            raise AssertionError(f"the engine waited on lost devices {lost} without allowing absence")
        return super().receive([s for s in sources if s not in self.dead])

    def absent_devices(self) -> set[int]:
        return set(self.dead)

    def device_blocks(self, device: int) -> Any:
        return None if device in self.dead else super().device_blocks(device)


def engine(algorithm: str, devices: int, options: dict[str, Any], victims: set[int] = frozenset(), at: int = 10 ** 9,
           interval: int = 2, cut: int = 3, back: int = 10 ** 9, die_on: type | None = None) -> SplitEngine:
    def network(eng: SplitEngine, optimizer: Any, seed: int) -> LocalNetwork:
        def fresh(d: int) -> Device:
            return local_network(eng, optimizer, seed).device_host.devices[d]

        return LosingNetwork(local_network(eng, optimizer, seed), set(victims), at, back, fresh, die_on)

    return SplitEngine(small_model(), [cut] * devices, make_strategy(algorithm, options), make_data(devices),
                       {"lr": 0.05}, batch_size=8, seed=3, interval=interval, network=network)


def client(eng: SplitEngine, device: int) -> torch.Tensor:
    return flat(*[eng.devices[device].blocks[j] for j in range(eng.cuts[device])])


def ctx_with(num_devices: int, absent: set[int], seed: int = 7) -> RoundContext:
    return RoundContext(1, num_devices, 3, [1] * num_devices, [10] * num_devices, 4, 1, 1, None,
                        np.random.default_rng(seed), 2, [np.ones(2)] * num_devices, absent=frozenset(absent))


# ---- the strategies' draws ----------------------------------------------------------------------------
def test_sampling_draws_only_present_devices_and_is_unchanged_while_none_is_absent() -> None:
    reference = sorted(int(d) for d in np.random.default_rng(7).choice(10, size=3, replace=False))
    assert sample_devices(ctx_with(10, set()), 0.3) == reference
    for seed in range(20):
        drawn = sample_devices(ctx_with(10, {1, 4, 6}, seed), 0.3)
        assert len(drawn) == 3 and not {1, 4, 6} & set(drawn) and drawn == sorted(set(drawn))
    assert sample_devices(ctx_with(5, {0, 2}), 1.0) == [1, 3, 4]
    assert sample_devices(ctx_with(4, {0, 1, 2}), 0.5, minimum=2) == [3]    # at most the devices present
    assert ctx_with(4, {1}).present() == [0, 2, 3]


def test_an_asynchronous_slot_goes_to_a_present_idle_device_or_stays_empty() -> None:
    s = AsyncStrategy()
    for seed in range(20):
        new = s.replace(ctx_with(6, {2, 3}, seed), finished=0, active=[0, 1])
        assert new in (4, 5)
    assert s.replace(ctx_with(4, {2, 3}), finished=0, active=[0, 1]) == 0     # nobody to take it
    s.active = 3
    assert s.first_devices(ctx_with(6, {0, 1, 2, 3})) == [4, 5]           # C capped at the devices present
    assert s.first_devices(ctx_with(6, set())) == sorted(np.random.default_rng(7).choice(6, size=3, replace=False).tolist())


# ---- synchronous rounds (SCALA, CycleSL) ------------------------------------------------------------
@pytest.mark.parametrize("algorithm,options", [("scala", {"participation": 0.5}),
                                               ("cyclesl", {"participation": 0.5, "cycle_base": "sfl"}),
                                               ("cyclesl", {"participation": 0.5})])
def test_a_lost_device_leaves_and_the_others_go_on(algorithm: str, options: dict[str, Any]) -> None:
    eng = engine(algorithm, 6, options, victims={1, 4}, at=3)
    for t in (1, 2):
        eng.run_round(t)
    frozen = {d: client(eng, d) for d in (1, 4)}
    records = [eng.run_round(t) for t in range(3, 9)]
    assert eng.absent == {1, 4}
    for r in records:
        assert not {1, 4} & set(r.participants) and r.participants and math.isfinite(r.loss)
        assert r.metrics["absent_devices"] == 2.0
    for d, before in frozen.items():                       # nothing reached it: its model is as it was
        assert torch.equal(client(eng, d), before)
    if options.get("cycle_base") == "sfl":   # every present device got the average (CSL-7)
        present = [client(eng, d) for d in (0, 2, 3, 5)]
        assert all(torch.equal(present[0], p) for p in present[1:])
        assert not torch.equal(present[0], frozen[1])
    if algorithm == "scala":   # round 8 averaged: the present devices download it when drawn next (B.2 step 2)
        assert eng.stale - eng.absent == {0, 2, 3, 5}
        assert not torch.equal(flat(*list(eng.global_model())[:3]), frozen[1])
    assert len(eng.eval_models()) == (1 if algorithm == "scala" or options.get("cycle_base") == "sfl" else 4)


def test_a_run_that_loses_no_device_is_the_plain_run() -> None:
    plain = engine("scala", 4, {"participation": 0.5})
    watched = engine("scala", 4, {"participation": 0.5}, victims={2}, at=99)
    for t in range(1, 5):
        assert plain.run_round(t).participants == watched.run_round(t).participants
    assert all(torch.equal(client(plain, d), client(watched, d)) for d in range(4))
    assert plain.state_dict()["absent"] == [] and "absent_devices" not in plain.run_round(5).metrics


def global_client(eng: SplitEngine, device: int) -> torch.Tensor:
    """The fed server's global client blocks of ``device``'s cut, as one vector."""
    return torch.cat([t.detach().reshape(-1) for j in range(eng.cuts[device])
                      for t in eng.fed.global_blocks[j].values() if t.is_floating_point()])


def test_a_checkpoint_lists_the_absent_devices_and_a_resumed_run_takes_them_back() -> None:
    lossy = engine("scala", 5, {"participation": 0.6}, victims={3}, at=2)
    for t in range(1, 5):
        lossy.run_round(t)
    state = lossy.state_dict()
    assert state["absent"] == [3] and state["devices"][3] is None and all(
        s is not None for d, s in enumerate(state["devices"]) if d != 3)
    restored = engine("scala", 5, {"participation": 0.6})
    restored.load_state_dict(state)
    assert restored.absent == set()                                  # every device is back on resume,
    assert torch.equal(client(restored, 3), global_client(restored, 3))   # the absent one from the global model
    assert not torch.equal(client(lossy, 3), client(restored, 3))
    for d in (0, 1, 2, 4):
        assert torch.equal(client(lossy, d), client(restored, d))
    taken = {d for t in range(5, 13) for d in restored.run_round(t).participants}
    assert 3 in taken


def test_a_host_that_comes_back_brings_its_devices_back_from_the_global_model() -> None:
    eng = engine("scala", 5, {"participation": 0.6}, victims={1, 3}, at=2, back=6)
    records = [eng.run_round(t) for t in range(1, 6)]
    assert eng.absent == {1, 3} and all(not {1, 3} & set(r.participants) for r in records[1:])
    brought_back_from = {d: global_client(eng, d) for d in (1, 3)}     # the average of round 4
    sixth = eng.run_round(6)       # taken back first; round 5 drew the global iteration's participants without them
    assert eng.absent == set() and not {1, 3} & set(sixth.participants) and sixth.aggregated
    for d in (1, 3):               # so they hold the global client model they came back with, and the one of
        assert torch.equal(client(eng, d), brought_back_from[d])    # round 6 waits for their next draw (B.2 step 2)
        assert not torch.equal(client(eng, d), global_client(eng, d)) and d in eng.stale
    later = [eng.run_round(t) for t in range(7, 16)]
    assert "absent_devices" not in later[-1].metrics and {1, 3} & {d for r in later for d in r.participants}


def test_an_absent_list_that_does_not_fit_is_refused() -> None:
    state = engine("scala", 4, {"participation": 0.5}, victims={1}, at=1)
    state.run_round(1)
    saved = state.state_dict()
    with pytest.raises(ValueError, match="algorithm that allows absence"):
        engine("sfl-v1", 4, {}).load_state_dict(dict(saved, strategy={}))
    for absent in ([9], [4], [-1], [1, 1], "1"):
        with pytest.raises(ValueError, match="engine absent must list distinct devices of 0..3"):
            engine("scala", 4, {"participation": 0.5}).load_state_dict(dict(saved, absent=absent))
    with pytest.raises(ValueError, match="None for exactly the absent ones"):
        engine("scala", 4, {"participation": 0.5}).load_state_dict(dict(saved, absent=[]))
    old = {k: v for k, v in engine("scala", 4, {"participation": 0.5}).state_dict().items() if k != "absent"}
    had = engine("scala", 4, {"participation": 0.5})
    had.absent = {2}
    had.load_state_dict(old)                                        # a checkpoint from before: none absent
    assert had.absent == set()
    with pytest.raises(ValueError, match="engine state must hold exactly"):
        had.load_state_dict({k: v for k, v in old.items() if k != "cuts"})
    first = engine("scala", 4, {"participation": 0.5}, victims={0}, at=1)
    first.run_round(1)
    engine("scala", 4, {"participation": 0.5}).load_state_dict(first.state_dict())   # device 0 absent: accepted


def test_when_every_device_is_lost_the_run_stops_saying_so() -> None:
    eng = engine("scala", 3, {"participation": 0.5}, victims={0, 1, 2}, at=2)
    eng.run_round(1)
    with pytest.raises(DevicesLost, match=r"every device of the run is absent \(lost: \[0, 1, 2\]\)"):
        eng.run_round(2)


# ---- the asynchronous loop (GAS) --------------------------------------------------------------------
def test_gas_gives_a_lost_devices_slot_to_a_present_one() -> None:
    eng = engine("gas", 6, {"active": 3, "local_steps": 2}, victims={0, 1, 2}, at=2, cut=3)
    eng.run_round(1)
    records = [eng.run_round(t) for t in range(2, 8)]
    assert all(not {0, 1, 2} & set(r.participants) and math.isfinite(r.loss) for r in records)
    assert set(eng.async_state.active) <= {3, 4, 5} and len(eng.async_state.active) == 3
    assert len(eng.eval_models()) == 1


def test_gas_frees_a_slot_no_present_device_can_take_and_stops_when_none_is_left() -> None:
    eng = engine("gas", 3, {"active": 3, "local_steps": 1}, victims={0}, at=2, cut=3)
    eng.run_round(1)
    assert sorted(eng.async_state.active) == [0, 1, 2]
    records = [eng.run_round(t) for t in range(2, 5)]
    assert sorted(eng.async_state.active) == [1, 2]          # no idle device present: the slot is freed
    assert all(0 not in r.participants for r in records)
    gone = engine("gas", 2, {"active": 2, "local_steps": 1}, victims={0, 1}, at=2, cut=3)
    gone.run_round(1)
    with pytest.raises(DevicesLost):
        gone.run_round(2)


def test_a_round_whose_participants_are_all_absent_trains_nobody_and_the_run_goes_on() -> None:
    eng = engine("scala", 6, {"participation": 0.3}, victims={0, 1, 2}, at=2, interval=4)
    first = eng.run_round(1)                         # the global iteration's two participants, drawn at round 1
    lost = set(first.participants)
    eng.net.victims = set(lost)
    before = {d: client(eng, d) for d in range(6)}
    second = eng.run_round(2)
    assert second.participants == [] and math.isnan(second.loss) and eng.absent == lost
    assert all(torch.equal(client(eng, d), before[d]) for d in range(6))
    fifth = [eng.run_round(t) for t in range(3, 6)][-1]        # the next global iteration draws from the present
    assert fifth.participants and not lost & set(fifth.participants)


class RecordingNetwork(LocalNetwork):
    def __init__(self, local: LocalNetwork) -> None:
        super().__init__(local.device_host, local.fed_host)
        self.log: list[tuple[Any, Any]] = []

    def send(self, to: Any, msg: Any) -> None:
        self.log.append((to, msg))
        super().send(to, msg)


@pytest.mark.parametrize("algorithm,relayed", [("scala", True), ("gas", True), ("sfl-v1", False)])
def test_where_absence_is_allowed_the_edge_server_waits_on_every_upload_itself(algorithm: str, relayed: bool) -> None:
    """Who waits on a device's model upload decides who notices its loss: rank 0 (relayed through the
    edge server), never the fed server, under the algorithms that go on without a lost device."""
    from trainers.roles.protocol import EDGE, FED, Take, Upload

    def network(eng: SplitEngine, optimizer: Any, seed: int) -> LocalNetwork:
        return RecordingNetwork(local_network(eng, optimizer, seed))

    options = {"scala": {"participation": 0.5}, "gas": {"active": 2, "local_steps": 1}}.get(algorithm, {})
    eng = SplitEngine(small_model(), [3] * 4, make_strategy(algorithm, options), make_data(4), {"lr": 0.05},
                      batch_size=8, seed=3, interval=1, network=network)
    for t in range(1, 3):
        eng.run_round(t)
    uploads = [msg for to, msg in eng.net.log if isinstance(msg, Upload)]
    fed_takes = [msg for to, msg in eng.net.log if to == FED and isinstance(msg, Take) and msg.source != FED]
    assert uploads and all((u.to == EDGE) is relayed for u in uploads)
    assert bool(fed_takes) is not relayed


def test_a_device_lost_before_its_model_upload_is_left_out_of_the_average() -> None:
    eng = engine("scala", 4, {"participation": 1.0}, victims={2}, at=2, die_on=Upload, interval=2)
    eng.run_round(1)
    second = eng.run_round(2)                 # device 2 trains in round 2, then is lost when asked for its model
    assert eng.absent == {2} and second.metrics["absent_devices"] == 1.0
    sizes = eng.data_sizes()                  # nobody downloads SCALA's average yet (B.2 step 2): 0, 1, 3 hold theirs
    average = sum(sizes[d] * client(eng, d) for d in (0, 1, 3)) / sum(sizes[d] for d in (0, 1, 3))
    assert torch.allclose(global_client(eng, 0), average, atol=1e-6, rtol=0)   # the average of 0, 1, 3 only
    everyone = sum(sizes[d] * client(eng, d) for d in range(4)) / sum(sizes)
    assert not torch.allclose(global_client(eng, 0), everyone, atol=1e-6, rtol=0)
    assert all(2 not in eng.run_round(t).participants for t in range(3, 6))


def test_gas_goes_on_when_a_device_is_lost_before_its_model_upload() -> None:
    eng = engine("gas", 3, {"active": 1, "local_steps": 1}, victims={2}, at=1, die_on=Upload)
    records = [eng.run_round(t) for t in range(1, 13)]
    lost_in = next(t for t, r in enumerate(records, 1) if r.metrics.get("absent_devices") == 1.0)
    assert eng.absent == {2} and all(2 not in r.participants for r in records[lost_in:])
    assert all(math.isfinite(r.loss) for r in records)


def test_a_device_lost_while_a_checkpoint_is_taken_is_listed_absent_in_it() -> None:
    eng = engine("scala", 4, {"participation": 1.0}, victims={1}, at=2, die_on=GetState)
    eng.run_round(1)
    eng.run_round(2)
    state = eng.state_dict()                  # device 1 is lost when asked for its state
    assert state["absent"] == [1] and state["devices"][1] is None and eng.absent == {1}
    assert all(s is not None for d, s in enumerate(state["devices"]) if d != 1)


def test_a_device_loading_the_global_model_gets_every_block_of_its_cut() -> None:
    eng = engine("gas", 4, {"active": 2, "local_steps": 1}, cut=4)      # its last client block is a convolution
    for t in range(1, 3):
        eng.run_round(t)
    idle = next(d for d in range(4) if d not in eng.async_state.active)
    assert not torch.equal(client(eng, idle), global_client(eng, idle))
    eng.load_global(idle, 3, fresh_optimizer=True)
    assert torch.equal(client(eng, idle), global_client(eng, idle))
