"""The edge rank's view of the roles that live on other ranks.

:class:`RemoteDevice` and :class:`RemoteFed` stand in for :class:`~trainers.roles.Device` and
:class:`~trainers.roles.FedServer` inside the runtime's round loop: each call becomes a command
to the rank that holds the role, and the data travels on the direct path of the system model —
activations device → edge, cut gradients edge → device, model uploads device → fed server,
averaged blocks fed server → device (and → edge server for the blocks it holds).

Model messages between device and fed server therefore never pass through the edge rank: an
upload is represented here by a :class:`RemoteBlockState` per block (a reference to what the fed
server received, with its size), and a download built from such references is sent by the fed
server itself. A reference's ``state`` is fetched from the fed server only when the edge rank
really reads it (its own blocks after an average, a re-partition, a checkpoint).
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any, Iterable

import torch
from torch import nn

from trainers.distributed.layout import FED_RANK, RankLayout
from trainers.distributed.timing import StageLedger, emulated_arrival
from trainers.messages import Activation, BlockState, CutGradient, ModelDownload, ModelUpload

if TYPE_CHECKING:  # pragma: no cover
    from adaptplan.system import SystemSpec
    from trainers.distributed.transport import Channel


class Hub:
    """What the edge rank's proxies share: the channel, the rank layout, the sizes of the chain's
    blocks (bytes, to size references), the fetched-state cache, the round's system (link rates
    when ``emulate``), and the ledger of measured seconds per stage."""

    def __init__(self, channel: "Channel", layout: RankLayout, template: nn.Sequential, emulate: bool,
                 source: dict[str, Any] | None = None) -> None:
        self.channel = channel
        self.source = dict(source or {})     # the data set and model spec the device ranks build from
        self.layout = layout
        self.template = template
        self.emulate = emulate
        self.block_bytes = [sum(t.numel() * t.element_size() for t in block.state_dict().values()) for block in template]
        self.system: "SystemSpec | None" = None
        self.served_from: float | None = None
        self.measured = StageLedger()
        self._next_id = 0
        self._fetched: dict[Any, BlockState] = {}

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def rate(self, device: int | None, name: str) -> float | None:
        """The link rate ``name`` (bit/s) of ``device`` (None = the edge↔fed links) when emulating."""
        if not self.emulate or self.system is None:
            return None
        if device is None:
            return float(getattr(self.system, name))
        return float(getattr(self.system.devices[device], name))

    def command(self, rank: int, op: str, **fields: Any) -> None:
        self.channel.send({"op": op, **fields}, rank)

    def ask(self, rank: int, op: str, **fields: Any) -> Any:
        self.command(rank, op, **fields)
        return self.channel.recv(rank)

    def fetch(self, refs: list[Any], charged_bytes: int | None = None) -> None:
        """Bring the fed server's block states ``refs`` here (one request); timed as the edge
        server's model download (fed→edge, r_{f→e}), emulated for ``charged_bytes`` (default: the
        bytes sent)."""
        missing = [r for r in refs if r not in self._fetched]
        if not missing:
            return
        reply = self.ask(FED_RANK, "fetch", refs=missing, rate=self.rate(None, "fed_to_edge_bps"))
        sent = sum(bs.num_bytes for bs in reply["blocks"].values())
        arrived = emulated_arrival(reply, sent if charged_bytes is None else charged_bytes)
        self.measured.add("edge", "model download", arrived - reply["t_send"])
        self._fetched.update(reply["blocks"])

    def take(self, ref: Any) -> BlockState:
        return self._fetched[ref]

    def forget(self) -> None:
        self._fetched.clear()


class RemoteBlockState:
    """A block state held by the fed server (``ref``); ``num_bytes`` known without fetching.
    Reading ``state`` or ``optimizer`` fetches it (with its siblings ``group``) once."""

    def __init__(self, hub: Hub, ref: Any, num_bytes: int, group: list[Any] | None = None) -> None:
        self.hub = hub
        self.ref = ref
        self.num_bytes = int(num_bytes)
        self.group = group if group is not None else [ref]
        self.fetched = False
        self._copy: BlockState | None = None

    def _local(self) -> BlockState:
        if self._copy is None:           # kept here: the fed server may release it once fetched
            self.hub.fetch(self.group)
            self._copy = self.hub.take(self.ref)
            self.fetched = True
        return self._copy

    @property
    def state(self) -> dict[str, torch.Tensor]:
        return self._local().state

    @property
    def optimizer(self) -> list[dict[str, Any]] | None:
        return self._local().optimizer

    def __reduce__(self) -> tuple:      # pickled (a checkpoint) as the plain state
        local = self._local()
        return (BlockState, (local.state, local.optimizer))


def is_remote(blocks: dict[int, Any]) -> bool:
    """True when every block is a reference the fed server can still send directly."""
    return bool(blocks) and all(isinstance(b, RemoteBlockState) and not b.fetched for b in blocks.values())


def materialize(blocks: dict[int, Any]) -> dict[int, BlockState]:
    return {j: BlockState(b.state, b.optimizer) if isinstance(b, RemoteBlockState) else b for j, b in blocks.items()}


class RemoteDevice:
    """Device ``index`` on rank ``layout.rank_of(index)``; tracks its cut and pending step here."""

    def __init__(self, hub: Hub, index: int, cut: int) -> None:
        self.hub = hub
        self.index = index
        self.rank = hub.layout.rank_of(index)
        self.cut = cut
        self.pending: tuple[int, int] | None = None
        self._blocks: nn.ModuleList | None = None

    # ---- the exchange (one device at a time; the runtime batches a group's forwards itself) -----------
    def forward(self, round_index: int, batch_size: int | None = None) -> Activation:
        self.hub.command(self.rank, "forward", round=round_index, items=[(self.index, batch_size)],
                         rates={self.index: self.hub.rate(self.index, "up_bps")})
        return self.receive_activation(self.hub.channel.recv(self.rank))

    def receive_activation(self, envelope: dict[str, Any]) -> Activation:
        """Book an activation envelope from the device rank: its FP seconds and its uplink time
        (arrival − send, with the emulated link delay when ``--emulate-links``)."""
        msg: Activation = envelope["msg"]
        arrived = emulated_arrival(envelope, msg.num_bytes)
        self.hub.measured.add(self.index, "device FP", envelope["fp"])
        self.hub.measured.add(self.index, "uplink", arrived - envelope["t_send"])
        self.pending = (msg.round, msg.step)
        self._blocks = None
        self.hub.served_from = time.time()
        return msg

    def backward(self, msg: CutGradient) -> None:
        if self.hub.served_from is not None:      # the edge server's work since the last activation came in
            self.hub.measured.add("edge", "server", time.time() - self.hub.served_from)
            self.hub.served_from = None
        self.hub.command(self.rank, "backward", msg=msg, t_send=time.time(), rate=self.hub.rate(self.index, "down_bps"))
        self.pending = None
        self._blocks = None

    # ---- model messages -------------------------------------------------------------------------------
    def upload(self, round_index: int, blocks: Iterable[int], weight: float, with_optimizer: bool = False) -> ModelUpload:
        """The device sends its blocks to the fed server; here: references with their sizes."""
        chosen = [j for j in blocks if j < self.cut]
        if not chosen:
            return ModelUpload(self.index, round_index, "device", {}, weight)
        uid = self.hub.new_id()
        self.hub.command(self.rank, "upload", device=self.index, round=round_index, blocks=chosen, weight=weight,
                         with_optimizer=with_optimizer, id=uid, rate=self.hub.rate(self.index, "fed_up_bps"))
        self.hub.command(FED_RANK, "receive", src=self.rank, id=uid)
        group = [("up", uid, j) for j in chosen]
        refs = {j: RemoteBlockState(self.hub, ("up", uid, j), self.hub.block_bytes[j], group) for j in chosen}
        upload = ModelUpload(self.index, round_index, "device", refs, weight)
        upload.remote_id = uid   # type: ignore[attr-defined]
        return upload

    def download(self, msg: ModelDownload) -> None:
        """Blocks the fed server holds go fed → device directly; anything else (a re-partition's
        merged blocks) from here."""
        if is_remote(msg.blocks):
            refs = {j: b.ref for j, b in msg.blocks.items()}
            self.hub.command(FED_RANK, "send", dst=self.rank, device=msg.device, round=msg.round, receiver=msg.receiver,
                             refs=refs, cut=msg.cut, rate=self.hub.rate(self.index, "fed_down_bps"),
                             fresh_optimizer=msg.fresh_optimizer)
            self.hub.command(self.rank, "download", device=self.index, source=FED_RANK)
        else:
            plain = ModelDownload(msg.device, msg.round, msg.receiver, materialize(msg.blocks), msg.cut, msg.shared,
                                  msg.fresh_optimizer)
            self.hub.command(self.rank, "download", device=self.index, source=None, msg=plain, t_send=time.time(),
                             rate=self.hub.rate(self.index, "fed_down_bps"))
        if msg.cut is not None:
            self.cut = msg.cut
        self._blocks = None

    # ---- views and checkpoint ---------------------------------------------------------------------------
    @property
    def blocks(self) -> nn.ModuleList:
        """The device's client blocks as local modules (fetched once until the device changes)."""
        if self._blocks is None:
            states = self.hub.ask(self.rank, "blocks", device=self.index)["states"]
            modules = []
            for j, sd in enumerate(states):
                module = copy.deepcopy(self.hub.template[j])
                module.load_state_dict(sd)
                modules.append(module)
            self._blocks = nn.ModuleList(modules)
        return self._blocks

    def state_dict(self) -> dict[str, Any]:
        return self.hub.ask(self.rank, "state", device=self.index)["state"]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.hub.command(self.rank, "load", device=self.index, state=state)
        self.cut = int(state["cut"])
        self.pending = None
        self._blocks = None


class RemoteFed:
    """The fed server on rank 1: averages what it received (device uploads by reference, the edge
    server's inline), keeps the global client model; results stay there as references."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.global_blocks: dict[int, RemoteBlockState] = {}
        self._uploads: list[ModelUpload] = []

    def add(self, upload: ModelUpload) -> None:
        """Collect one upload (device uploads are references to states kept by their ranks)."""
        self._uploads.append(upload)

    def finish(self, round_index: int) -> dict[int, RemoteBlockState]:
        """Average the uploads collected since the last call, on the fed server's rank."""
        uploads, self._uploads = self._uploads, []
        return self.average(uploads, round_index)

    def average(self, uploads: list[ModelUpload], round_index: int) -> dict[int, RemoteBlockState]:
        items = []
        weight_of_block: dict[int, None] = {}
        for u in uploads:
            if not u.blocks:
                continue
            weight_of_block.update(dict.fromkeys(u.blocks))
            uid = getattr(u, "remote_id", None)
            if uid is not None and is_remote(u.blocks):
                items.append({"ref": uid, "weight": float(u.weight)})
            else:
                inline = ModelUpload(u.device, u.round, u.sender, materialize(u.blocks), u.weight)
                items.append({"inline": inline})
        seq = self.hub.new_id()
        self.hub.command(FED_RANK, "average", round=round_index, items=items, seq=seq, t_send=time.time(),
                         rate=self.hub.rate(None, "edge_to_fed_bps"))
        blocks = sorted(weight_of_block)
        group = [("avg", seq, j) for j in blocks]
        out = {j: RemoteBlockState(self.hub, ("avg", seq, j), self.hub.block_bytes[j], group) for j in blocks}
        for j in blocks:
            self.global_blocks[j] = RemoteBlockState(self.hub, ("global", j), self.hub.block_bytes[j],
                                                     [("global", k) for k in blocks])
        self.hub.forget()
        return out

    def global_states(self, blocks: Iterable[int]) -> dict[int, Any]:
        return {j: RemoteBlockState(self.hub, ("global", j), self.hub.block_bytes[j],
                                    [("global", k) for k in self.global_blocks])
                for j in blocks if j in self.global_blocks}

    def state_dict(self) -> dict[str, Any]:
        return self.hub.ask(FED_RANK, "state")["state"]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.hub.command(FED_RANK, "load", state=state)
        blocks = sorted(int(j) for j in state.get("global_blocks", {}))
        self.global_blocks = {j: RemoteBlockState(self.hub, ("global", j), self.hub.block_bytes[j],
                                                  [("global", k) for k in blocks]) for j in blocks}
        self.hub.forget()
