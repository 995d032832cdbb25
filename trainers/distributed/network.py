"""Rank 0's :class:`~trainers.engine.network.Network`: the devices and the fed server on other ranks.

The round loop (:class:`trainers.engine.split_engine.SplitEngine`) is the simulator's, unchanged; its messages
go to the ranks that host the roles (:mod:`trainers.distributed.serve`, with the same handlers as
the simulator, :mod:`trainers.roles.hosts`). Besides delivering them this network

* sets the device ranks up (:meth:`RankNetwork.setup`: sample positions and initial weights, never samples);
* books what rank 0 measures: each activation's uplink time, the edge server's work (from the
  group's activations to its first reply), the edge server's model download;
* at the round's end collects every rank's report (its NaN/inf check and measured seconds) and
  returns the longest participant's seconds per stage;
* with ``--emulate-links`` sends every rank the round's link rates (:class:`LinkRates`);
* where the algorithm allows partial participation (``Strategy.allows_absence``: SCALA, CycleSL,
  GAS) takes a device rank that died or stayed silent past ``--rank-timeout`` out of the run: its
  devices become absent (:meth:`RankNetwork.absent_devices`), nothing more is sent to it or awaited
  from it, and one line says so (docs/mqtt.md "Churn"). Any other lost rank stops the run;
* takes such a rank back when its new process asks (:class:`Rejoin`, over MQTT): at the next
  round's start it is set up as at the start and its devices are present again (:meth:`readmit`).
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

import numpy as np
import torch
from torch import nn

from adaptplan.fileio import is_int, show
from trainers.distributed.control import DeviceSpec, LinkRates, Report, Setup, Stop
from trainers.distributed.layout import FED_ALLOWANCE, FED_RANK, SETUP_TIMEOUT_FACTOR, RankLayout
from trainers.distributed.lost_ranks import LostRanks
from trainers.distributed.rank_checks import check_ready, check_report
from trainers.distributed.timing import book_transfer, link_rate
from trainers.distributed.transport import FrameChannel, PeerError
from trainers.engine.clock import StageLedger
from trainers.engine.head_split import device_blocks
from trainers.roles.checks import (
    ActivationRule,
    BadMessageError,
    check_activation,
    check_blocks,
    check_head_gradient,
    check_step,
    check_upload,
)
from trainers.roles.messages import Activation, CutGradient, HeadForward, HeadGradient, ModelUpload
from trainers.roles.optim import OptimizerSpec
from trainers.roles.protocol import EDGE, FED, Address, Forward, GetBlocks, GetState, RoundEnd, SetState, State, Upload

if TYPE_CHECKING:  # pragma: no cover
    from trainers.engine.clock import SimClock
    from trainers.engine.split_engine import SplitEngine


def activation_rules(template: nn.Sequential, probe: torch.Tensor, num_classes: int,
                     labels: bool = True) -> dict[int, ActivationRule]:
    """Per cut c = 1..L−1: the per-sample shape and dtype of the activation after block c (one sample of the data
    through a copy of the template, evaluation mode, nothing recorded) and the labels' range (none sent where
    ``labels`` is False: a U-shaped split)."""
    rules = {}
    model = copy.deepcopy(template).eval()
    x = probe
    with torch.no_grad():
        for c, block in enumerate(model, start=1):
            x = block(x)
            rules[c] = ActivationRule(tuple(int(s) for s in x.shape[1:]), x.dtype, num_classes, labels)
    return rules


def engine_rules(engine: "SplitEngine") -> dict[int, ActivationRule]:
    """:func:`activation_rules` of ``engine``'s model: one training sample through its template; no labels under a
    U-shaped split."""
    return activation_rules(engine.template, engine.data.x_train[:1], int(engine.num_classes),
                            labels=not engine.defence.head)


def loaded_blocks(template: nn.Sequential, indices: Sequence[int], states: Sequence[dict[str, torch.Tensor]]
                  ) -> nn.ModuleList:
    """Copies of ``template``'s blocks ``indices`` loaded with ``states`` (a device's blocks, for evaluation)."""
    modules = []
    for j, state in zip(indices, states):
        module = copy.deepcopy(template[j])
        module.load_state_dict(state)
        modules.append(module)
    return nn.ModuleList(modules)


class RankNetwork(LostRanks):
    """Messages to and from the ranks of ``layout`` over ``channel``; ``source`` names the data set
    and model the device ranks build (dataset, model, model_width). ``previous``: the run's network before its
    strategy moved to another model, whose lost device ranks stay out (:meth:`setup`)."""

    def __init__(self, channel: FrameChannel, layout: RankLayout, emulate: bool, source: dict[str, Any],
                 previous: "RankNetwork | None" = None) -> None:
        self.channel = channel
        self.layout = layout
        self.emulate = emulate
        self.source = dict(source)
        self.template: nn.Sequential | None = None
        self.rates: LinkRates | None = None
        self.ledger = StageLedger()
        self.served_from: float | None = None
        self._blocks: dict[int, nn.ModuleList] = {}
        self.tolerant = False                 # the algorithm allows absence (set up from the strategy)
        self.algorithm = ""
        self.lost: dict[int, str] = {}        # device rank → why it was taken out of the run
        self.returning: set[int] = set()      # lost device ranks whose new process asked to come back
        self.setting_up: dict[int, float] = {}   # lost device ranks sent their set-up again → deadline of their reply
        self._setups: dict[int, Setup] = {}
        self.released = False                # Stop sent: the other ranks end (:meth:`release`)
        self.engine: "SplitEngine | None" = None
        self.rules: dict[int, ActivationRule] = {}   # per cut: what a device's activation holds (trainers.roles.checks)
        self.asked: dict[int, int] = {}              # device → the rows its last Forward asked for
        self.uploads: dict[int, list[int]] = {}      # device → the blocks its last Upload (to the edge) asked for
        self.expected: dict[int, type] = {}          # device → the message type its rank's next reply must be
        self.asked_round: dict[int, int] = {}        # device → the round its last Forward was for
        self.last_step: dict[int, int] = {}          # device → the step of its last activation (steps count by one)
        self.features: dict[int, HeadForward] = {}   # device → the features its head was last sent (a U-shaped split)
        self.follows = previous is not None       # (the previous network itself is not kept: its engine's models)
        if previous is not None:
            self._carry_lost(previous)

    # ---- setting the device ranks up -------------------------------------------------------------------
    def setup(self, engine: "SplitEngine", optimizer: OptimizerSpec, seed: int) -> "RankNetwork":
        """Each device rank loads the data set and builds the chain's architecture itself
        (:func:`trainers.distributed.serve.local_chain`); it is sent the chain's initial weights and,
        per device it hosts, the positions of that device's samples in the data set, its cut,
        sampler seed and optimizer. Returns this network once every device rank is ready.

        Where the strategy trains another model than the run's (``stage_spec``), the set-up says which, and the
        device rank builds its architecture from the run's (``Strategy.stage_architecture``); a network that follows
        another (``previous``) empties the fed server's global models first (the simulator's new engine has a new
        fed server) and sets up only the device ranks still in the run."""
        self.template = engine.template
        self.engine = engine
        self.tolerant, self.algorithm = bool(engine.strategy.allows_absence), str(engine.strategy.name)
        data = engine.data
        source = dict(self.source, num_train=int(data.x_train.shape[0]), num_classes=int(engine.num_classes))
        stage = engine.strategy.stage_spec()
        if stage:
            source["stage"] = {"algorithm": self.algorithm, **stage}
        if self.follows:
            self.channel.send(SetState(None, {}), FED_RANK)
        initial = [{k: v.detach().cpu().clone() for k, v in block.state_dict().items()} for block in engine.template]
        by_rank: dict[int, dict[int, DeviceSpec]] = {}
        head = engine.strategy.optimizer("server", engine.server_optimizer) if engine.defence.head else None
        for i, part in enumerate(data.parts):
            by_rank.setdefault(self.layout.rank_of(i), {})[i] = DeviceSpec(
                engine.cuts[i], torch.as_tensor(np.asarray(part), dtype=torch.long), engine.batch_size, [seed, i], optimizer,
                engine.defence, head)
        for rank, devices in by_rank.items():
            self._setups[rank] = Setup(source, initial, devices)
            if rank not in self.lost:
                self.channel.send(self._setups[rank], rank)
        live = self._live(list(by_rank))
        for rank, envelope in self.channel.recv_many(live, timeout=SETUP_TIMEOUT_FACTOR * self.channel.timeout):
            self._refuse_bad(rank, check_ready, envelope.msg, rank, sorted(by_rank[rank]))
        return self

    def _refuse_bad(self, rank: int, check: Callable[..., None], *args: Any) -> None:
        """``check(*args)`` on a message of device rank ``rank``; its :class:`BadMessageError` becomes the rank's failure
        (:class:`PeerError`: the run stops naming the rank, or goes on without it where the algorithm allows)."""
        try:
            check(*args)
        except BadMessageError as exc:
            raise PeerError(rank, self.layout.describe(rank), f"sent a message its role may not send: {exc}") from None

    # ---- Network ------------------------------------------------------------------------------------------
    def _rank(self, address: Address) -> int:
        return FED_RANK if address == FED else self.layout.rank_of(int(address))

    def hosts(self, devices: Sequence[int]) -> list[list[int]]:
        by_rank: dict[int, list[int]] = {}
        for d in devices:
            by_rank.setdefault(self.layout.rank_of(d), []).append(d)
        return list(by_rank.values())

    def send(self, to: Address, msg: Any) -> None:
        if to != FED:
            self._blocks.pop(int(to), None)         # the device may change: its blocks are read anew
        if isinstance(msg, Forward):
            self.asked.update(dict(msg.items))
            self.expected.update({d: Activation for d, _ in msg.items})
            self.asked_round.update({d: msg.round for d, _ in msg.items})
        elif isinstance(msg, Upload) and msg.to == EDGE:
            self.uploads[msg.device] = list(msg.blocks)
            self.expected[msg.device] = ModelUpload
        elif isinstance(msg, GetState) and msg.device is not None:
            self.expected[msg.device] = State
        elif isinstance(msg, HeadForward):
            self.expected[msg.device] = HeadGradient
            self.features[msg.device] = msg
        if isinstance(msg, CutGradient) and self.served_from is not None:
            self.ledger.add("edge", "server", time.time() - self.served_from)   # since the group's activations came
            self.served_from = None
        self._send(msg, self._rank(to), rate=link_rate(self.rates, msg, EDGE, to))

    def receive(self, sources: Sequence[Address], allow_absent: bool = False) -> list[Any]:
        """Every message from ``sources`` (all awaited together, one deadline); with ``allow_absent``
        a device rank that is lost is passed over (:meth:`_may_lose`)."""
        deadline = time.monotonic() + self.channel.timeout
        out = []
        for rank in [self._rank(s) for s in sources]:
            if allow_absent and rank in self.lost:
                continue
            try:
                envelope = (self._recv(rank, deadline) if rank != FED_RANK
                            else self.channel.recv(rank, deadline=deadline + FED_ALLOWANCE * self.channel.timeout))
            except PeerError as exc:
                if allow_absent and exc.rank == rank and self._may_lose(exc):
                    continue
                raise
            msg = book_transfer(self.ledger, envelope, EDGE)
            try:
                if rank != FED_RANK:
                    self._refuse_bad(rank, self._check, msg, rank)
            except PeerError as refused:          # the device rank is at fault: as if it had failed
                if allow_absent and self._may_lose(refused):
                    continue
                raise
            if isinstance(msg, Activation):
                self.served_from = time.time()
            out.append(msg)
        return out

    def _check(self, msg: Any, rank: int) -> None:
        """A device rank's activation or relayed upload, checked before it is used (:mod:`trainers.roles.checks`):
        for a device that rank hosts and was asked, by the rules of the device's cut."""
        assert self.engine is not None, "set up before the first round"
        device = getattr(msg, "device", None)
        if not is_int(device) or not 0 <= device < self.layout.num_devices or self.layout.rank_of(device) != rank:
            what = {Activation: "activation", ModelUpload: "model upload"}.get(type(msg), f"reply ({type(msg).__name__})")
            raise BadMessageError(device if is_int(device) else f"rank {rank}", what, "device",
                                  f"{show(device)} is not a device rank {rank} hosts")
        expected = self.expected.pop(device, None)
        if expected is None or type(msg) is not expected:
            raise BadMessageError(device, "reply", "type", f"is {type(msg).__name__}, expected {expected.__name__}"
                                  if expected else f"is {type(msg).__name__}, but it was asked for nothing")
        if isinstance(msg, HeadGradient):
            check_head_gradient(msg, device, self.features.pop(device))
            return
        if not isinstance(msg, (Activation, ModelUpload)):
            return                  # a State: checked with the checkpoint it is written into, when a run resumes
        if isinstance(msg, Activation):
            self.rules = self.rules or engine_rules(self.engine)     # once, from the model
            check_activation(msg, device, self.asked.pop(device), self.rules[self.engine.cuts[device]])
            asked_round = self.asked_round.pop(device)
            if msg.round != asked_round:
                raise BadMessageError(device, "activation", "round", f"is {show(msg.round)}, but it was asked for round "
                                                                     f"{asked_round}")
            self.last_step[device] = check_step(msg, device, self.last_step.get(device))
        else:
            # a device sends the blocks asked for that it holds (below its cut, and a U-shaped split's head)
            check_upload(msg, device, device_blocks(self.engine, device, self.uploads.pop(device, [])),
                         self.engine.upload_schema)

    def device_blocks(self, device: int) -> nn.ModuleList | None:
        if device not in self._blocks:
            rank = self._rank(device)
            self._send(GetBlocks(device), rank)
            if rank in self.lost:
                return None
            try:
                reply = self._recv(rank).msg
                assert self.template is not None and self.engine is not None, "set up before the first round"
                held = device_blocks(self.engine, device, range(self.engine.num_blocks))
                self._refuse_bad(rank, check_blocks, reply, device, held, self.engine.upload_schema)
            except PeerError as exc:
                if exc.rank == rank and self._may_lose(exc):
                    return None
                raise
            self._blocks[device] = loaded_blocks(self.template, held, reply.states)
        return self._blocks[device]

    def begin_round(self, round_index: int, clock: "SimClock | None") -> None:
        if not self.emulate or clock is None:
            return
        system = clock.system(round_index)
        names = ("up_bps", "down_bps", "fed_up_bps", "fed_down_bps")
        self.rates = LinkRates({i: {n: float(getattr(d, n)) for n in names} for i, d in enumerate(system.devices)},
                               float(system.edge_to_fed_bps), float(system.fed_to_edge_bps))
        for rank in [FED_RANK, *self._live(self.layout.device_ranks)]:
            self._send(self.rates, rank)

    def release(self) -> None:
        """:class:`Stop` to every rank still in the run, once: they end with exit code 0 while rank 0 writes
        the run's files (however long that takes, they no longer wait on rank 0 past ``--rank-timeout``)."""
        if self.released:
            return
        self.released = True
        lost = sorted(self.lost)
        for rank in [FED_RANK, *self._live(self.layout.device_ranks)]:
            self._send(Stop(lost), rank)
        for rank in sorted(self.setting_up):     # a new process still setting up ends after its set-up
            self._send_anyway(Stop(lost), rank)

    def end_round(self, round_index: int) -> dict[str, dict[str, float]]:
        """Every rank checks its models and reports its measured seconds (rank 0 raises the first
        divergence a rank reports); the round's measured seconds per stage and role (``"3"``, ``"edge"``). A
        device rank lost here is taken out where the algorithm allows absence."""
        for rank in [FED_RANK, *self._live(self.layout.device_ranks)]:
            self._send(RoundEnd(round_index), rank)
        (fed,) = self.channel.recv_many([FED_RANK], timeout=(1 + FED_ALLOWANCE) * self.channel.timeout)
        reports = [fed[1].msg]
        deadline = time.monotonic() + self.channel.timeout
        for rank in self._live(self.layout.device_ranks):
            try:
                report = self._recv(rank, deadline).msg
                self._refuse_bad(rank, check_report, report, rank, self.layout.devices_of(rank))
                reports.append(report)
            except PeerError as exc:
                if exc.rank != rank or not self._may_lose(exc):
                    raise
        for report in reports:
            self.ledger.merge(cast(Report, report).seconds)
        by_role = self.ledger.by_role()
        self.ledger.take()
        return by_role

