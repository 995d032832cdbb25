"""`TrainConfig`: the ONE configuration object of a training run.

Every hyperparameter of a run flows from here: the optimizer is built from ``lr``, ``momentum``,
``weight_decay`` and the per-role ``client_lr``/``server_lr`` (see :meth:`TrainConfig.optimizer_spec`; each
algorithm's defaults in :data:`ALGORITHM_DEFAULTS`), the data loader from ``batch_size``
and the partition options, the clock from the system options. Unknown names (algorithm, dataset,
model, partition) raise :class:`adaptplan.errors.InputError` listing the valid names.

This module does not import torch (the CLI parser reads its name lists): dataset names come from
:func:`trainers.datasets.dataset_names`, and a model name is checked by
:func:`trainers.models.check_model` only when a config is validated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from adaptplan.errors import InputError
from adaptplan.fileio import finite_number, int_in_range, number_in_range, positive_int, positive_number
from adaptplan.limits import MAX_BATCH_SIZE, MAX_CUT_POINTS, MAX_DEVICES, MAX_NOISE_CV, MAX_ROUNDS, MAX_SEED, MAX_STEPS, MAX_THREADS
from trainers.algorithms import (  # noqa: F401  (the registry's tables, re-exported for the configuration's readers)
    ALGORITHM_DEFAULTS,
    ALGORITHM_OPTIONS,
    ALGORITHMS,
    OPTION_BY_NAME,
    AlgorithmOption,
    TrainingDefaults,
    algorithm_options,
    check_choice,
)
from trainers.datasets import dataset_names
from trainers.optimizer_spec import OPTIMIZERS, OptimizerSpec

MAX_LR = 1e6               # step size γ; a diverging run stops with a message, this only keeps γ sane
MAX_WEIGHT_DECAY = 1.0     # L2 coefficient
MAX_ALPHA = 1e6            # Dirichlet concentration (large = iid)
MAX_SCALE = 1e6            # --flops-scale / --bandwidth-scale: a million times the generator's ranges
MAX_MODEL_WIDTH = 4096     # channels of the built-ins' first layer
# the upper limit of every integer option (lower limit 1), with its unit
_INT_LIMITS = {"devices": (MAX_DEVICES, "devices"), "rounds": (MAX_STEPS, "rounds"),
               "batch_size": (MAX_BATCH_SIZE, "samples"), "eval_every": (MAX_STEPS, "rounds"),
               "eval_batch_size": (MAX_BATCH_SIZE, "samples"), "model_width": (MAX_MODEL_WIDTH, "channels"),
               "interval": (MAX_ROUNDS, "rounds"), "replan_every": (MAX_STEPS, "rounds"),
               "checkpoint_every": (MAX_STEPS, "rounds"), "max_test_samples": (MAX_STEPS, "samples"),
               "threads": (MAX_THREADS, "threads")}
_OPTIONAL_INTS = ("interval", "replan_every", "checkpoint_every", "max_test_samples", "threads")

DATASETS = tuple(dataset_names())
# built-ins; any torchvision name or package.module:factory is valid too
MODELS = ("cnn", "mlp", "vgg16-cifar", "resnet18-cifar", "resnet34-cifar", "resnet50-cifar")
#: How ``package.module:factory`` is found (profilers.models._factory), for the --model/MODEL help of
#: `adaptplan train` and `adaptplan profile`: the working directory is appended to sys.path unless it
#: (or "") is already there, as it is not for the installed `adaptplan` script.
OWN_MODEL_HELP = ("package.module:factory, your own function returning an nn.Module (called with num_classes= "
                  "when it takes it), imported with the working directory on the import path (appended, after "
                  "PYTHONPATH and the installed packages): run from the folder that holds the module, or put "
                  "that folder on PYTHONPATH")
PARTITIONS = ("iid", "shards", "dirichlet", "dirichlet-equal")
TRANSPORTS = ("gloo", "mqtt")
"""What carries a distributed run's frames: torch.distributed's gloo, or an MQTT broker."""
DEVICES = ("auto", "cpu", "cuda")          # auto = cuda when torch sees a GPU, else cpu (trainers.devices)
CLIENT_BATCHING = ("auto", "on", "off")    # auto = batched on CUDA, per device on a CPU (trainers.batching)
CLIENT_RECOMPUTE = ("auto", "on", "off")   # auto = when more than RECOMPUTE_SAMPLES samples wait at once (trainers.engine)
RECOMPUTE_SAMPLES = 1024
"""``client_recompute = "auto"``: a group of devices drawing more samples than this in all recomputes its
client forwards at backward time (their graphs would otherwise all wait for the edge server at once). A
barrier served as its devices forward (the default serve) waits one server chunk at a time, within
``server_pass_samples``: it never recomputes by default."""
SERVER_PASS_SAMPLES = 1024
"""Most samples per edge-server pass (``server_pass_samples = "auto"``) on a GPU: a barrier round over more
is served in chunks. 1024 samples of the CIFAR CNN at cut 1 hold ≈ 0.25 GiB of server graph; the default
population (20 devices × 16 samples) is one pass."""
CPU_PASS_SAMPLES = 128
"""Most samples per edge-server pass (``server_pass_samples = "auto"``) on a CPU, where passes that fit the
caches are faster per sample: measured (CIFAR CNN cut 1, 200 devices × 16, 1 thread, AdaptSFL / PSL,
2026-11-26) 0.69 / 0.70 × centralized batch-16 throughput with 1,024-sample passes, 1.01 / 1.06 × with 128,
1.06 / 1.04 × with 64, and 644 → 139 MiB peak (docs/architecture.md "Memory")."""


def pass_samples(value: int | str | None, device_type: str) -> int | None:
    """The most samples per edge-server pass the engine uses for ``server_pass_samples = value``:
    ``"auto"`` is :data:`CPU_PASS_SAMPLES` on a CPU and :data:`SERVER_PASS_SAMPLES` elsewhere; an integer
    as given; None = no limit (one pass)."""
    if value == "auto":
        return CPU_PASS_SAMPLES if device_type == "cpu" else SERVER_PASS_SAMPLES
    return None if value is None else int(value)


EVAL_BATCH_SIZE = 256
"""Samples per evaluation pass (``TrainConfig.eval_batch_size``, the engine's evaluation): on the CPU a pass of
1,000 ran 1.7–2× slower than 256 (its activations leave the cache); the accuracy counts do not depend on it."""

LOCAL_TEST_FRACTION = 0.1
"""Default share of each device's samples held out for its local test split (CycleSL §4.1: 90 %–10 %)."""
MAX_LOCAL_TEST_FRACTION = 0.5
SAVED_BEFORE = {"local_test_fraction": 0.0}
"""Options a configuration saved before they existed ran with: no local test split."""

POLICIES = ("adaptsfl", "rma+ms", "ma+rms", "rma+rms", "dama+rms", "rma+ams", "sfl", "psl", "fixed-cut")
REDRAWING_POLICIES = ("rma+ms", "ma+rms", "rma+rms", "dama+rms", "rma+ams")   # re-drawn at every aggregation


def as_saved_run_trained(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A configuration saved before some options existed, with them as that run trained: both roles at its
    ``lr`` and its ``optimizer`` (before the per-role options), no local test split (:data:`SAVED_BEFORE`);
    options the configuration holds are kept."""
    return {**{k: saved.get("lr") for k in ("client_lr", "server_lr")},
            **{k: saved.get("optimizer") for k in ("client_optimizer", "server_optimizer")}, **SAVED_BEFORE, **saved}


@dataclass
class TrainConfig:
    """All options of one split-training run.

    Units: ``lr`` γ (dimensionless step size), ``batch_size`` b in samples per device per round,
    ``rounds`` R in rounds (one round = every device processes one mini-batch, docs/model.md §2.1),
    ``interval`` I in rounds (client-side MA period, eq. 7), ``replan_every`` Q in rounds
    (Algorithm 1; a multiple of I is expected, re-planning happens only at aggregation rounds),
    ``eval_every`` and ``checkpoint_every`` in rounds, ``target_accuracy`` a fraction in [0, 1].

    ``model``: a built-in (:data:`MODELS`), a torchvision classification model name (random
    weights) or ``package.module:factory``; ``model_width`` (channels of the first conv layer)
    applies to the built-ins ``cnn`` and ``mlp`` only. ``dataset``: one of :data:`DATASETS`.

    ``cuts``: one 1-based cut index ℓ_i per device (device i runs chain blocks 1..ℓ_i); a single
    value is broadcast to all devices. ``None`` → the plan (``plan_path``), else the built-in
    planner, else the documented default (every device at cut ⌈L/2⌉, I = 1).

    ``local_test_fraction``: the share of each device's samples held out for the local evaluation protocol
    (CycleSL §4.1's sample-wise split; :func:`trainers.partition.local_test_split`), never trained on; 0 = none.

    ``device``: where the models and data live (:data:`DEVICES`; ``auto`` = CUDA when available);
    ``client_batching``: devices sharing a cut run their client blocks as one call
    (:data:`CLIENT_BATCHING`; ``auto`` = on CUDA only). Both change speed, not the mathematics, so a
    resumed run may change them (docs/architecture.md "Devices and batching").
    """

    algorithm: str = "adaptsfl"
    dataset: str = "cifar10-subset"
    model: str = "cnn"
    devices: int = 20
    partition: str = "iid"
    dirichlet_alpha: float = 0.5
    rounds: int = 200
    batch_size: int = 16
    lr: float | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    optimizer: str | None = None
    clip_norm: float | None = None
    interval: int | None = None
    cuts: tuple[int, ...] | None = None
    plan_path: str | None = None
    policy: str | None = None
    replan_every: int | None = None
    seed: int = 0
    eval_every: int = 10
    eval_batch_size: int = EVAL_BATCH_SIZE
    max_test_samples: int | None = None
    out: str | None = None
    checkpoint_every: int | None = None
    resume: bool = False
    overwrite: bool = False
    allow_fallback: bool = False
    target_accuracy: float | None = None
    system_path: str | None = None
    system_seed: int = 0
    redraw_resources: bool = True
    noise_cv: float = 0.0
    reestimate: bool = False
    flops_scale: float = 1.0
    bandwidth_scale: float = 1.0
    constants_path: str | None = None
    data_root: str | None = None
    download: bool = False
    device_data: str | None = None
    batch_devices: bool = True
    progress: bool = False
    threads: int | None = None
    distributed: bool = False
    transport: str = "gloo"
    ranks: int | None = None
    emulate_links: bool = False
    rank_timeout: float = 12.0
    model_width: int = 32
    device: str = "auto"
    client_batching: str = "auto"
    client_recompute: str = "auto"
    server_pass_samples: int | str = "auto"
    extra: dict[str, Any] = field(default_factory=dict)
    client_lr: float | None = None
    server_lr: float | None = None
    client_optimizer: str | None = None
    server_optimizer: str | None = None
    local_test_fraction: float = LOCAL_TEST_FRACTION

    def __post_init__(self) -> None:
        self.resolve_defaults()
        self.validate()

    def resolve_defaults(self) -> None:
        """Fill the options left None with the algorithm's (:data:`ALGORITHM_DEFAULTS`): ``client_lr`` and
        ``server_lr`` default to ``lr`` when ``lr`` is given, else to the algorithm's per-role rates;
        ``client_optimizer`` and ``server_optimizer`` to ``optimizer``;
        ``clip_norm`` 0 means no clipping; ``interval`` takes the algorithm's I (SCALA's 20) when no policy decides."""
        defaults = ALGORITHM_DEFAULTS.get(self.algorithm) if isinstance(self.algorithm, str) else None
        if defaults is None:
            return                                       # validate() names the unknown algorithm
        lr_given = self.lr is not None
        for name in ("optimizer", "lr", "momentum", "weight_decay"):
            if getattr(self, name) is None:
                setattr(self, name, getattr(defaults, name))
        for name in ("client_lr", "server_lr"):
            if getattr(self, name) is None:
                setattr(self, name, self.lr if lr_given else getattr(defaults, name))
        for name in ("client_optimizer", "server_optimizer"):
            if getattr(self, name) is None:
                setattr(self, name, self.optimizer)
        if self.clip_norm is None:
            self.clip_norm = defaults.clip_norm if defaults.clip_norm is not None else 0.0
        if self.interval is None and self.policy is None and self.plan_path is None:
            self.interval = defaults.interval

    def validate(self) -> None:
        """Raise InputError naming the first bad field."""
        self._check_types()
        self._check_choices()
        self._check_numbers()
        self._check_runtime()
        self._check_plan()

    def _check_choices(self) -> None:
        """The named choices (algorithm and its options, data set, model, partition, optimizers, execution)."""
        check_choice(self.algorithm, ALGORITHMS, "algorithm")
        for name, value in algorithm_options(self.algorithm, self.extra).items():
            option = OPTION_BY_NAME[name]   # numbers finite and bounded here; their own ranges in the strategy
            if option.type is float:
                finite_number(value, option.flag)
            elif option.type is int:
                int_in_range(value, option.flag, 0, MAX_STEPS)
        check_choice(self.dataset, DATASETS, "dataset")
        check_model(self.model, "model")
        check_choice(self.partition, PARTITIONS, "partition")
        for name in ("optimizer", "client_optimizer", "server_optimizer"):
            check_choice(getattr(self, name), OPTIMIZERS, name)
        check_choice(self.device, DEVICES, "device")
        check_choice(self.client_batching, CLIENT_BATCHING, "client_batching")
        check_choice(self.client_recompute, CLIENT_RECOMPUTE, "client_recompute")

    def _check_numbers(self) -> None:
        """Every number within its range (docs/formats.md: the limits of adaptplan.limits)."""
        if self.clip_norm is not None and self.clip_norm != 0:
            positive_number(self.clip_norm, "clip_norm")
        for name, (maximum, unit) in _INT_LIMITS.items():
            if name not in _OPTIONAL_INTS or getattr(self, name) is not None:
                positive_int(getattr(self, name), name, maximum, unit)
        if self.server_pass_samples != "auto":
            positive_int(self.server_pass_samples, "server_pass_samples", MAX_STEPS, "samples")
        for name in ("seed", "system_seed"):
            int_in_range(getattr(self, name), name, 0, MAX_SEED)
        for name in ("lr", "client_lr", "server_lr"):
            number_in_range(getattr(self, name), name, 0.0, MAX_LR, low_open=True)
        number_in_range(self.momentum, "momentum", 0.0, 1.0, high_open=True)
        number_in_range(self.weight_decay, "weight_decay", 0.0, MAX_WEIGHT_DECAY)
        number_in_range(self.noise_cv, "noise_cv", 0.0, MAX_NOISE_CV)
        number_in_range(self.dirichlet_alpha, "dirichlet_alpha", 0.0, MAX_ALPHA, low_open=True)
        number_in_range(self.local_test_fraction, "local_test_fraction", 0.0, MAX_LOCAL_TEST_FRACTION)
        if self.target_accuracy is not None:
            number_in_range(self.target_accuracy, "target_accuracy", 0.0, 1.0, low_open=True)
        for name in ("flops_scale", "bandwidth_scale"):
            number_in_range(getattr(self, name), name, 0.0, MAX_SCALE, low_open=True)

    def _check_runtime(self) -> None:
        """The distributed runtime's options, and that they come with --distributed."""
        if self.ranks is not None:
            positive_int(self.ranks, "ranks", MAX_DEVICES + 2, "ranks")
            if self.ranks < 3:
                raise InputError(f"a distributed run needs at least 3 ranks (edge server, fed server, one device "
                                 f"rank), got {self.ranks}", field="ranks")
        number_in_range(self.rank_timeout, "rank_timeout", 1.0, 86400.0)
        check_choice(self.transport, TRANSPORTS, "transport")
        if self.transport != "gloo" and not self.distributed:
            raise InputError(f"the {self.transport} transport carries a distributed run; use --runtime {self.transport}",
                             field="transport")
        if (self.ranks is not None or self.emulate_links) and not self.distributed:
            raise InputError("applies to --distributed runs; add --distributed",
                             field="ranks" if self.ranks is not None else "emulate_links")

    def _check_plan(self) -> None:
        """Cuts, plan file, policy, interval and re-planning agree with each other."""
        if self.cuts is not None:
            cuts = tuple(positive_int(c, f"cuts[{i}]", MAX_CUT_POINTS) for i, c in enumerate(self.cuts))
            if len(cuts) == 1:
                cuts = cuts * self.devices
            if len(cuts) != self.devices:
                raise InputError(f"need 1 or {self.devices} cut indices (one per device), got {len(cuts)}", field="cuts")
            self.cuts = cuts
        if self.plan_path is not None and self.cuts is not None:
            raise InputError("give either a plan file or explicit cuts, not both", field="cuts")
        if self.reestimate and self.device_data is not None and self.distributed:
            raise InputError("re-estimating the constants needs training samples on the edge server; with --device-data "
                             "they stay on the devices (give --constants instead)", field="reestimate")
        if self.reestimate and self.replan_every is None and self.policy not in REDRAWING_POLICIES:
            raise InputError("re-estimation happens at re-planning points: add --replan-every Q (or a random --policy)",
                             field="reestimate")
        if self.policy is not None:
            check_choice(self.policy, POLICIES, "policy")
            if self.plan_path is not None:
                raise InputError(f"a policy decides the plan; drop --plan or --policy {self.policy}", field="policy")
            if self.policy == "fixed-cut" and (self.cuts is None or len(set(self.cuts)) != 1):
                raise InputError("--policy fixed-cut needs one cut for every device: --cuts J", field="cuts")
            if self.policy != "fixed-cut" and self.cuts is not None:
                raise InputError(f"--policy {self.policy} decides the cuts; --cuts goes with --policy fixed-cut only",
                                 field="cuts")
            if self.policy != "adaptsfl" and self.interval is not None:
                raise InputError(f"--policy {self.policy} decides the interval; drop --interval", field="interval")
            if self.policy != "adaptsfl" and self.replan_every is not None:
                raise InputError(f"--policy {self.policy} re-decides at every aggregation (random draws) or never; "
                                 "--replan-every goes with --policy adaptsfl", field="replan_every")

    def _check_types(self) -> None:
        """Text, flag, option-map and cut-list fields have their types (a configuration read back from a
        checkpoint or JSON may not); numbers are checked with their ranges in :meth:`validate`."""
        kinds = {"str": (str,), "str | None": (str, type(None)), "bool": (bool,), "dict[str, Any]": (dict,),
                 "tuple[int, ...] | None": (tuple, list, type(None))}
        words = {"str": "text", "str | None": "text or null", "bool": "true or false", "dict[str, Any]": "an object",
                 "tuple[int, ...] | None": "a list of cut indices or null"}
        for f in dataclasses.fields(self):
            allowed = kinds.get(str(f.type))
            value = getattr(self, f.name)
            if allowed is not None and not isinstance(value, allowed):
                raise InputError(f"must be {words[str(f.type)]}, got {type(value).__name__}", field=f.name)
        if not all(isinstance(k, str) for k in self.extra):
            raise InputError("option names must be text", field="extra")

    def optimizer_spec(self, role: str = "client") -> "OptimizerSpec":
        """The optimizer of ``role``: "client" (the devices) or "server" (the edge server's instances)."""
        lr, name = (self.client_lr, self.client_optimizer) if role == "client" else (self.server_lr, self.server_optimizer)
        assert name is not None and lr is not None and self.momentum is not None and self.weight_decay is not None, \
            "filled by resolve_defaults"
        return OptimizerSpec(name, lr, self.momentum, self.weight_decay, self.clip_norm or None)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if data["cuts"] is not None:
            data["cuts"] = list(data["cuts"])
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise InputError(f"unknown key(s) {unknown}; valid: {', '.join(sorted(names))}", field="config")
        values = dict(data)
        if isinstance(values.get("cuts"), list):
            values["cuts"] = tuple(values["cuts"])
        return cls(**values)


def check_model(name: str, field: str = "model") -> None:
    """Raise InputError naming ``field`` (and listing the valid names) unless ``name`` is a
    built-in (:data:`MODELS`), a torchvision classification model or an importable
    ``package.module:factory``."""
    if name not in MODELS:
        from profilers.models import check_model_spec

        check_model_spec(name, field, extra_names=MODELS)
