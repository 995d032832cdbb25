"""The roles as message handlers (trainers/roles/hosts.py) and the in-process network (trainers/engine/network.py):
what each message does to the role and what it emits, checked against the role methods called
directly (the reference: the same arithmetic without messages)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from trainers.engine.network import LocalNetwork
from trainers.roles.core import Device, EdgeServer, FedServer
from trainers.roles.hosts import DeviceHost, FedHost, take
from trainers.roles.messages import Activation, BlockState, CutGradient, MessageMismatchError, ModelDownload, ModelUpload, NonFiniteError
from trainers.roles.optim import OptimizerSpec
from trainers.roles.passes import EdgePasses
from trainers.roles.protocol import EDGE, FED, Average, Blocks, Forward, GetBlocks, GetState, Groups, RoundEnd, Send, SetState, State, Take, Upload

SGD = OptimizerSpec("sgd", 0.1, 0.9)


def chain() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def devices(n: int = 3, cut: int = 1) -> dict[int, Device]:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(30, 3, generator=g), torch.randint(0, 2, (30,), generator=g)
    template = chain()
    return {i: Device(i, template, cut, x, y, np.arange(10 * i, 10 * i + 10), 4, [0, i], SGD) for i in range(n)}


class Outbox(list):
    def __call__(self, to, msg) -> None:
        self.append((to, msg))


def test_a_forward_emits_each_devices_activation_in_the_messages_order() -> None:
    host, reference = DeviceHost(devices()), devices()
    out = Outbox()
    host.handle(Forward(2, [(2, 4), (0, 3)]), out)
    expected = [reference[2].forward(2, 4), reference[0].forward(2, 3)]
    assert [to for to, _ in out] == [EDGE, EDGE]
    for (_, got), want in zip(out, expected):
        assert isinstance(got, Activation) and (got.device, got.round, got.step) == (want.device, 2, 1)
        assert torch.equal(got.tensor, want.tensor) and torch.equal(got.labels, want.labels)
    host.handle(CutGradient(2, 2, 1, torch.ones(4, 4)), out)            # eq. (6): the device steps
    reference[2].backward(CutGradient(2, 2, 1, torch.ones(4, 4)))
    assert torch.equal(host.devices[2].blocks[0].weight, reference[2].blocks[0].weight)
    assert not torch.equal(host.devices[2].blocks[0].weight, devices()[2].blocks[0].weight)


def test_an_upload_goes_where_the_edge_server_says_with_the_blocks_below_the_cut() -> None:
    host = DeviceHost(devices(cut=3))
    out = Outbox()
    host.handle(Upload(1, 4, [0, 2, 5], 2.5), out)
    (to_fed, upload), = out                                                # no receipt: sizes follow from the model
    assert to_fed == FED and isinstance(upload, ModelUpload) and sorted(upload.blocks) == [0, 2] and upload.weight == 2.5
    assert torch.equal(upload.blocks[0].state["weight"], host.devices[1].blocks[0].weight)
    assert upload.num_bytes == (12 + 4 + 8 + 2) * 4 and upload.blocks[0].optimizer is None
    out.clear()
    host.handle(Upload(1, 4, [0], 1.0, with_optimizer=True, to=EDGE), out)
    assert [(to, type(m).__name__) for to, m in out] == [(EDGE, "ModelUpload")]
    assert out[0][1].blocks[0].optimizer is not None


def test_blocks_state_and_the_rounds_check_on_a_device_host() -> None:
    host, out = DeviceHost(devices()), Outbox()
    host.handle(GetBlocks(1), out)
    (to, blocks), = out
    assert to == EDGE and isinstance(blocks, Blocks) and blocks.device == 1
    assert torch.equal(blocks.states[0]["weight"], host.devices[1].blocks[0].weight)
    host.handle(GetState(2), out)
    state = out[-1][1]
    assert isinstance(state, State) and state.state["cut"] == 1
    other = DeviceHost(devices())
    weight = other.devices[2].blocks[0].weight
    weight.data = weight.data + 1.0                                       # its own tensor (devices start on the template's)
    other.handle(SetState(2, state.state), Outbox())
    assert torch.equal(other.devices[2].blocks[0].weight, host.devices[2].blocks[0].weight)
    host.handle(RoundEnd(3), out)                                         # finite: nothing raised, nothing sent
    assert len(out) == 2
    bias = host.devices[1].blocks[0].bias
    bias.data = bias.data.clone()                                         # device 1's own (it starts on the template's)
    bias.data[0] = float("nan")
    host.handle(RoundEnd(4), out)           # no message named device 1 since its check: its model is not read again
    host.handle(GetBlocks(1), out)
    with pytest.raises(NonFiniteError, match="round 5.*device 1"):
        host.handle(RoundEnd(5), out)
    with pytest.raises(NonFiniteError, match="round 6.*device 1"):      # a failed check leaves the device to check
        host.handle(RoundEnd(6), out)
    with pytest.raises(MessageMismatchError, match=r"device 7, which is not hosted here \(devices \[0, 1, 2\]\)"):
        host.handle(GetBlocks(7), out)
    with pytest.raises(MessageMismatchError, match="a device host cannot handle a Average"):
        host.handle(Average(1), out)


def test_the_rounds_check_reads_every_device_at_first_then_those_a_message_named() -> None:
    host = DeviceHost(devices())
    weight = host.devices[2].blocks[0].weight
    weight.data = weight.data.clone()                                     # device 2's own (it starts on the template's)
    weight.data[0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match="round 1.*device 2"):         # never checked: read at the first check
        host.handle(RoundEnd(1), Outbox())
    weight.data[0, 0] = 0.0
    host.handle(RoundEnd(2), Outbox())
    state = {k: torch.full_like(t, float("nan")) for k, t in host.devices[0].blocks[0].state_dict().items()}
    host.handle(ModelDownload(0, 3, "device", {0: BlockState(state)}), Outbox())   # a download that is not finite
    with pytest.raises(NonFiniteError, match="round 3.*device 0"):
        host.handle(RoundEnd(3), Outbox())


@pytest.mark.parametrize("message", [Forward(4, [(2, 3), (0, 3)]), GetBlocks(0), GetState(0), SetState(0, None),
                                     Upload(0, 4, [0], 1.0, to=EDGE)], ids=lambda m: type(m).__name__)
def test_a_device_any_message_named_is_checked_at_the_rounds_end(message) -> None:
    host = DeviceHost(devices())
    host.handle(RoundEnd(3), Outbox())
    if isinstance(message, SetState):
        message = SetState(0, host.devices[0].state_dict())
    host.handle(message, Outbox())
    for d in (0, 1):
        bias = host.devices[d].blocks[0].bias
        bias.data = bias.data.clone()
        bias.data[0] = float("nan")
    with pytest.raises(NonFiniteError, match="round 4.*device 0"):       # device 1, named by none, is not read
        host.handle(RoundEnd(4), Outbox())
    host.devices[0].blocks[0].bias.data[0] = 0.0
    host.handle(RoundEnd(5), Outbox())


def _upload(device: int, value: float, weight: float, sender: str = "device") -> ModelUpload:
    return ModelUpload(device, 1, sender, {0: BlockState({"w": torch.full((2,), value)})}, weight)


def test_the_fed_server_folds_averages_and_sends_on_what_it_holds() -> None:
    host, out = FedHost(), Outbox()
    for u in (_upload(0, 1.0, 1.0), _upload(1, 4.0, 3.0)):
        host.handle(u, out)
    host.handle(Average(1), out)
    reference = FedServer().average([_upload(0, 1.0, 1.0), _upload(1, 4.0, 3.0)], 1)
    assert out == [] and sorted(host.latest) == [(0, 0)]                  # group 0's block 0
    assert torch.equal(host.latest[0, 0].state["w"], reference[0, 0].state["w"])   # (1·1 + 3·4)/4 = 3.25
    assert torch.equal(host.latest[0, 0].state["w"], torch.full((2,), 3.25))
    out.clear()
    take(host, Take(2, keep=9), _upload(2, 7.0, 1.0), out)                # kept, not folded
    host.handle(Send(2, 2, 1, "device", {0: ("kept", 9, 0)}), out)
    host.handle(Send(EDGE, -1, 1, "edge", {0: ("avg", 0), 1: ("global", 1)}), out)
    host.handle(Send(0, 0, 1, "device", {0: ("global", 0)}, fresh_optimizer=True), out)
    (to_2, kept), (to_edge, avg), (to_0, glob) = out
    assert to_2 == 2 and torch.equal(kept.blocks[0].state["w"], torch.full((2,), 7.0)) and host.kept == {}
    assert to_edge == EDGE and sorted(avg.blocks) == [0]                   # block 1 was never averaged: left out
    assert to_0 == 0 and glob.fresh_optimizer and torch.equal(glob.blocks[0].state["w"], torch.full((2,), 3.25))
    host.handle(GetState(), out)
    assert out[-1] == (EDGE, State(None, host.fed.state_dict()))
    fresh = FedHost()
    fresh.handle(SetState(None, host.fed.state_dict()), out)
    assert torch.equal(fresh.fed.global_blocks[0]["w"], torch.full((2,), 3.25))
    with pytest.raises(MessageMismatchError, match="only the fed server keeps uploads"):
        take(DeviceHost(devices()), Take(FED, keep=1), _upload(0, 1.0, 1.0), out)
    with pytest.raises(MessageMismatchError, match="the fed server cannot handle a Forward"):
        host.handle(Forward(1, []), out)
    with pytest.raises(MessageMismatchError, match="holds no block"):
        host.block(("elsewhere", 0), 0)


def test_grouped_devices_are_averaged_apart_and_each_downloads_its_groups_model() -> None:
    """Devices 0, 1 in group 0 and 2, 3 in group 1 (:class:`Groups`): each group's uploads make its own |𝒟_i|-weighted
    mean, a Send for a device names its group's average or global block, ("global", j, g) group g's, the groups and
    their global models survive the state round-trip, and nothing else is sent."""
    host, out = FedHost(), Outbox()
    host.handle(Groups((0, 0, 1, 1)), out)
    for u in (_upload(0, 1.0, 1.0), _upload(1, 4.0, 3.0), _upload(2, 10.0, 1.0), _upload(3, 20.0, 4.0)):
        host.handle(u, out)
    host.handle(Average(1), out)
    assert sorted(host.latest) == [(0, 0), (1, 0)]
    assert torch.equal(host.latest[0, 0].state["w"], torch.full((2,), 3.25))     # (1·1 + 3·4)/4
    assert torch.equal(host.latest[1, 0].state["w"], torch.full((2,), 18.0))     # (1·10 + 4·20)/5
    host.handle(Send(1, 1, 1, "device", {0: ("avg", 0)}), out)
    host.handle(Send(3, 3, 1, "device", {0: ("avg", 0)}), out)
    host.handle(Send(2, 2, 1, "device", {0: ("global", 0)}), out)
    host.handle(Send(EDGE, -1, 1, "edge", {0: ("global", 0, 1)}), out)
    host.handle(Send(EDGE, -1, 1, "edge", {0: ("global", 0)}), out)           # the edge server's: group 0's
    assert [(to, float(m.blocks[0].state["w"][0])) for to, m in out] == [(1, 3.25), (3, 18.0), (2, 18.0),
                                                                         (EDGE, 18.0), (EDGE, 3.25)]
    fresh = FedHost()
    fresh.handle(SetState(None, host.fed.state_dict()), out)
    assert fresh.fed.group_of == (0, 0, 1, 1) and fresh.fed.group(3) == 1 and fresh.fed.group(-1) == 0
    assert {g: float(b[0]["w"][0]) for g, b in fresh.fed.globals.items()} == {0: 3.25, 1: 18.0}
    assert set(FedServer().state_dict()) == {"global_blocks"}                  # ungrouped: as before groups existed
    host.handle(Groups((0, 0, 1, 2)), out)                                     # group 2 has never been averaged
    with pytest.raises(MessageMismatchError, match="no block 0 of group 2 .device 3's."):
        host.handle(Send(3, 3, 1, "device", {0: ("avg", 0)}), out)
    before = len(out)
    host.handle(Send(3, 3, 1, "device", {0: ("global", 0)}), out)
    assert out[before][1].blocks == {}                                         # no global model of group 2 yet
    host.handle(_upload(0, 1.0, 1.0), out)
    with pytest.raises(MessageMismatchError, match="in the middle of an average"):
        host.handle(Groups((1, 0, 1, 1)), out)
    with pytest.raises(MessageMismatchError, match="integers ≥ 0"):
        FedHost().handle(Groups((0, -1)), out)


def test_the_local_network_delivers_between_hosts_only_when_told_to_take() -> None:
    net = LocalNetwork(DeviceHost(devices()), FedHost())
    weight = net.devices[0].blocks[0].weight
    weight.data = weight.data + 1.0                                        # device 0's model differs from device 2's
    net.send(0, Upload(0, 1, [0], 1.0))
    assert net.fed._running == {} and net.inbox == {}                      # the upload waits for the Take
    net.send(FED, Take(0))
    assert sorted(net.fed._running) == [(0, 0)]                          # group 0, block 0
    with pytest.raises(MessageMismatchError, match="the fed server was told to take a message from device 1, which "
                                                   "sent none"):
        net.send(FED, Take(1))
    with pytest.raises(MessageMismatchError, match="the edge server expected a message from the fed server, which sent none"):
        net.receive([FED])
    with pytest.raises(MessageMismatchError, match="not to itself"):
        net.send(EDGE, RoundEnd(1))
    net.send(FED, Average(1))
    net.send(FED, Send(2, 2, 1, "device", {0: ("avg", 0)}))
    assert not torch.equal(net.devices[2].blocks[0].weight, net.devices[0].blocks[0].weight)
    net.send(2, Take(FED))                                                 # the average of one upload: device 0's
    assert torch.equal(net.devices[2].blocks[0].weight, net.devices[0].blocks[0].weight)
    assert net.hosts([2, 0]) == [[2, 0]] and net.hosts([]) == []
    assert net.device_blocks(1) is net.devices[1].blocks and net.end_round(1) is None


# ---- the edge server's half of the round's check: the instances run, stepped or loaded since the last -----------
def _edge() -> EdgeServer:
    """Blocks 1 and 2 of :func:`chain` on the edge, one copy per device (SplitFed V1's layout) for 3 devices."""
    return EdgeServer(chain(), [1, 1, 1], lambda d, j, lc: d, SGD)


def _poison(edge: EdgeServer, device: int) -> torch.Tensor:
    """NaN into device ``device``'s block-3 weight, written directly (no edge method sees it); the weight."""
    weight = edge.instances[(device, 2)].weight
    weight.data = weight.data.clone()                                     # its own (it starts on the template's)
    weight.data[0, 0] = float("nan")
    return weight


def test_the_edges_check_reads_every_instance_at_first_then_those_run_stepped_or_loaded() -> None:
    edge = _edge()
    _poison(edge, 2)
    with pytest.raises(NonFiniteError, match=r"^NaN or inf in server model block 3 at round 1, device 2$"):
        edge.check_finite(1)                                              # never checked: every instance read
    with pytest.raises(NonFiniteError, match="round 2, device 2"):        # a failed check leaves it to check again
        edge.check_finite(2)
    edge.instances[(2, 2)].weight.data[0, 0] = 0.0
    edge.check_finite(3)
    _poison(edge, 1)
    edge.check_finite(4)                                                  # touched by no method since: not read
    a = Activation(1, 5, 0, torch.zeros(2, 4), torch.tensor([0, 1]))
    EdgePasses(edge).run([a])                                             # device 1's instances run
    with pytest.raises(NonFiniteError, match="round 5, device 1"):
        edge.check_finite(5)


def test_an_owners_step_has_its_instances_read_and_no_others() -> None:
    edge = _edge()
    edge.check_finite(1)
    for device in (0, 1):
        weight = _poison(edge, device)
        weight.grad = torch.zeros_like(weight)                            # a step that leaves the NaN where it is
    edge.step([0])
    with pytest.raises(NonFiniteError, match="round 2, device 0"):
        edge.check_finite(2)
    edge.instances[(0, 2)].weight.data[0, 0] = 0.0
    edge.check_finite(3)                                                  # device 1: neither run nor stepped
    edge.step([1])
    with pytest.raises(NonFiniteError, match="round 4, device 1"):
        edge.check_finite(4)


def test_a_download_a_new_layout_and_a_checkpoint_have_what_they_load_read() -> None:
    edge = _edge()
    edge.check_finite(1)
    nan_state = {k: torch.full_like(t, float("nan")) for k, t in chain()[2].state_dict().items()}
    edge.download([ModelDownload(1, 2, "edge", {2: BlockState(nan_state)})])      # a download that is not finite
    with pytest.raises(NonFiniteError, match="round 2, device 1"):
        edge.check_finite(2)
    edge = _edge()
    edge.check_finite(1)
    _poison(edge, 2)
    edge.download([], new_cuts=[1, 1, 2])                                 # a new layout: every instance read again
    with pytest.raises(NonFiniteError, match="round 2, device 2"):
        edge.check_finite(2)
    state = edge.state_dict()
    edge = _edge()
    edge.check_finite(1)
    edge.load_state_dict(state)
    with pytest.raises(NonFiniteError, match="round 2, device 2"):
        edge.check_finite(2)
