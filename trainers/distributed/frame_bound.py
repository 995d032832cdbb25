"""The largest frame a run's ranks send (bytes): what the broker's packet limit and queues are derived from
(:class:`trainers.distributed.broker.BrokerLimits`; docs/mqtt.md "What the broker bounds").

A frame carries one message of trainers/roles/messages.py or trainers/distributed/control.py. The large ones:

* a model message (ModelUpload, ModelDownload, a checkpoint's blocks): one device's blocks, at most the whole
  model's parameters and buffers, and with them the optimizer's state of each parameter (at most
  :data:`OPTIMIZER_SLOTS` tensors of the parameter's size: Adam's two moments);
* a Setup: the chain's initial weights and the positions of the samples of every device the rank hosts
  (int64, at most the training set's);
* an Activation or a CutGradient: a batch of cut-layer activations (rows at most the batch size) and its labels,
  at most the largest output of any layer of the model; so are a U-shaped split's HeadForward and HeadGradient (the
  head's input features and their gradient, and a scalar loss).

The bound is the largest of these, times :data:`SAFETY` (headers, a batch larger than asked that the edge
server then refuses by its check, tensors the estimate misses), plus :data:`HEADER_BYTES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from trainers.config.train_config import TrainConfig

OPTIMIZER_SLOTS = 2
"""Optimizer tensors per parameter a model message may carry (Adam's first and second moments; SGD's momentum is one)."""
SAFETY = 2
"""The factor between the largest message estimated and the bound."""
HEADER_BYTES = 1 << 20
"""Bytes allowed for a frame's JSON header, its tag and the MQTT topic (1 MiB)."""


@dataclass(frozen=True)
class FrameBound:
    """The parts of the estimate (bytes) and the bound they give (:data:`SAFETY` × the largest + :data:`HEADER_BYTES`)."""

    model_message: int
    setup: int
    activation: int

    @property
    def largest(self) -> int:
        return SAFETY * max(self.model_message, self.setup, self.activation) + HEADER_BYTES


def frame_bound(model_bytes: int, parameter_bytes: int, largest_output_bytes: int, batch_size: int,
                num_train: int) -> FrameBound:
    """The bound from a model's sizes: all its parameters and buffers (``model_bytes``), its parameters alone
    (``parameter_bytes``), the largest output of one of its layers for one sample (``largest_output_bytes``), the
    batch size and the training set's size (module docstring)."""
    return FrameBound(model_message=model_bytes + OPTIMIZER_SLOTS * parameter_bytes,
                      setup=model_bytes + 8 * num_train,
                      activation=batch_size * (largest_output_bytes + 8))


def largest_frame(config: "TrainConfig") -> FrameBound:
    """:func:`frame_bound` for a run's configuration: its model built for its data set's input shape (from
    ``--device-data``'s manifest where given, else the named data set), one sample through it to find the
    largest layer output; where its algorithm moves to other models (FedConcat's second stage), the largest of
    each size over them."""
    import torch

    from profilers import build_chain
    from trainers.inputs.datasets import load_dataset
    from trainers.inputs.device_data import read_manifest
    from trainers.inputs.models import build_model
    from trainers.strategies import later_models, make_strategy

    data = config.data
    if data.device_data is not None:
        manifest = read_manifest(data.device_data)
        input_shape, num_classes = tuple(manifest.input_shape), int(manifest.num_classes)
        num_train = manifest.total
    else:
        dataset = load_dataset(data.dataset, data.data_root, data.download)
        input_shape, num_classes = tuple(int(s) for s in dataset.x_train.shape[1:]), int(dataset.num_classes)
        num_train = int(dataset.x_train.shape[0])
    model = build_model(config.model.name, input_shape, num_classes, config.model.width)
    strategy = make_strategy(config.algorithm, config.extra)
    later = later_models(strategy, build_chain(model, torch.zeros(2, *input_shape)).blocks) if strategy.stage_specs() else []
    sizes = [_model_sizes(m, input_shape) for m in [model, *later]]
    total, parameters, output = (max(s[k] for s in sizes) for k in range(3))
    return frame_bound(total, parameters, output, data.batch_size, num_train)


def _model_sizes(model: "torch.nn.Module", input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(parameters and buffers, parameters, the largest output of one of its layers for one sample) of ``model``, in
    bytes: one sample of zeros through it."""
    import torch

    outputs: list[int] = []
    hooks = [module.register_forward_hook(lambda _m, _i, out: outputs.append(_bytes_per_sample(out)))
             for module in model.modules()]
    with torch.no_grad():
        model.eval()(torch.zeros(1, *input_shape))
    for hook in hooks:
        hook.remove()
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return parameters + buffers, parameters, max(outputs, default=0)


def _bytes_per_sample(out: object) -> int:
    """Bytes of one sample of a layer's output (a tensor, or the largest of a tuple's)."""
    import torch

    if torch.is_tensor(out):
        return int(out[0].numel() * out.element_size()) if out.dim() else int(out.element_size())
    if isinstance(out, (tuple, list)):
        return max((_bytes_per_sample(o) for o in out), default=0)
    return 0
