"""Ranks 1..W−1: the fed server's rank and the device ranks (docs/distributed.md).

A rank hosts its roles with the simulator's handlers (:mod:`trainers.roles.hosts`: a
:class:`~trainers.roles.hosts.FedHost` on rank 1, a :class:`~trainers.roles.hosts.DeviceHost` of its devices
on a device rank) and serves rank 0's messages until :class:`Stop`: each message is handed to the
host, whose answers go straight to their receiver (an activation to rank 0, an upload to the fed
server, the fed server's blocks to a device). A :class:`~trainers.roles.protocol.Take` reads the next
message from the rank it names, so the order of everything is rank 0's, as in the simulator.

A rank measures what it does (device FP and BP per device, transfers as arrival − send, emulated
with ``--emulate-links``) in a :class:`~trainers.distributed.timing.StageLedger` and reports it at
the round's end (:class:`~trainers.roles.protocol.RoundEnd`).

A device rank loads the data set itself (its own ``--data-root``, or only its devices' files of a
per-device folder, ``--device-data``: :mod:`trainers.inputs.device_data`) and builds the model's
architecture from the spec; rank 0 sends it only the positions of its devices' samples, their cuts,
seeds and optimizer, and the model's initial weights: no input sample ever crosses the wire. It
imports user code (``--model file.py:factory``) only when its own command line names it.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from adaptplan.errors import InputError
from trainers.distributed.control import LinkRates, Readmit, Ready, Report, RoleError, Setup, Stop
from trainers.distributed.layout import EDGE_RANK, FED_RANK, RankLayout
from trainers.distributed.timing import book_transfer, link_rate
from trainers.distributed.transport import FrameChannel, PeerError, role_error
from trainers.engine.clock import StageLedger
from trainers.roles.checks import BadMessageError
from trainers.roles.core import Device
from trainers.roles.head import Head
from trainers.roles.hosts import DeviceHost, FedHost, take
from trainers.roles.messages import CutGradient, HeadForward, MessageMismatchError, ModelDownload, ModelUpload, NonFiniteError
from trainers.roles.protocol import EDGE, FED, Forward, RoundEnd, Send, Take

IDLE_FACTOR = 1.5
"""A rank waiting for rank 0's next message allows it this many --rank-timeout."""


@dataclass(frozen=True)
class WorkerOptions:
    """What a serving rank takes from its own command line (everything else comes from rank 0)."""

    timeout: float = 60.0
    threads: int | None = None
    data_root: str | None = None
    download: bool = False
    model: str | None = None          # the --model its command line names, if any
    device_data: str | None = None    # its --device-data folder, if any
    quiet: bool = False               # --quiet: no line on joining and per round


class RankLoop:
    """Serve rank 0's messages with ``host`` (a FedHost on the fed rank; on a device rank the
    DeviceHost that :class:`Setup` builds)."""

    def __init__(self, channel: FrameChannel, layout: RankLayout, first_timeout: float,
                 options: WorkerOptions | None = None) -> None:
        self.channel = channel
        self.layout = layout
        self.first_timeout = first_timeout
        self.options = options or WorkerOptions()
        self.rank = channel.rank
        self.me = FED if self.rank == FED_RANK else None
        self.host: Any = FedHost() if self.rank == FED_RANK else None
        self.ledger = StageLedger()
        self.rates: LinkRates | None = None

    def say(self, what: str) -> None:
        """One progress line on standard output (never with ``--quiet``): this rank, its role, ``what``."""
        if not self.options.quiet:
            print(f"rank {self.rank} ({self.layout.describe(self.rank)}): {what}", flush=True)

    def _rank(self, address: Any) -> int:
        return EDGE_RANK if address == EDGE else FED_RANK if address == FED else self.layout.rank_of(int(address))

    def emit(self, to: Any, msg: Any, charged_bytes: int | None = None) -> None:
        """Send a host's answer to its receiver's rank, with its link's rate (emulated links). A
        device rank that stopped receiving is passed over: rank 0 waits on every device rank
        itself and decides (it goes on without it where the algorithm allows absence, else stops)."""
        sender = self.me if self.me is not None else getattr(msg, "device", None)
        rank = self._rank(to)
        try:
            self.channel.send(msg, rank, rate=link_rate(self.rates, msg, sender, to), charged_bytes=charged_bytes)
        except PeerError:
            if rank not in self.layout.device_ranks:
                raise

    def serve(self) -> None:
        """Until :class:`Stop`: the first message may take ``first_timeout`` s (rank 0 loads data,
        profiles and plans first), every later one ``IDLE_FACTOR`` time-outs (rank 0 sends at least
        one message per round; it waits for a rank at most one time-out, so when another rank hangs
        rank 0 notices first and names it)."""
        timeout = self.first_timeout
        while True:
            envelope = self.channel.recv(EDGE_RANK, timeout=timeout)
            timeout = IDLE_FACTOR * self.channel.timeout
            msg = envelope.msg
            if isinstance(msg, Stop):
                for rank in msg.lost:               # frames still queued for them are nobody's to wait for
                    self.channel.forget(rank, "taken out of the run")
                return
            try:
                self.dispatch(envelope)
            except BadMessageError as exc:          # a device rank's message this rank refused: rank 0 names it
                device = exc.device
                blame = self.layout.rank_of(device) if isinstance(device, int) and 0 <= device < self.layout.num_devices \
                    else None
                self.channel.send(RoleError("bad", str(exc), blame), EDGE_RANK)
            except (NonFiniteError, MessageMismatchError, InputError) as exc:   # the role code's own: rank 0 decides
                self.channel.send(role_error(exc), EDGE_RANK)
            except PeerError as exc:                # a device rank this rank waited on (the fed server's uploads)
                if exc.rank not in self.layout.device_ranks:
                    raise
                self.channel.send(RoleError("lost", str(exc).removeprefix(f"rank {exc.rank} ({exc.who}) "), exc.rank),
                                  EDGE_RANK)        # rank 0 names that rank (issue 67 M5), not this one

    def dispatch(self, envelope: Any) -> None:
        msg = envelope.msg
        if isinstance(msg, Setup):
            self.setup(msg)
        elif isinstance(msg, LinkRates):
            self.rates = msg
        elif isinstance(msg, Readmit):              # a device rank came back as a new process
            self.channel.restart_numbering(msg.rank)
            self.channel.admit(msg.rank)
        elif isinstance(msg, Take):
            taken = self.channel.recv(self._rank(msg.source))
            take(self.host, msg, book_transfer(self.ledger, taken, self.me), self.emit)
        elif isinstance(msg, RoundEnd):
            self.host.handle(msg, self.emit)
            self.channel.send(Report(self.ledger.take()), EDGE_RANK)
            self.say(f"round {msg.round} done")
        elif isinstance(msg, Forward):              # each device's FP timed, its activation sent at once
            for item in msg.items:
                start = time.perf_counter()
                self.host.handle(Forward(msg.round, [item], msg.recompute), self.emit)
                self.ledger.add(item[0], "device FP", time.perf_counter() - start)
        elif isinstance(msg, HeadForward):          # a U-shaped split's head: its forward and backward timed
            book_transfer(self.ledger, envelope, self.me)
            self.host.handle(msg, self.emit)
            forward, backward = self.host.heads[msg.device].seconds
            self.ledger.add(msg.device, "device FP", forward)
            self.ledger.add(msg.device, "device BP", backward)
        elif isinstance(msg, CutGradient):
            book_transfer(self.ledger, envelope, self.me)
            start = time.perf_counter()
            self.host.handle(msg, self.emit)
            self.ledger.add(msg.device, "device BP", time.perf_counter() - start)
        elif isinstance(msg, Send):               # the link is charged what the message says (eq. 25)
            self.host.handle(msg, lambda to, out: self.emit(to, out, msg.charged_bytes))
        else:
            if isinstance(msg, (ModelUpload, ModelDownload)):
                book_transfer(self.ledger, envelope, self.me)
            self.host.handle(msg, self.emit)

    def setup(self, msg: Setup) -> None:
        """Load the data and build the chain here (:func:`local_chain`), build the hosted devices on
        their samples, warm torch up on a copy of the chain (eval mode, zeros: no random number is
        drawn, no state changes), then tell rank 0 this rank is ready."""
        template, samples = local_chain(msg.source, msg.initial, self.options, sorted(msg.devices))
        devices = {}
        for i, spec in msg.devices.items():
            x, y, positions = samples(i, np.asarray(spec.positions.numpy(), dtype=np.int64))
            devices[i] = Device(i, template, spec.cut, x, y, positions, spec.batch_size, spec.seed, spec.optimizer, spec.defence)
        heads = {i: Head(i, template, spec.defence.head, spec.head_optimizer or spec.optimizer, spec.defence, spec.seed)
                 for i, spec in msg.devices.items() if spec.defence.head}
        self.host = DeviceHost(devices, heads=heads)
        if devices:
            warm = copy.deepcopy(template).eval()
            with torch.no_grad():
                warm(torch.zeros_like(next(iter(devices.values())).x[:2]))
        self.channel.send(Ready(sorted(devices)), EDGE_RANK)


Samples = Callable[[int, np.ndarray], "tuple[torch.Tensor, torch.Tensor, np.ndarray]"]
"""``samples(i, positions)``: the (x, y) device i trains on and rank 0's ``positions`` as rows of them."""


def local_chain(source: dict[str, Any], initial: list[dict[str, torch.Tensor]], options: WorkerOptions,
                devices: Sequence[int] = ()) -> tuple[torch.nn.Sequential, Samples]:
    """(chain, samples) on this rank: the training data of ``devices`` — the data set
    ``source["dataset"]`` from this rank's ``--data-root``, or with ``source["device_data"]`` their
    files in this rank's ``--device-data`` folder — and the architecture of ``source["model"]`` with
    rank 0's ``initial`` weights. :class:`InputError` when the data differ from rank 0's (size,
    classes, another manifest), rank 0's positions lie outside them, the weights do not fit, or the
    model is user code this rank's command line does not name."""
    from profilers.chain import build_chain
    from trainers.inputs.models import BUILTINS, build_model

    model_spec = str(source["model"])
    if model_spec not in BUILTINS and model_spec != options.model:
        raise InputError(f"a device rank imports only code its own command line names: rank 0 trains {model_spec[:200]!r}; "
                         f"start every rank with --model {model_spec[:200]}", field="--model")
    samples, probe, num_classes = (_device_folder if source.get("device_data") else _shared_dataset)(source, options, devices)
    model = build_model(model_spec, tuple(int(s) for s in probe.shape[1:]), num_classes, int(source["model_width"]))
    chain = build_chain(model, probe).blocks
    if source.get("stage"):                  # the strategy trains another model by now (FedConcat's second stage)
        chain = build_chain(stage_model(chain, source["stage"]), probe).blocks
    if len(chain) != len(initial):
        raise InputError(f"{model_spec} splits into {len(chain)} blocks here, {len(initial)} on rank 0", field="--model")
    for j, (block, state) in enumerate(zip(chain, initial)):
        try:
            block.load_state_dict(state)
        except RuntimeError:
            raise InputError(f"rank 0's weights of block {j} do not fit {model_spec} built here", field="--model") from None
    return chain, samples


def stage_model(template: torch.nn.Sequential, stage: dict[str, Any]) -> torch.nn.Sequential:
    """The architecture of the later model that rank 0's set-up names (``stage``: the algorithm and its strategy's
    ``stage_spec``), built from the run's ``template`` (``Strategy.stage_architecture``); InputError for another."""
    from trainers.strategies import STRATEGIES

    name = str(stage.get("algorithm"))
    if name not in STRATEGIES:
        raise InputError(f"rank 0 trains a later model of an algorithm this rank does not have: {name[:100]!r}",
                         field="algorithm")
    try:
        return STRATEGIES[name].stage_architecture(template, {k: v for k, v in stage.items() if k != "algorithm"})
    except ValueError as exc:
        raise InputError(f"rank 0's later model cannot be built here: {exc}", field="--model") from None


def _shared_dataset(source: dict[str, Any], options: WorkerOptions, devices: Sequence[int]
                    ) -> tuple[Samples, torch.Tensor, int]:
    """A built-in data set loaded whole: every device's samples are rows of its training split."""
    from trainers.inputs.datasets import load_dataset

    data = load_dataset(str(source["dataset"]), options.data_root, options.download)
    if (int(data.x_train.shape[0]), int(data.num_classes)) != (int(source["num_train"]), int(source["num_classes"])):
        raise InputError(f"this rank's {source['dataset']} has {data.x_train.shape[0]} training samples of "
                         f"{data.num_classes} classes, rank 0's {source['num_train']} of {source['num_classes']}: give "
                         "every rank the same data set", field="--data-root")

    def samples(i: int, positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        if positions.size and (positions.min() < 0 or positions.max() >= data.x_train.shape[0]):
            raise InputError(f"device {i}'s samples lie outside this rank's {data.x_train.shape[0]} training samples",
                             field="--data-root")
        return data.x_train, data.y_train, positions

    return samples, data.x_train[:2], int(data.num_classes)


def _device_folder(source: dict[str, Any], options: WorkerOptions, devices: Sequence[int]
                   ) -> tuple[Samples, torch.Tensor, int]:
    """Only the hosted devices' files of this rank's ``--device-data`` folder, whose manifest must be
    rank 0's (same SHA-256)."""
    from trainers.inputs.device_data import FIELD, read_manifest

    if options.device_data is None:
        raise InputError("rank 0 trains on a per-device data folder: start every rank with --device-data DIR", field=FIELD)
    manifest = read_manifest(options.device_data)
    if manifest.digest != source["device_data"]:
        raise InputError(f"this rank's {options.device_data}/manifest.json differs from rank 0's: give every rank the "
                         "same manifest (the devices' own files may differ per machine)", field=FIELD)
    loaded = {i: manifest.load_device(i) for i in devices}

    def samples(i: int, positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        x, y = loaded[i]
        return x, y, manifest.local_positions(i, positions)

    probe = next(iter(loaded.values()))[0][:2] if loaded else torch.zeros((2, *manifest.input_shape))
    return samples, probe, manifest.num_classes
