"""How the edge server's blocks are run: :class:`EdgePasses`, the execution machinery between a strategy and the
:class:`~trainers.roles.core.EdgeServer` role (what a strategy sees as its ``ServerPasses``, trainers.api).

A strategy asks for passes by what they compute (eq. 3's forward, a mean loss's backward, each device's own server
gradient, cut gradients at the current weights); this module decides how they run within the runtime's memory: in
chunks of at most ``pass_samples`` samples whose gradients accumulate (exact for a mean loss, equal up to float
rounding), devices that meet at one instance concatenated into one batch where no layer couples the samples
(BatchNorm), and per-device passes that keep their cut gradients for a later reply while they are small
(:data:`KEEP_CUT_VALUES`). The server's weights change only through the role (its instances, steps and optimizers).
"""

from __future__ import annotations

from typing import Callable, Hashable, Iterable, Iterator, Sequence, TypeVar, cast

import torch
from torch import nn

from trainers.roles.core import EdgeServer, Key, has_batch_coupling, random_layer
from trainers.roles.messages import Activation, CutGradient, MessageMismatchError, check_finite

T = TypeVar("T")


KEEP_CUT_VALUES = 1 << 24
"""Per-device server passes (:meth:`EdgePasses.gradient_rows`) keep each device's cut gradient from the backward
that gives its server gradient while all of them take at most this many numbers (64 MiB in float32); past it
they are recomputed by one more pass when they are needed (a forward and an input backward more)."""



HeadLoss = Callable[[Activation, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""A U-shaped split's exchange with a device's head (the runtime's): the arrival and the server's output h_k for it →
(F_i, ∂F_i/∂h_k) as the device answers them (:mod:`trainers.roles.head`)."""


class ServerPass:
    """One forward of a set of arrivals through the edge server's blocks (eq. 3).

    ``inputs[d]`` is device d's received activation as a leaf that requires grad, ``logits[d]`` its
    output. :meth:`backward` back-propagates a scalar loss into the server parameters and returns
    the cut gradients; :meth:`cut_gradients` returns cut gradients only, leaving the server's
    parameter gradients untouched (a pass at frozen server weights). Under a U-shaped split (``head``) the
    output is the head's input h_k and the loss is the device's (:meth:`loss`)."""

    def __init__(self, arrivals: Sequence[Activation], inputs: dict[int, torch.Tensor],
                 logits: dict[int, torch.Tensor], head: HeadLoss | None = None) -> None:
        self.arrivals = list(arrivals)
        self.by_device = {a.device: a for a in self.arrivals}
        self.inputs = inputs
        self.logits = logits
        self.labels = {a.device: a.labels for a in arrivals}
        self.head = head

    def loss(self, device: int, loss_of: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """F_i of ``device`` in this pass: ``loss_of(i, logits_i, labels_i)``, or under a U-shaped split the device's
        own mean cross-entropy, which its head computes: F_i + ⟨h_k − sg(h_k), ∂F_i/∂h_k⟩ (sg: no gradient), whose
        value is F_i and whose gradient with respect to anything h_k depends on (the server's weights, a_i) is
        the chain rule's through the head."""
        if self.head is None:
            return loss_of(device, self.logits[device], self.labels[device])
        h = self.logits[device]
        value, grad = self.head(self.by_device[device], h)
        return value.to(h.dtype) + ((h - h.detach()) * grad.to(h.dtype)).sum()

    @property
    def devices(self) -> list[int]:
        return [a.device for a in self.arrivals]

    def backward(self, loss: torch.Tensor) -> dict[int, torch.Tensor]:
        """Accumulate ∂loss/∂w into the server parameters; return ∂loss/∂a_d for every device."""
        loss.backward()
        return {d: (x.grad if x.grad is not None else torch.zeros_like(x)) for d, x in self.inputs.items()}

    def cut_gradients(self, loss: torch.Tensor, devices: Sequence[int] | None = None,
                      retain_graph: bool = False) -> dict[int, torch.Tensor]:
        """∂loss/∂a_d only (no parameter gradient is accumulated); ``retain_graph`` keeps the
        forward for a later :meth:`backward` of another loss at the same (pre-update) weights."""
        devices = list(self.inputs) if devices is None else list(devices)
        grads = torch.autograd.grad(loss, [self.inputs[d] for d in devices], allow_unused=True, retain_graph=retain_graph)
        return {d: (g if g is not None else torch.zeros_like(self.inputs[d])) for d, g in zip(devices, grads)}



class EdgePasses:
    """The passes a strategy composes over an :class:`~trainers.roles.core.EdgeServer` (module docstring).

    Args:
        server: the edge server role whose instances the passes run and whose owners step.
        concatenate: run devices that meet at a shared instance as one batch (exact for models
            without batch-coupled layers; switched off when BatchNorm is present).
        head: a U-shaped split's exchange with the devices' heads (:class:`ServerPass` computes their losses by it).
        pass_samples: the most samples one server pass holds (its autograd graph grows with them):
            a barrier over more arrivals is served in :meth:`chunks` (exact for a mean loss, the
            gradients accumulating; equal up to float rounding). ``None``: one pass.
    """

    def __init__(self, server: EdgeServer, concatenate: bool = True, pass_samples: int | None = None,
                 head: HeadLoss | None = None) -> None:
        self.server = server
        self.batch_independent = not has_batch_coupling(server.template)
        """A sample's server outputs never depend on the other samples of its pass (no BatchNorm), so a loss summed
        over samples has one gradient however the samples are split into passes."""
        self.concatenate = concatenate and self.batch_independent
        self.pass_samples = pass_samples
        self.head = head
        """A U-shaped split's exchange with the devices' heads (the runtime's; None: the loss is the server's)."""
        self._kept_cut: dict[int, torch.Tensor] = {}
        """∂L_i/∂a_i kept from :meth:`gradient_rows`'s passes where a second pass would not be harmless, for
        :meth:`cut_gradients`."""

    # ---- the role's side a strategy also sees (ServerPasses) ----------------------------------------
    def parameters(self, device: int) -> list[nn.Parameter]:
        """The server parameters w_{s,i} device ``device``'s activations flow through."""
        return self.server.parameters(device)

    def owners(self, devices: Iterable[int]) -> list[Hashable]:
        """The owners (optimizers) of the server blocks of ``devices``."""
        return self.server.owners(devices)

    def step(self, owners: Iterable[Hashable], scale: dict[Hashable, float] | float = 1.0) -> None:
        """One optimizer step for each owner (:meth:`EdgeServer.step`)."""
        self.server.step(owners, scale)

    def add_gradients(self, params: Sequence[nn.Parameter], grads: Sequence[torch.Tensor]) -> None:
        """Accumulate ``grads`` into ``params``' ``.grad`` (the server step's gradient)."""
        self.server.add_gradients(params, grads)

    # ---- passes -------------------------------------------------------------------------------------
    def chunks(self, arrivals: Sequence[Activation]) -> list[list[Activation]]:
        """``arrivals`` in order, cut into consecutive chunks of at most :attr:`pass_samples` samples
        (a larger single arrival is a chunk of its own); one chunk when there is no limit. A model
        with batch-coupled layers (BatchNorm) is never chunked: its statistics span the pass."""
        return self.chunked(arrivals, lambda a: int(a.tensor.shape[0]))

    def in_passes(self, arrivals: Sequence[Activation],
                  serve: Callable[[Sequence[Activation]], list[CutGradient]]) -> list[CutGradient]:
        """``serve`` (separable over the devices) on each of :meth:`chunks` in turn; every chunk's replies."""
        return [reply for chunk in self.chunks(arrivals) for reply in serve(chunk)]

    def chunked(self, items: Sequence[T], samples: Callable[[T], int]) -> list[list[T]]:
        """:meth:`chunks` of anything that will carry ``samples(item)`` samples (an arrival, or a
        device that is yet to forward its mini-batch)."""
        if self.pass_samples is None or not self.concatenate:
            return [list(items)] if items else []
        out: list[list[T]] = []
        total = 0
        for item in items:
            n = samples(item)
            if not out or total + n > self.pass_samples:
                out.append([])
                total = 0
            out[-1].append(item)
            total += n
        return out

    def spans(self, samples: int) -> list[slice]:
        """Rows 0..``samples``−1 of a server-internal batch (pooled or generated features) in
        consecutive slices of at most :attr:`pass_samples` rows; one slice when there is no limit
        or the model has batch-coupled layers (as :meth:`chunks`)."""
        if self.pass_samples is None or not self.concatenate or samples <= self.pass_samples:
            return [slice(0, samples)]
        return [slice(start, min(start + self.pass_samples, samples)) for start in range(0, samples, self.pass_samples)]

    def run(self, arrivals: Sequence[Activation], concatenate: bool = True) -> ServerPass:
        """Eq. (3): forward every arrival through its server blocks. Devices whose streams meet at
        one instance are concatenated into one batch when both ``concatenate`` and the server allow."""
        inputs = {}
        for a in arrivals:
            if a.device in inputs:
                raise MessageMismatchError(f"two activations from device {a.device} in one server pass (round {a.round})")
            check_finite(a.tensor, "activation message", a.round, a.device)
            inputs[a.device] = a.tensor.detach().requires_grad_(True)
        return ServerPass(arrivals, inputs, self._forward(inputs, concatenate and self.concatenate), self.head)

    def _forward(self, inputs: dict[int, torch.Tensor], concatenate: bool) -> dict[int, torch.Tensor]:
        streams: list[tuple[list[int], torch.Tensor, list[int]]] = []
        if not inputs:
            return {}
        start = min(self.server.cuts[d] for d in inputs)
        for j in range(start, self.server.num_blocks):
            for d, a in inputs.items():
                if self.server.cuts[d] == j:
                    streams.append(([d], a, [a.shape[0]]))
            buckets: dict[Key, list[tuple[list[int], torch.Tensor, list[int]]]] = {}
            for devices, tensor, sizes in streams:
                keys = {self.server.key(d, j) for d in devices}
                if len(keys) == 1:
                    buckets.setdefault(keys.pop(), []).append((devices, tensor, sizes))
                else:
                    for d, piece, n in zip(devices, tensor.split(sizes), sizes):
                        buckets.setdefault(self.server.key(d, j), []).append(([d], piece, [n]))
            streams = []
            for key, group in buckets.items():
                module = self.server.instance(key)
                if concatenate and len(group) > 1:
                    devices = [d for g in group for d in g[0]]
                    sizes = [n for g in group for n in g[2]]
                    streams.append((devices, module(torch.cat([g[1] for g in group])), sizes))
                else:
                    streams.extend((g[0], module(g[1]), g[2]) for g in group)
        outputs = {d: a for d, a in inputs.items() if self.server.cuts[d] == self.server.num_blocks}
        for devices, tensor, sizes in streams:
            outputs.update(zip(devices, tensor.split(sizes)))
        return outputs

    def run_features(self, features: torch.Tensor, device: int) -> torch.Tensor:
        """Forward a tensor of cut-layer features (pooled, resampled or generated) through the
        server blocks device ``device`` would use (no message tags: server-internal data)."""
        h = features
        for j in range(self.server.cuts[device], self.server.num_blocks):
            h = self.server.instance(self.server.key(device, j))(h)
        return h

    def backward_mean_loss(self, features: torch.Tensor, targets: torch.Tensor, device: int,
                           count: int | None = None) -> None:
        """Back-propagate the mean cross-entropy of ``features`` (server-internal cut-layer rows) through the server
        blocks device ``device`` uses, against ``targets``: one graph per :meth:`spans` slice, each slice's mean
        loss weighted by its share of the rows, so that the accumulated gradients are those of the whole mean and
        the graph held at once stays within the pass budget. ``count``: the mean is over that many rows, of which
        ``features`` are a part (the rest added by the caller; default: ``features``' own rows)."""
        rows = features.shape[0]
        total = rows if count is None else count
        for part in self.spans(rows):
            share = (part.stop - part.start) / total
            loss = nn.functional.cross_entropy(self.run_features(features[part], device), targets[part])
            (loss * share if share != 1.0 else loss).backward()

    def arrival_gradients(self, arrivals: Sequence[Activation],
                          cut_loss: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
                          server_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                          ) -> tuple[dict[int, torch.Tensor], list[torch.Tensor]]:
        """Forwards of ``arrivals`` (devices that share their server blocks) at the current server weights, in
        :meth:`chunks`, giving two losses: each device's ``cut_loss(i, logits_i, labels_i)``, whose cut gradient
        ∂/∂a_i is returned by device, and ``server_loss(logits, labels)`` of every chunk's samples, a sum over
        samples, whose gradients ∂/∂w_s are summed over the chunks (one tensor per parameter of
        :meth:`parameters`). No parameter ``.grad`` is touched. Where samples interact in a pass (BatchNorm) call
        it with one arrival at a time: :meth:`chunks` never cuts such a pass."""
        if len(self.owners(a.device for a in arrivals)) > 1:
            raise ValueError("arrival_gradients sums server gradients over arrivals that share their server blocks")
        params = self.parameters(arrivals[0].device) if arrivals else []
        cut: dict[int, torch.Tensor] = {}
        summed: list[torch.Tensor] | None = None
        for _, _, logits, labels in self._pooled_chunks(arrivals, cut_loss, cut):
            grads = torch.autograd.grad(server_loss(logits, labels), params, allow_unused=True) if params else ()
            filled = [g if g is not None else torch.zeros_like(q) for g, q in zip(grads, params)]
            summed = filled if summed is None else [total.add_(g) for total, g in zip(summed, filled)]
        return cut, summed if summed is not None else [torch.zeros_like(q) for q in params]

    def _pooled_chunks(self, arrivals: Sequence[Activation],
                       device_loss: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
                       cut: dict[int, torch.Tensor]
                       ) -> Iterator[tuple[ServerPass, dict[int, torch.Tensor], torch.Tensor, torch.Tensor]]:
        """For each of :meth:`chunks` in turn, one forward at the current server weights: each device's own loss
        ``device_loss(i, logits_i, labels_i)`` L_i, whose ∂L_i/∂a_i go into ``cut`` (no parameter gradient, the
        graph kept), then ``(pass, L_i by device, the chunk's logits, its labels)`` for a pooled loss over them."""
        for chunk in self.chunks(arrivals):
            p = self.run(chunk)
            own = {d: device_loss(d, p.logits[d], p.labels[d]) for d in p.devices}
            cut.update(p.cut_gradients(cast(torch.Tensor, sum(own.values())), retain_graph=True))
            yield p, own, torch.cat([p.logits[d] for d in p.devices]), torch.cat([p.labels[d] for d in p.devices])

    def pooled_pass(self, arrivals: Sequence[Activation],
                    device_loss: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
                    pooled_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                    ) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """One forward of the arrivals at the current server weights giving two losses: each device's own
        ``device_loss(i, logits_i, labels_i)`` L_i, whose ∂L_i/∂a_i are returned (no parameter gradient), and
        ``pooled_loss(logits, labels)``, a mean over the pooled samples, back-propagated into the server
        parameters (not stepped). Returns (cut gradients, L_i) by device. Over the pass budget it runs in
        chunks of arrivals (:meth:`chunks`), every chunk at the same weights and its pooled mean weighted by its
        share of the samples, so that the accumulated gradient is the whole mean's (equal up to float
        rounding)."""
        total = sum(a.batch_size for a in arrivals)
        cut: dict[int, torch.Tensor] = {}
        losses: dict[int, torch.Tensor] = {}
        for p, own, logits, labels in self._pooled_chunks(arrivals, device_loss, cut):
            losses.update(own)
            share = logits.shape[0] / total
            pooled = pooled_loss(logits, labels)
            p.backward(pooled * share if share != 1.0 else pooled)
        return cut, losses

    def _device_losses(self, arrivals: Sequence[Activation],
                       loss_of: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]
                       ) -> Iterable[tuple[Activation, torch.Tensor, torch.Tensor, list[nn.Parameter]]]:
        """For each arrival in turn, a forward of that device alone: ``(arrival, its input leaf a_i,
        L_i, w_{s,i})`` (the graph of L_i lives until the caller moves on)."""
        for a in arrivals:
            p = self.run([a], concatenate=False)
            yield a, p.inputs[a.device], p.loss(a.device, loss_of), self.parameters(a.device)

    def per_device_gradients(self, arrivals: Sequence[Activation],
                             loss_of: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
                             create_graph: bool = False
                             ) -> dict[int, tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Each device's server gradient g_i = ∂L_i/∂w_{s,i} and cut gradient ∂L_i/∂a_i from a
        separate forward per device (GAPSL, docs/algorithms.md GAPSL A.3.4). Returns
        ``{device: (g_i per parameter, ∂L_i/∂a_i, L_i, the input leaf a_i)}``; no parameter
        ``.grad`` is touched. ``create_graph`` keeps the g_i differentiable (double backprop).
        Holds every device's g_i, cut gradient (and with ``create_graph`` its graph) at once: for
        the server gradients alone, :meth:`gradient_rows` holds one S × P matrix."""
        out = {}
        for a, x, loss, params in self._device_losses(arrivals, loss_of):
            grads = torch.autograd.grad(loss, params + [x], create_graph=create_graph, allow_unused=True)
            g = [gi if gi is not None else torch.zeros_like(pi) for gi, pi in zip(grads[:-1], params)]
            out[a.device] = (g, grads[-1] if grads[-1] is not None else torch.zeros_like(x), loss, x)
        return out

    def replayable(self, device: int) -> bool:
        """True if a second forward of device ``device``'s activations through its server blocks at
        the same weights gives the same values and changes nothing: no buffers (BatchNorm statistics,
        updated by every forward) and no random layers (Dropout masks)."""
        blocks = [self.server.instances[self.server.key(device, j)] for j in range(self.server.cuts[device], self.server.num_blocks)]
        return all(next(b.buffers(), None) is None and random_layer(b) is None for b in blocks)

    def gradient_rows(self, arrivals: Sequence[Activation],
                      loss_of: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor], answers_all: bool = False
                      ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The devices' server gradients g_i = ∂L_i/∂w_s as the rows of one S × P matrix (row i:
        ``arrivals[i]``, the parameters flattened in :meth:`parameters` order) and each L_i, from a separate
        forward per device (GAPSL A.3.4). Each g_i is written into its row as it is computed, so the S devices'
        gradients take S·P numbers. Where a second pass over these devices would not be harmless
        (:meth:`replayable`: BatchNorm statistics, Dropout masks), each ∂L_i/∂a_i is kept from this pass for
        :meth:`cut_gradients`; otherwise nothing outlives its device's pass. Every arrival must pass through the
        same server parameters (one shared w_s at one cut); no parameter ``.grad`` is touched. The cut gradients
        come from the same backward (no second pass) whenever they take at most :data:`KEEP_CUT_VALUES` numbers, or
        whatever they take when ``answers_all`` says that every arrival will be answered with its cut gradient
        (the replies then hold them all at once anyway)."""
        self._kept_cut = {}
        if not arrivals:
            return torch.zeros(0, 0), []
        keep = answers_all or not self.replayable(arrivals[0].device) \
            or sum(a.tensor.numel() for a in arrivals) <= KEEP_CUT_VALUES
        params = self.parameters(arrivals[0].device)
        like = params[0] if params else arrivals[0].tensor     # no server block (cut L): P = 0
        rows = torch.zeros(len(arrivals), sum(p.numel() for p in params), dtype=like.dtype, device=like.device)
        losses = []
        for i, (a, x, loss, own) in enumerate(self._device_losses(arrivals, loss_of)):
            if [id(p) for p in own] != [id(p) for p in params]:
                raise ValueError(f"device {a.device} does not pass through device {arrivals[0].device}'s server "
                                 "parameters: gradient rows need one shared w_s at one cut")
            inputs = params + ([x] if keep else [])
            grads = torch.autograd.grad(loss, inputs, allow_unused=True) if inputs else ()   # cut L: P = 0
            start = 0
            for p, g in zip(params, grads):
                if g is not None:
                    rows[i, start:start + p.numel()] = g.reshape(-1)
                start += p.numel()
            if keep:
                self._kept_cut[a.device] = grads[-1] if grads[-1] is not None else torch.zeros_like(x)
            losses.append(loss.detach())
        return rows, losses

    def cut_gradients(self, arrivals: Sequence[Activation],
                      loss_of: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]) -> dict[int, torch.Tensor]:
        """∂L_i/∂a_i of each arrival at the current server weights (before the step), L_i = ``loss_of(i, logits,
        labels)``: the ones :meth:`gradient_rows` kept from its passes (for the same arrivals and loss), else from
        one more pass over them within the pass budget (each L_i depends on a_i alone, so one pass over several
        devices gives each its own). The kept ones are released."""
        kept, self._kept_cut = self._kept_cut, {}
        if kept:
            return {a.device: kept[a.device] for a in arrivals}
        cut: dict[int, torch.Tensor] = {}
        for chunk in self.chunks(arrivals):
            p = self.run(chunk)
            cut.update(p.cut_gradients(cast(torch.Tensor, sum(p.loss(d, loss_of) for d in p.devices))))
        return cut

