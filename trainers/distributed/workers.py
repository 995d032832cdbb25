"""The loops of the ranks that are not the edge server: a device rank and the fed server rank.

Both wait for the edge rank's next command and carry it out with the role code of
:mod:`trainers.roles` (unchanged), sending data on the direct path: a device's activation to the
edge rank, its model upload to the fed server; the fed server's averaged blocks to the devices
that download them. Each keeps a :class:`~trainers.distributed.timing.StageLedger` of what it
measured and sends it with its end-of-round report.

A device rank loads the data set itself (its own ``--data-root``) and builds the model's
architecture from the spec; rank 0 sends it only the positions of its devices' samples, their cuts,
seeds and optimizer, and the model's initial weights: no input sample ever crosses the wire. It
imports user code (``--model file.py:factory``) only when its own command line names it.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from trainers.distributed.layout import EDGE_RANK, FED_RANK
from trainers.distributed.timing import StageLedger, emulated_arrival
from trainers.distributed.transport import Channel
from trainers.engine import check_device_finite
from trainers.messages import BlockState, MessageMismatchError, ModelDownload, ModelUpload, NonFiniteError
from trainers.roles import Device, FedServer
from adaptplan.errors import InputError


@dataclass(frozen=True)
class WorkerOptions:
    """What a serving rank takes from its own command line (everything else comes from rank 0)."""

    timeout: float = 60.0
    threads: int | None = None
    data_root: str | None = None
    download: bool = False
    model: str | None = None          # the --model its command line names, if any


IDLE_FACTOR = 1.5
"""A rank waiting for rank 0's next command allows it this many --rank-timeout."""


class _Loop:
    """Receive a command from the edge rank, run ``op_<name>``, until ``stop``."""

    def __init__(self, channel: Channel, first_timeout: float) -> None:
        self.channel = channel
        self.first_timeout = first_timeout
        self.ledger = StageLedger()

    def serve(self) -> None:
        """Until ``stop``: the first command may take ``first_timeout`` s (rank 0 loads data,
        profiles and plans first), every later one ``IDLE_FACTOR`` time-outs (rank 0 sends at least
        one command per round; it waits for a rank at most one time-out, so when another rank hangs
        rank 0 notices first and names it)."""
        timeout = self.first_timeout
        while True:
            command = self.channel.recv(EDGE_RANK, timeout=timeout)
            timeout = IDLE_FACTOR * self.channel.timeout
            op = command["op"]
            if op == "stop":
                return
            try:
                getattr(self, f"op_{op}")(command)
            except (NonFiniteError, MessageMismatchError, InputError) as exc:   # the role code's own errors: rank 0 decides
                kind = "nonfinite" if isinstance(exc, NonFiniteError) else \
                    "mismatch" if isinstance(exc, MessageMismatchError) else "input"
                self.channel.send({"op": "role-error", "kind": kind, "message": str(exc)}, EDGE_RANK)


class DeviceRank(_Loop):
    """Hosts the devices the edge rank sets up here (``layout.devices_of(rank)``)."""

    def __init__(self, channel: Channel, first_timeout: float, options: WorkerOptions | None = None) -> None:
        super().__init__(channel, first_timeout)
        self.options = options or WorkerOptions()
        self.devices: dict[int, Device] = {}

    def op_setup(self, c: dict[str, Any]) -> None:
        """Load the data set and build the chain here (:func:`local_chain`), build the hosted
        devices on their samples' positions, warm torch up on a copy of the chain (eval mode,
        zeros: no random number is drawn, no state changes), then tell rank 0 this rank is ready."""
        template, x, y = local_chain(c["source"], c["initial"], self.options)
        for i, spec in c["devices"].items():
            positions = np.asarray(spec["positions"].numpy(), dtype=np.int64)
            if positions.size and (positions.min() < 0 or positions.max() >= x.shape[0]):
                raise InputError(f"device {i}'s samples lie outside this rank's {x.shape[0]} training samples",
                                 field="--data-root")
            self.devices[i] = Device(i, template, spec["cut"], x, y, positions, spec["batch_size"], spec["seed"],
                                     spec["optimizer"])
        warm = copy.deepcopy(template).eval()
        with torch.no_grad():
            warm(torch.zeros_like(x[:2]))
        self.channel.send({"ready": sorted(c["devices"])}, EDGE_RANK)

    def op_forward(self, c: dict[str, Any]) -> None:
        for i, batch in c["items"]:
            start = time.perf_counter()
            msg = self.devices[i].forward(c["round"], batch)
            fp = time.perf_counter() - start
            self.channel.send({"device": i, "msg": msg, "fp": fp, "t_send": time.time(), "rate": c["rates"].get(i)},
                              EDGE_RANK)

    def op_backward(self, c: dict[str, Any]) -> None:
        msg = c["msg"]
        arrived = emulated_arrival(c, msg.num_bytes)
        self.ledger.add(msg.device, "downlink", arrived - c["t_send"])
        start = time.perf_counter()
        self.devices[msg.device].backward(msg)
        self.ledger.add(msg.device, "device BP", time.perf_counter() - start)

    def op_upload(self, c: dict[str, Any]) -> None:
        upload = self.devices[c["device"]].upload(c["round"], c["blocks"], c["weight"], c["with_optimizer"])
        self.channel.send({"id": c["id"], "upload": upload, "t_send": time.time(), "rate": c["rate"]}, FED_RANK)

    def op_download(self, c: dict[str, Any]) -> None:
        envelope = c if c["source"] is None else self.channel.recv(c["source"])
        msg: ModelDownload = envelope["msg"]
        arrived = emulated_arrival(envelope, msg.num_bytes)
        self.ledger.add(c["device"], "model download", arrived - envelope["t_send"])
        self.devices[c["device"]].download(msg)

    def op_report(self, c: dict[str, Any]) -> None:
        error = None
        for device in self.devices.values():
            try:
                check_device_finite(device, c["round"])
            except NonFiniteError as exc:
                error = str(exc)
                break
        self.channel.send({"seconds": self.ledger.take(), "nonfinite": error}, EDGE_RANK)

    def op_blocks(self, c: dict[str, Any]) -> None:
        states = [{k: v.detach().clone() for k, v in b.state_dict().items()} for b in self.devices[c["device"]].blocks]
        self.channel.send({"states": states}, EDGE_RANK)

    def op_state(self, c: dict[str, Any]) -> None:
        self.channel.send({"state": self.devices[c["device"]].state_dict()}, EDGE_RANK)

    def op_load(self, c: dict[str, Any]) -> None:
        self.devices[c["device"]].load_state_dict(c["state"])


def local_chain(source: dict[str, Any], initial: list[dict[str, torch.Tensor]], options: WorkerOptions
                ) -> tuple[torch.nn.Sequential, torch.Tensor, torch.Tensor]:
    """(chain, x_train, y_train) on this rank: the data set ``source["dataset"]`` from this rank's
    ``--data-root``, the architecture of ``source["model"]`` with rank 0's ``initial`` weights.
    :class:`InputError` when the data set differs from rank 0's in size or classes, the weights
    do not fit, or the model is user code this rank's command line does not name."""
    from profilers.chain import build_chain
    from trainers.datasets import load_dataset
    from trainers.models import BUILTINS, build_model

    model_spec = str(source["model"])
    if model_spec not in BUILTINS and model_spec != options.model:
        raise InputError(f"a device rank imports only code its own command line names: rank 0 trains {model_spec[:200]!r}; "
                         f"start every rank with --model {model_spec[:200]}", field="--model")
    data = load_dataset(str(source["dataset"]), options.data_root, options.download)
    if (int(data.x_train.shape[0]), int(data.num_classes)) != (int(source["num_train"]), int(source["num_classes"])):
        raise InputError(f"this rank's {source['dataset']} has {data.x_train.shape[0]} training samples of "
                         f"{data.num_classes} classes, rank 0's {source['num_train']} of {source['num_classes']}: give "
                         "every rank the same data set", field="--data-root")
    input_shape = tuple(int(s) for s in data.x_train.shape[1:])
    model = build_model(model_spec, input_shape, data.num_classes, int(source["model_width"]))
    chain = build_chain(model, data.x_train[:2]).blocks
    if len(chain) != len(initial):
        raise InputError(f"{model_spec} splits into {len(chain)} blocks here, {len(initial)} on rank 0", field="--model")
    for j, (block, state) in enumerate(zip(chain, initial)):
        try:
            block.load_state_dict(state)
        except RuntimeError:
            raise InputError(f"rank 0's weights of block {j} do not fit {model_spec} built here", field="--model") from None
    return chain, data.x_train, data.y_train


class FedRank(_Loop):
    """The fed server: keeps what devices uploaded (by reference id) and the averages, sends blocks
    to devices and to the edge server on request."""

    def __init__(self, channel: Channel, first_timeout: float) -> None:
        super().__init__(channel, first_timeout)
        self.fed = FedServer()
        self.uploads: dict[int, ModelUpload] = {}
        self.averages: dict[int, dict[int, BlockState]] = {}
        self.ready_at = 0.0        # when the last upload has (emulated-)arrived

    def op_receive(self, c: dict[str, Any]) -> None:
        envelope = self.channel.recv(c["src"])
        upload: ModelUpload = envelope["upload"]
        arrived = float(envelope["arrived"])
        if envelope.get("rate"):
            arrived = max(arrived, envelope["t_send"] + 8.0 * upload.num_bytes / envelope["rate"])
        self.ready_at = max(self.ready_at, arrived)
        self.ledger.add(upload.device, "model upload", arrived - envelope["t_send"])
        self.uploads[envelope["id"]] = upload

    def op_average(self, c: dict[str, Any]) -> None:
        uploads = []
        inline_bytes = 0
        for item in c["items"]:
            if "ref" in item:
                uploads.append(self.uploads.pop(item["ref"]))
            else:
                uploads.append(item["inline"])
                inline_bytes += item["inline"].num_bytes
        if inline_bytes:
            arrived = emulated_arrival(c, inline_bytes)
            self.ledger.add("edge", "model upload", arrived - c["t_send"])
        wait = self.ready_at - time.time()
        if wait > 0:
            time.sleep(wait)
        self.averages = {c["seq"]: self.fed.average(uploads, c["round"])}   # only the latest average is referenced

    def _block(self, ref: tuple) -> BlockState:
        kind = ref[0]
        if kind == "avg":
            return self.averages[ref[1]][ref[2]]
        if kind == "global":
            return BlockState(self.fed.global_blocks[ref[1]])
        return self.uploads[ref[1]].blocks[ref[2]]

    def _release(self, refs: list[tuple]) -> None:
        """Uploads referenced once (a hand-off, a re-partition) are dropped once delivered."""
        for ref in refs:
            if ref[0] == "up":
                self.uploads.pop(ref[1], None)

    def op_send(self, c: dict[str, Any]) -> None:
        blocks = {j: self._block(tuple(ref)) for j, ref in c["refs"].items()}
        msg = ModelDownload(c["device"], c["round"], c["receiver"], blocks, c["cut"],
                            fresh_optimizer=bool(c.get("fresh_optimizer", False)))
        self.channel.send({"msg": msg, "t_send": time.time(), "rate": c["rate"]}, c["dst"])
        self._release([tuple(r) for r in c["refs"].values()])

    def op_fetch(self, c: dict[str, Any]) -> None:
        refs = [tuple(r) for r in c["refs"]]
        blocks = {ref: self._block(ref) for ref in refs}
        self.channel.send({"blocks": blocks, "t_send": time.time(), "rate": c["rate"]}, EDGE_RANK)
        self._release(refs)

    def op_report(self, c: dict[str, Any]) -> None:
        self.channel.send({"seconds": self.ledger.take(), "nonfinite": None}, EDGE_RANK)

    def op_state(self, c: dict[str, Any]) -> None:
        self.channel.send({"state": self.fed.state_dict()}, EDGE_RANK)

    def op_load(self, c: dict[str, Any]) -> None:
        self.fed.load_state_dict(c["state"])

