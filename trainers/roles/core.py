"""The three roles of split federated learning (docs/architecture.md "Roles").

* :class:`Device` i holds its client blocks w_{c,i} (chain blocks 0..ℓ_i−1), its data sampler and
  its optimizer; it emits :class:`~trainers.roles.messages.Activation` and consumes
  :class:`~trainers.roles.messages.CutGradient`, and uploads/downloads its blocks as model messages.
* :class:`EdgeServer` holds the server blocks: one instance per (owner, block), the owner being a
  device (a per-device copy: SFL-V1's server models, AdaptSFL's non-common parts w_{n,i}) or
  ``None`` (one instance shared by every device: w_s), its optimizers (steps per owner) and model messages.
  The passes a strategy composes over it — forwards, full backward, cut gradients at frozen weights,
  per-device server gradients — are run by :class:`trainers.roles.passes.EdgePasses` within the runtime's
  memory budget.
* :class:`FedServer` averages uploaded blocks (FedAvg, weighted) and keeps the global client model.

Roles interact only through messages: no role reads another role's modules. A runtime (the
simulator in :mod:`trainers.engine.split_engine`, or torch.distributed) delivers the messages.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Sequence, cast

import numpy as np
import torch
from torch import nn
from torch.nn.parameter import is_lazy

from trainers.inputs.partition import DeviceSampler
from trainers.roles.defences import ActivationDefence
from trainers.roles.messages import (
    Activation,
    BlockState,
    CutGradient,
    MessageMismatchError,
    ModelDownload,
    ModelUpload,
    check_all_finite,
    check_finite,
)
from trainers.roles.optim import OptimizerSpec, RoleOptimizer, mean_param_state

Owner = Hashable            # a device index (per-device copy) or None (shared by all devices)
Key = tuple[Owner, int]     # (owner, 0-based block index) of an edge-server instance


def has_batch_coupling(module: nn.Module) -> bool:
    """True if samples interact inside a batch (BatchNorm), so devices must not be concatenated."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


def random_layer(module: nn.Module) -> nn.Module | None:
    """The first submodule that draws random numbers while training (Dropout and its variants), if any:
    running it in another order than before would give other masks."""
    return next((m for m in module.modules() if isinstance(m, (nn.modules.dropout._DropoutNd, nn.RReLU))), None)


def module_entries(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s parameters and buffers by name: what its state dict holds."""
    own: dict[str, torch.Tensor] = dict(module.named_parameters())
    own.update(module.named_buffers())
    return own


def check_block_state(module: nn.Module, state: Any, where: str) -> None:
    """ValueError naming ``where`` unless ``state`` holds exactly ``module``'s parameters and buffers, each a
    tensor of the module's shape and dtype (``load_state_dict`` would copy integer weights into float ones)."""
    own = module_entries(module)
    if not isinstance(state, dict) or set(state) != set(own):
        raise ValueError(f"{where} must hold exactly the block's entries {sorted(own)[:6]}")
    for name, mine in own.items():
        value = state[name]
        if not torch.is_tensor(value) or value.shape != mine.shape or value.dtype != mine.dtype:
            raise ValueError(f"{where}[{name!r}] must be a {mine.dtype} tensor of shape {tuple(mine.shape)}")


def share_state(module: nn.Module, state: dict[str, torch.Tensor]) -> bool:
    """Load ``state`` into ``module`` without copying it: every parameter and buffer is pointed at the
    state's tensor (``.data`` rebound, the Parameter objects kept, so optimizers still hold them).
    Modules loaded from one download message thus share one copy of its tensors until one of them
    trains (:func:`own_state`). Falls back to copying (``load_state_dict``) and returns False when the
    state's names, shapes, dtypes or devices differ from the module's (into tensors of the module's own:
    it may have shared them)."""
    own = module_entries(module)
    if set(own) != set(state) or any(not torch.is_tensor(state[k]) or state[k].shape != t.shape or state[k].dtype != t.dtype
                                      or state[k].device != t.device for k, t in own.items()):
        own_state(module)
        module.load_state_dict(state)
        return False
    with torch.no_grad():
        for k, t in own.items():
            t.data = state[k].detach()
    return True


def shared_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` (a template block) whose parameters and buffers are new tensors on
    ``module``'s storage: nothing is copied, so every device starting from the template holds one
    copy of it until it trains (:func:`own_state`)."""
    tensors = [*module.parameters(), *module.buffers()]
    if any(is_lazy(t) for t in tensors):      # a lazy module's parameters have no storage yet
        return copy.deepcopy(module)
    # placeholders, each a tensor of its own (its own autograd version counter: a detached view would share
    # the template's, and one device's in-place step would then void another's saved activations)
    memo: dict[int, Any] = {id(t): (nn.Parameter(t.new_empty(0), requires_grad=t.requires_grad)
                                    if isinstance(t, nn.Parameter) else t.new_empty(0)) for t in tensors}
    copied = copy.deepcopy(module, memo)
    with torch.no_grad():
        for t in tensors:
            memo[id(t)].data = t.detach()
    return copied


def own_state(module: nn.Module) -> None:
    """Give ``module`` private copies of its parameters and buffers (after :func:`share_state`), so
    that training it changes no other module's tensors."""
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            t.data = t.data.clone()


def load_block(module: nn.Module, state: BlockState, optimizer: RoleOptimizer, fresh_optimizer: bool,
               shared: set[int], position: int) -> None:
    """A downloaded block into a device-side ``module`` (a client block, or a U-shaped split's head block): its
    tensors shared with the message until the device trains (``position`` added to ``shared``; or copied where they do
    not fit, then removed), the optimizer state of its parameters restarted (``fresh_optimizer``) or loaded from the
    message, and FedProx's anchor moved to the model downloaded."""
    with torch.no_grad():
        if share_state(module, state.state):
            shared.add(position)
        else:
            shared.discard(position)
        if fresh_optimizer:
            optimizer.reset(module.parameters())
        if state.optimizer is not None:
            optimizer.load_param_states(module.parameters(), state.optimizer)
        optimizer.reanchor(module.parameters())


def load_noise_state(generator: torch.Generator | None, state: dict[str, Any], owner: str) -> None:
    """Restore ``generator`` (a defence's noise stream; None: the role draws no noise) from ``state["noise_rng"]``;
    ValueError naming ``owner`` where the state holds no generator state of its shape."""
    if generator is None:
        return
    rng = state.get("noise_rng")
    if not torch.is_tensor(rng) or rng.dtype != torch.uint8 or rng.shape != generator.get_state().shape:
        raise ValueError(f"{owner}'s state must hold its noise generator's state (noise_rng), as a run with noise "
                         "writes it")
    generator.set_state(rng)


def index_tensor(indices: np.ndarray, device: torch.device) -> torch.Tensor:
    """Sample indices as a tensor on ``device`` (on CUDA through pinned memory, without waiting for the GPU)."""
    idx = torch.from_numpy(np.ascontiguousarray(indices))
    if device.type == "cuda":
        return idx.pin_memory().to(device, non_blocking=True)
    return idx.to(device)


def block_state(module: nn.Module, optimizer: RoleOptimizer | None = None) -> BlockState:
    """A snapshot of a block's state (tensors detached and copied: a message never changes after it is
    sent, even while the block trains on) and, if ``optimizer`` is given, its parameters' optimizer state."""
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    opt = optimizer.param_states(module.parameters()) if optimizer is not None else None
    return BlockState(state, opt)


@dataclass(frozen=True)
class _Replay:
    """What a recomputing device keeps of its forward while it waits for its reply: the sample indices and the
    random state the forward started from (CPU, and the data's CUDA device), so that running it again draws the
    same Dropout masks."""
    idx: torch.Tensor
    cpu_rng: torch.Tensor
    cuda_rng: torch.Tensor | None

    @classmethod
    def before(cls, idx: torch.Tensor) -> "_Replay":
        cuda = torch.cuda.get_rng_state(idx.device) if idx.device.type == "cuda" else None
        return cls(idx, torch.get_rng_state(), cuda)

    def run(self, forward: Callable[[torch.Tensor], Any]) -> Any:
        """``forward(idx)`` again, with autograd, from the random state it first ran from (the run's own random
        state is left as it was)."""
        devices = [self.idx.device] if self.cuda_rng is not None else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self.cpu_rng)
            if self.cuda_rng is not None:
                torch.cuda.set_rng_state(self.cuda_rng, self.idx.device)
            return forward(self.idx)


@dataclass
class _Pending:
    round: int
    step: int
    activation: torch.Tensor
    batch: Any = None       # the trainers.roles.batching.ClientBatch that computed it, if batched with other devices
    replay: _Replay | None = None   # a recomputed forward: the activation has no graph; backward runs it again
    penalty: torch.Tensor | None = None   # NoPeek's α·dCor(X, A) of this step, with its graph (a defence's)


class Device:
    """Device i (docs/model.md §2.1): client blocks, sampler, optimizer.

    Args:
        index: device id i.
        template: the whole chain (blocks are deep-copied from it when the device gains blocks).
        cut: ℓ_i, 1-based; the device holds blocks 0..ℓ_i−1.
        x, y: the training tensors; ``indices`` are device i's samples (its local dataset 𝒟_i).
        batch_size: b, samples per step; ``seed`` seeds the sampler.
        optimizer: the client optimizer spec.
        defence: what the device does to its activations before sending them (trainers/roles/defences.py).
    """

    def __init__(self, index: int, template: nn.Sequential, cut: int, x: torch.Tensor, y: torch.Tensor,
                 indices: np.ndarray, batch_size: int, seed: Any, optimizer: OptimizerSpec,
                 defence: ActivationDefence | None = None) -> None:
        self.index = index
        self.template = template
        self.x, self.y = x, y
        self.sampler = DeviceSampler(indices, batch_size, seed)
        self.optimizer_spec = optimizer
        self.blocks = nn.ModuleList(shared_copy(template[j]) for j in range(cut))
        self.optimizer = RoleOptimizer(optimizer, self.blocks.parameters())
        self.step = 0
        self.pending: _Pending | None = None
        self.defence = defence if defence is not None else ActivationDefence()
        self.noise_rng = self.defence.generator(seed, x.device)
        self._sent_labels = self._randomised_labels(seed)
        self.shared: set[int] = set(range(cut))
        """Blocks whose tensors are the template's or a download's, shared with every device that starts
        from the template or loaded the same message (no copy); a device takes its own copy when it next
        trains (:meth:`begin_step`)."""

    @property
    def cut(self) -> int:
        return len(self.blocks)

    @property
    def data_size(self) -> int:
        """|𝒟_i|, samples."""
        return int(self.sampler.indices.size)

    def label_counts(self, num_classes: int) -> np.ndarray:
        """Samples per class in 𝒟_i (the label histogram a device may share, e.g. SCALA's P_k)."""
        return np.bincount(self.y[torch.from_numpy(self.sampler.indices).to(self.y.device)].cpu().numpy(),
                           minlength=num_classes)

    # ---- the exchange -------------------------------------------------------------------------------
    def forward(self, round_index: int, batch_size: int | None = None, recompute: bool = False) -> Activation:
        """Eq. (2): a_i^t = φ(x_i^t; w_{c,i}); keeps the graph until :meth:`backward`. With
        ``recompute`` the forward runs without autograd and the device keeps only the sample indices
        and the random state (:class:`_Replay`); :meth:`backward` runs the forward again with autograd
        (the same values, masks and gradients), so a device waiting for its reply holds no activations
        inside its blocks, only its message. This is activation checkpointing done by hand:
        ``torch.utils.checkpoint`` (non-reentrant) builds the first forward's graph too and took
        10.7 against 8.9 ms per step of the CIFAR CNN's first stage at batch 16, one thread (the
        plain step: 5.1 ms). Blocks with buffers (BatchNorm statistics, updated by every forward)
        never recompute."""
        self.begin_step(round_index)
        drawn = self.sampler.next(batch_size)
        idx = index_tensor(drawn, self.x.device)
        y = self.labels(drawn, idx)
        if recompute and self.can_recompute:
            replay = _Replay.before(idx)
            with torch.no_grad():
                h = self._forward_samples(idx)
            return self.send(round_index, h, y, replay=replay, x=self._penalised_inputs(idx))
        return self.send(round_index, self._forward_samples(idx), y, x=self._penalised_inputs(idx))

    def _penalised_inputs(self, idx: torch.Tensor) -> torch.Tensor | None:
        """The inputs NoPeek's penalty needs (None without it: no copy of them on the hot path)."""
        return self.x[idx] if self.defence.nopeek > 0 else None

    @property
    def can_recompute(self) -> bool:
        """True if running the client blocks twice changes nothing (no buffers)."""
        return next(self.blocks.buffers(), None) is None

    def _forward_samples(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.x[idx]
        for block in self.blocks:
            h = block(h)
        return h

    def begin_step(self, round_index: int) -> None:
        """Before a step: the previous activation must be answered (:meth:`check_idle`), and blocks
        still shared with other devices (:attr:`shared`) get their own copy, as this step will change
        them (the forward's buffers, the optimizer's step)."""
        self.check_idle(round_index)
        for j in sorted(self.shared):
            own_state(self.blocks[j])
        self.shared.clear()

    def check_idle(self, round_index: int) -> None:
        """A device starts a step only when its previous activation has been answered."""
        if self.pending is not None:
            raise MessageMismatchError(f"device {self.index} starts round {round_index} with an unanswered activation "
                                       f"(round {self.pending.round}, step {self.pending.step})")

    def samples(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The inputs and labels of sample ``indices`` (drawn by the sampler), on the data's device."""
        idx = index_tensor(indices, self.x.device)
        return self.x[idx], self.labels(indices, idx)

    def _randomised_labels(self, seed: Any) -> tuple[np.ndarray, torch.Tensor] | None:
        """Under randomised response: the device's indices sorted and the labels it sends for them, in that order
        (drawn once; None otherwise)."""
        if self.defence.label_epsilon is None:
            return None
        ordered = np.sort(self.sampler.indices)
        true = self.y[index_tensor(ordered, self.y.device)].cpu().numpy()
        return ordered, torch.from_numpy(self.defence.randomised(true, seed)).to(self.y.device)

    def labels(self, indices: np.ndarray, idx: torch.Tensor) -> torch.Tensor:
        """The labels the device sends for samples ``indices`` (``idx`` on the data's device): the true ones, or
        under randomised response the ones it drew for them once (trainers/roles/defences.py)."""
        if self._sent_labels is None:
            return self.y[idx]
        ordered, sent = self._sent_labels
        return sent[index_tensor(np.searchsorted(ordered, indices), self.y.device)]

    def send(self, round_index: int, h: torch.Tensor, y: torch.Tensor, batch: Any = None,
             replay: _Replay | None = None, x: torch.Tensor | None = None) -> Activation:
        """Keep ``h`` (with its graph) as the pending activation of the next step and emit its message;
        ``batch`` is the :class:`trainers.roles.batching.ClientBatch` that computed ``h``, if any; ``replay``
        how to compute it again with its graph (a recomputed forward); ``x`` the inputs it was computed from (NoPeek's
        penalty needs them). The device's defence (:attr:`defence`) is applied here, to what leaves the device."""
        check_finite(h.detach(), "client activation", round_index, self.index)
        penalty = None
        if self.defence.active:
            if batch is not None or (self.defence.nopeek > 0 and x is None):
                raise ValueError("a defended activation is computed per device, with its inputs under NoPeek")
            h, penalty = self._defended(h, x, noise=True)
        self.step += 1
        self.pending = _Pending(round_index, self.step, h, batch, replay, penalty)
        return Activation(self.index, round_index, self.step, h.detach(), y)

    def _defended(self, h: torch.Tensor, x: torch.Tensor | None, noise: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What the device sends of ``h`` (clipped, noised when ``noise``) and NoPeek's penalty on it (with the
        graph where ``h`` has one)."""
        penalty = self.defence.penalty(x, h) if h.requires_grad and x is not None else None
        return self.defence.released(h, self.noise_rng if noise else None), penalty

    def _replayed(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A recomputed forward with its graph: the clipped activation (its noise is a constant of the graph) and
        the penalty."""
        h = self._forward_samples(idx)
        return self._defended(h, self._penalised_inputs(idx), noise=False) if self.defence.active else (h, None)

    def backward(self, msg: CutGradient) -> None:
        """Eq. (6): back-propagate the cut gradient and step w_{c,i}; ``msg.tensor is None`` drops
        the step. The tags must match the pending activation, the shape its shape. An activation
        computed in a batch with other devices is handed back to that batch, which back-propagates
        and steps all of them once the last has its reply."""
        pending = self.pending
        if msg.device != self.index or pending is None or (msg.round, msg.step) != (pending.round, pending.step):
            expected = "nothing" if pending is None else f"(device {self.index}, round {pending.round}, step {pending.step})"
            raise MessageMismatchError(f"gradient for (device {msg.device}, round {msg.round}, step {msg.step}) "
                                       f"delivered to device {self.index}, which expects {expected}")
        self.pending = None
        if msg.tensor is not None:
            if msg.tensor.shape != pending.activation.shape:
                raise MessageMismatchError(f"gradient shape {tuple(msg.tensor.shape)} ≠ activation shape "
                                           f"{tuple(pending.activation.shape)} (device {self.index}, round {msg.round})")
            check_finite(msg.tensor, "gradient message", msg.round, self.index)
        if pending.batch is not None:
            pending.batch.deliver(self, msg.tensor)
            return
        if msg.tensor is None:
            return
        activation, penalty = (pending.activation, pending.penalty) if pending.replay is None \
            else pending.replay.run(self._replayed)
        if activation.requires_grad:
            torch.autograd.backward([activation] + ([penalty] if penalty is not None else []),
                                    [msg.tensor] + ([torch.ones_like(penalty)] if penalty is not None else []))
        self.optimizer.step()

    # ---- model messages -----------------------------------------------------------------------------
    def upload(self, round_index: int, blocks: Iterable[int], weight: float, with_optimizer: bool = False) -> ModelUpload:
        """Send blocks (those below the cut among ``blocks``) to the fed server."""
        chosen = [j for j in blocks if j < self.cut]
        opt = self.optimizer if with_optimizer else None
        return ModelUpload(self.index, round_index, "device", {j: block_state(self.blocks[j], opt) for j in chosen}, weight)

    def download(self, msg: ModelDownload) -> None:
        """Load blocks; with ``msg.cut`` set, hold exactly blocks 0..cut−1 (re-partition) and
        rebuild the optimizer with the carried states."""
        if msg.device != self.index:
            raise MessageMismatchError(f"model for device {msg.device} delivered to device {self.index}")
        if msg.cut is not None:
            if self.pending is not None:
                raise MessageMismatchError(f"device {self.index} cannot re-partition with an unanswered activation")
            old = list(self.blocks)
            kept = [p for b in old[:msg.cut] for p in b.parameters()]
            carried = self.optimizer.param_states(kept)
            self.blocks = nn.ModuleList(old[j] if j < len(old) else shared_copy(self.template[j]) for j in range(msg.cut))
            self.optimizer = RoleOptimizer(self.optimizer_spec, self.blocks.parameters())
            self.optimizer.load_param_states(kept, carried)
            self.shared = (self.shared & set(range(msg.cut))) | set(range(len(old), msg.cut))
        for j, bs in msg.blocks.items():
            load_block(self.blocks[j], bs, self.optimizer, msg.fresh_optimizer, self.shared, j)

    # ---- checkpoint ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = {"cut": self.cut, "blocks": [b.state_dict() for b in self.blocks], "optimizer": self.optimizer.state_dict(),
                 "sampler": self.sampler.state(), "step": self.step}
        if self.noise_rng is not None:
            state["noise_rng"] = self.noise_rng.get_state()
        if self.optimizer.anchors is not None:
            state["anchor"] = [a.clone() for a in self.optimizer.anchors]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.blocks = nn.ModuleList(copy.deepcopy(self.template[j]) for j in range(int(state["cut"])))
        if not isinstance(state["blocks"], list) or len(state["blocks"]) != len(self.blocks):
            raise ValueError(f"device {self.index}'s blocks must be a list of its {len(self.blocks)} blocks' states")
        for j, (block, sd) in enumerate(zip(self.blocks, state["blocks"])):
            check_block_state(block, sd, f"device {self.index}'s block {j}")
            block.load_state_dict(sd)
        self.optimizer = RoleOptimizer(self.optimizer_spec, self.blocks.parameters())
        self.optimizer.load_state_dict(state["optimizer"])
        self.optimizer.load_anchors(state.get("anchor"), f"device {self.index}'s state")
        self.sampler.load_state(state["sampler"])
        self.step = int(state["step"])
        load_noise_state(self.noise_rng, state, f"device {self.index}")
        self.pending = None
        self.shared = set()


class EdgeServer:
    """The edge server's role: instances of the server-side blocks, one optimizer per owner, the model messages
    that load and send them, and the round's NaN/inf check. How arrivals are run through the instances — in passes
    within a budget of samples, concatenated or one device at a time — is the runtime's
    (:class:`trainers.roles.passes.EdgePasses`, which a strategy sees as its ``ServerPasses``).

    Args:
        template: the chain of L blocks.
        cuts: ℓ_i per device (the edge serves blocks ℓ_i..L−1 of device i).
        owner_of: (device, 0-based block, L_c) → owner (device index = per-device copy, None = shared).
        optimizer: the server optimizer spec.

    An instance's parameters change only when it runs (:meth:`instance`), its owner steps (:meth:`step`),
    or blocks are loaded into it (:meth:`download`, :meth:`load_state_dict`), so the round's NaN/inf check
    (:meth:`check_finite`) reads the instances one of these touched since the last check passed; under
    SplitFed V1 at 1,000 devices and ρ = 0.05 that is the round's participants' copies, not all 1,000. A
    strategy changes server weights through these methods, never by writing into an instance directly.
    """

    def __init__(self, template: nn.Sequential, cuts: Sequence[int], owner_of: Callable[[int, int, int], Owner],
                 optimizer: OptimizerSpec) -> None:
        self.template = template
        self.num_blocks = len(template)
        self.owner_of = owner_of
        self.optimizer_spec = optimizer
        self.cuts = cuts
        self.instances: dict[Key, nn.Module] = {k: shared_copy(template[k[1]]) for k in self.layout(self.cuts)}
        self.shared: set[Key] = set(self.instances)
        """Instances whose tensors are the template's or a download's, shared with the others (SFL-V1's
        server copies at the start and after an average); each takes its own copy when it next runs
        (:meth:`instance`)."""
        self._unchecked: set[Key] = set()
        """Instances run, stepped or loaded since the last :meth:`check_finite` passed (every one at first)."""
        self._build_optimizers()

    # ---- layout -------------------------------------------------------------------------------------
    @property
    def cuts(self) -> tuple[int, ...]:
        """ℓ_i per device."""
        return self._cuts

    @cuts.setter
    def cuts(self, cuts: Sequence[int]) -> None:
        self._cuts = tuple(int(c) for c in cuts)
        self._deepest = max(self._cuts, default=0)     # L_c of the owners' rule, asked for every instance a pass runs

    def key(self, device: int, block: int, deepest: int | None = None) -> Key:
        """The instance device ``device`` runs block ``block`` on; ``deepest``: L_c of the layout (default: the
        current cuts')."""
        return (self.owner_of(device, block, self._deepest if deepest is None else deepest), block)

    def layout(self, cuts: Sequence[int]) -> list[Key]:
        keys: dict[Key, None] = {}
        deepest = max(cuts, default=0)
        for d, c in enumerate(cuts):
            for j in range(c, self.num_blocks):
                keys[self.key(d, j, deepest)] = None
        return list(keys)

    def _build_optimizers(self, carried: dict[nn.Parameter, dict[str, Any]] | None = None) -> None:
        """One optimizer per owner over its instances' parameters (the layout's: called whenever it changes)."""
        by_owner: dict[Owner, list[nn.Parameter]] = {}
        self._keys_of: dict[Owner, list[Key]] = {}
        for key, module in sorted(self.instances.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
            by_owner.setdefault(key[0], []).extend(module.parameters())
            self._keys_of.setdefault(key[0], []).append(key)
        self._unchecked = set(self.instances)     # a new layout: every instance is read at the next check
        self.optimizers = {o: RoleOptimizer(self.optimizer_spec, ps) for o, ps in by_owner.items() if ps}
        for opt in self.optimizers.values():
            opt.load_param_states(opt.params, [(carried or {}).get(p, {}) for p in opt.params])

    def owners(self, devices: Iterable[int]) -> list[Owner]:
        """The owners of the server blocks of ``devices``."""
        owners: dict[Owner, None] = {}
        for d in devices:
            for j in range(self.cuts[d], self.num_blocks):
                owners[self.key(d, j)[0]] = None
        return list(owners)

    def parameters(self, device: int) -> list[nn.Parameter]:
        """The server-side parameters w_{s,i} that device ``device``'s activations flow through."""
        return [p for j in range(self.cuts[device], self.num_blocks) for p in self.instances[self.key(device, j)].parameters()]

    # ---- what a pass runs and what it changes ------------------------------------------------------
    def instance(self, key: Key) -> nn.Module:
        """The instance ``key``, about to run and train: its own copy of any tensors it shared."""
        module = self.instances[key]
        self._unchecked.add(key)
        if key in self.shared:
            own_state(module)
            self.shared.discard(key)
        return module

    def add_gradients(self, params: Sequence[nn.Parameter], grads: Sequence[torch.Tensor]) -> None:
        """Accumulate ``grads`` into ``params``' ``.grad`` (the server step's gradient)."""
        for p, g in zip(params, grads):
            p.grad = g.detach().clone() if p.grad is None else p.grad + g.detach()

    def step(self, owners: Iterable[Owner], scale: dict[Owner, float] | float = 1.0) -> None:
        """One optimizer step for each owner (gradients × ``scale`` first), then clear them."""
        for owner in dict.fromkeys(owners):
            opt = self.optimizers.get(owner)
            if opt is not None:
                opt.step(scale.get(owner, 1.0) if isinstance(scale, dict) else scale)
                self._unchecked.update(self._keys_of[owner])

    def zero_grad(self) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad()

    # ---- model messages -----------------------------------------------------------------------------
    def upload(self, device: int, round_index: int, blocks: Iterable[int], weight: float,
               with_optimizer: bool = False, shared: bool = False) -> ModelUpload:
        """Send device ``device``'s server blocks among ``blocks``: its per-device instances (and the
        shared ones too when ``shared``) to the fed server."""
        out = {}
        for j in blocks:
            if j < self.cuts[device] or j >= self.num_blocks:     # the device's (below its cut, or its head)
                continue
            key = self.key(device, j)
            if key[0] is None and not shared:
                continue
            opt = self.optimizers.get(key[0]) if with_optimizer else None
            out[j] = block_state(self.instances[key], opt)
        return ModelUpload(device, round_index, "edge", out, weight)

    def download(self, msgs: Sequence[ModelDownload], new_cuts: Sequence[int] | None = None) -> None:
        """Load blocks for devices; with ``new_cuts`` the layout is rebuilt first (re-partition):
        instances of the new layout that the messages do not fill keep their old object and state."""
        if new_cuts is not None:
            old_instances, carried = self.instances, {}
            for opt in self.optimizers.values():
                carried.update({p: s for p, s in zip(opt.params, opt.param_states(opt.params)) if s})
            self.cuts = new_cuts
            self.instances = {k: old_instances[k] if k in old_instances else shared_copy(self.template[k[1]])
                              for k in self.layout(self.cuts)}
            self.shared = (self.shared & set(self.instances)) | (set(self.instances) - set(old_instances))
            self._build_optimizers(carried)
        with torch.no_grad():
            for msg in msgs:
                for j, bs in msg.blocks.items():
                    key = self.key(msg.device, j)
                    self._unchecked.add(key)
                    if share_state(self.instances[key], bs.state):   # shared until the instance next runs
                        self.shared.add(key)
                    else:
                        self.shared.discard(key)
                    if bs.optimizer is not None and key[0] in self.optimizers:
                        self.optimizers[key[0]].load_param_states(self.instances[key].parameters(), bs.optimizer)

    # ---- the round's NaN/inf check ------------------------------------------------------------------
    def check_finite(self, round_index: int) -> None:
        """:func:`check_all_finite` of the instances that may have changed since the last check passed (class
        docstring), in layout order; a :class:`~trainers.roles.messages.NonFiniteError` names the first
        offending one's block and owner (its device, or ``shared server``)."""
        keys = [k for k in self.instances if k in self._unchecked]
        check_all_finite([(p, f"server model block {j + 1}", cast(int, owner) if owner is not None else "shared server")
                          for owner, j in keys for p in self.instances[(owner, j)].parameters()], round_index)
        self._unchecked.difference_update(keys)

    # ---- checkpoint ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        keys = list(self.instances)
        return {"cuts": list(self.cuts), "keys": keys, "instances": [self.instances[k].state_dict() for k in keys],
                "optimizers": {o: opt.state_dict() for o, opt in self.optimizers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cuts = state["cuts"]
        self.instances = {}
        self.shared = set()
        for key, sd in zip(state["keys"], state["instances"]):
            module = copy.deepcopy(self.template[key[1]])
            check_block_state(module, sd, f"the edge server's block {key[1]} of {key[0]}")
            module.load_state_dict(sd)
            self.instances[tuple(key)] = module  # type: ignore[index]
        if set(self.instances) != set(self.layout(self.cuts)):
            raise MessageMismatchError("checkpoint layout does not match the algorithm's server layout")
        self._build_optimizers()
        for owner, sd in state["optimizers"].items():
            self.optimizers[owner].load_state_dict(sd)


class FedServer:
    """The fed server: client-side model averaging (eq. 7; FedAvg weighted by |𝒟_i|) and the
    global client model (the last average of each block). Uploads are folded in one at a time
    (:meth:`add`, then :meth:`finish`), so an aggregation holds one running sum per block, not
    every upload. Where the devices are grouped (:class:`~trainers.roles.protocol.Groups`), each group's uploads
    are averaged apart into that group's global model."""

    def __init__(self) -> None:
        self.globals: dict[int, dict[int, dict[str, torch.Tensor]]] = {0: {}}
        """Group → block → state: each group's global model (group 0 is every device's where none is grouped)."""
        self.group_of: tuple[int, ...] = ()
        """Device i's group (empty: all in group 0)."""
        self._running: dict[tuple[int, int], RunningMean | RobustMean] = {}
        self._optimizers: dict[tuple[int, int], list] = {}
        self.rule: tuple[str, float] = ("mean", 0.0)
        """How uploads are combined (:data:`AGGREGATION_RULES`, and the trimmed share β), set by the edge server."""

    @property
    def global_blocks(self) -> dict[int, dict[str, torch.Tensor]]:
        """Group 0's global model (every device's where none is grouped)."""
        return self.globals.setdefault(0, {})

    def group(self, device: int) -> int:
        """Device ``device``'s group; 0 for one not grouped (and for the edge server's ``-1``)."""
        return self.group_of[device] if 0 <= device < len(self.group_of) else 0

    def set_groups(self, groups: Sequence[int]) -> None:
        """Group the devices (``groups[i]``: device i's) from the next upload on; ValueError for a negative or
        non-integer group, or while an average is running."""
        if self._running:
            raise ValueError("the fed server cannot regroup the devices in the middle of an average")
        if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in groups):
            raise ValueError(f"groups must be integers ≥ 0, got {list(groups)[:8]}")
        self.group_of = tuple(groups)

    def average(self, uploads: Iterable[ModelUpload], round_index: int) -> dict[tuple[int, int], BlockState]:
        """Block-wise weighted mean over the uploads that hold each block (:class:`RunningMean`);
        exact copy when all equal. Optimizer states (when uploaded) are averaged with equal weights."""
        for u in uploads:
            self.add(u)
        return self.finish(round_index)

    def add(self, upload: ModelUpload) -> None:
        """Fold one upload into the running averages of its blocks (the upload may be dropped afterwards)."""
        g = self.group(upload.device)
        for j, bs in upload.blocks.items():
            if (g, j) not in self._running:
                self._running[g, j] = RunningMean() if self.rule[0] == "mean" else RobustMean(*self.rule)
            self._running[g, j].add(bs.state, float(upload.weight))
            self._optimizers.setdefault((g, j), []).append(bs.optimizer)

    def finish(self, round_index: int) -> dict[tuple[int, int], BlockState]:
        """The averages, by (group, block), of every block added since the last :meth:`finish`; they become the
        groups' global models."""
        out = {}
        for (g, j), running in self._running.items():
            state = running.result()
            opts = self._optimizers[g, j]
            optimizer = None
            if all(o is not None for o in opts):
                optimizer = [mean_param_state(list(ps)) for ps in zip(*opts)]  # type: ignore[arg-type]
            out[g, j] = BlockState(state, optimizer)
            self.globals.setdefault(g, {})[j] = state
        self._running, self._optimizers = {}, {}
        return out

    def state_dict(self) -> dict[str, Any]:
        """Group 0's global blocks; where the devices are grouped, the groups and the other groups' blocks too."""
        state: dict[str, Any] = {"global_blocks": {j: dict(s) for j, s in self.global_blocks.items()}}
        if self.group_of:
            state["groups"] = list(self.group_of)
            state["group_blocks"] = {g: {j: dict(s) for j, s in blocks.items()}
                                     for g, blocks in self.globals.items() if g}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.globals = {0: {int(j): dict(s) for j, s in state.get("global_blocks", {}).items()}}
        for g, blocks in state.get("group_blocks", {}).items():
            self.globals[int(g)] = {int(j): dict(s) for j, s in blocks.items()}
        self.group_of = tuple(int(g) for g in state.get("groups", ()))


class RunningMean:
    """Σ_k w_k s_k / Σ_k w_k per entry of state dicts added one at a time: integer entries and
    entries bitwise equal in every state are the first state's, copied exactly; while all weights
    are equal the plain mean Σ s_k / n is summed (no rounding from the weights). Holds one
    accumulator per entry and a reference to the first state."""

    def __init__(self) -> None:
        self.first: dict[str, torch.Tensor] | None = None
        self.sums: dict[str, torch.Tensor] = {}
        self.same: dict[str, bool] = {}
        self.weight0 = 0.0
        self.total = 0.0
        self.count = 0
        self.equal_weights = True

    @torch.no_grad()
    def add(self, state: dict[str, torch.Tensor], weight: float) -> None:
        if self.first is None:
            self.first, self.weight0 = state, weight
            self.sums = {k: v.clone() for k, v in state.items() if v.is_floating_point()}
            self.same = {k: True for k in self.sums}
        else:
            if self.equal_weights and weight != self.weight0:   # from now on Σ w·s
                self.equal_weights = False
                for acc in self.sums.values():
                    acc.mul_(self.weight0)
            for k, acc in self.sums.items():
                t = state[k]
                if self.same[k] and not torch.equal(self.first[k], t):
                    self.same[k] = False
                if self.equal_weights:
                    acc.add_(t)
                else:
                    acc.add_(t, alpha=weight)
        self.total += weight
        self.count += 1

    @torch.no_grad()
    def result(self) -> dict[str, torch.Tensor]:
        assert self.first is not None, "no state was added"
        out = {}
        for k, v in self.first.items():
            if k not in self.sums or self.same[k]:
                out[k] = v.clone()
            elif self.equal_weights:
                out[k] = self.sums[k] / self.count
            else:
                out[k] = self.sums[k] / self.total
        return out


AGGREGATION_RULES = ("mean", "median", "trimmed-mean")
"""The fed server's rules: FedAvg's weighted mean (eq. 7), or the coordinate-wise median or β-trimmed mean of
Yin, Chen, Ramchandran and Bartlett, "Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates",
ICML 2018 (Definitions 1 and 2), which bound what a minority of lying uploads can move (unweighted there)."""


class RobustMean:
    """Yin et al. (ICML 2018) per entry over the states added: ``median`` — the coordinate-wise median (the mean of
    the two middle values for an even count, their Definition 1); ``trimmed-mean`` — the coordinate-wise mean after
    dropping the ⌊βn⌋ largest and ⌊βn⌋ smallest values (Definition 2, β = ``trim`` < 1/2). Weights are not used (the
    rules are unweighted). Integer entries are the first state's. Keeps every state until :meth:`result`."""

    def __init__(self, rule: str, trim: float = 0.0) -> None:
        if rule not in AGGREGATION_RULES[1:] or not 0.0 <= trim < 0.5:
            raise ValueError(f"a robust rule is median or trimmed-mean with 0 <= trim < 0.5, got {rule!r}, {trim}")
        self.rule, self.trim = rule, float(trim)
        self.states: list[dict[str, torch.Tensor]] = []

    def add(self, state: dict[str, torch.Tensor], weight: float) -> None:
        self.states.append(state)

    @torch.no_grad()
    def result(self) -> dict[str, torch.Tensor]:
        assert self.states, "no state was added"
        first, n = self.states[0], len(self.states)
        out = {}
        for k, v in first.items():
            if not v.is_floating_point():
                out[k] = v.clone()
                continue
            ordered = torch.stack([s[k] for s in self.states]).sort(dim=0).values
            if self.rule == "median":
                out[k] = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
            else:
                cut = int(self.trim * n)
                out[k] = ordered[cut:n - cut].mean(dim=0)
        return out


def robust_flops(rule: str, count: int, values: int) -> float:
    """FLOPs the fed server spends on ``rule`` over ``count`` uploads of ``values`` entries: a sort of each entry's
    ``count`` values, n·⌈log₂ n⌉ comparisons, plus the mean (n additions); 0 for the mean, whose cost eqs. (22)–(25)
    already leave out."""
    if rule == "mean" or count < 2:
        return 0.0
    return float(values) * count * (math.ceil(math.log2(count)) + 1)


def weighted_mean(states: Sequence[dict[str, torch.Tensor]], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """Σ_k w_k s_k / Σ_k w_k per entry (:class:`RunningMean`'s rule)."""
    running = RunningMean()
    for state, weight in zip(states, weights):
        running.add(state, float(weight))
    return running.result()
