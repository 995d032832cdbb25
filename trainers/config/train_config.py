"""`TrainConfig`: the ONE configuration object of a training run, by part.

A run's options live in eight parts (:data:`PARTS`): ``data`` (:class:`DataConfig`), ``model``
(:class:`ModelConfig`), ``optim`` (:class:`OptimConfig`), ``plan`` (:class:`PlanConfig`), ``system``
(:class:`SystemConfig`), ``runtime`` (:class:`RuntimeConfig`), ``execution`` (:class:`ExecutionConfig`) and ``run``
(:class:`RunConfig`); ``algorithm`` and its ``extra`` options sit on :class:`TrainConfig` itself. Each field declares
its metadata once (:func:`trainers.config.fields.option`: flat key, flag, help, unit, limits, choices, resumable),
and from it come the range and choice checks, :data:`RESUMABLE`, :data:`FLAG_OF` and the command line's options
(:mod:`adaptplan.cli.config_flags`). A run folder stores the flat form (:meth:`TrainConfig.to_json`, one key per
field, docs/formats.md), the same as before the parts existed, so old run folders resume.

The optimizer is built from the ``optim`` part (each algorithm's defaults in :data:`ALGORITHM_DEFAULTS`, filled by
:meth:`OptimConfig.resolve`). Unknown names (algorithm, dataset, model, partition) raise
:class:`adaptplan.errors.InputError` listing the valid names.

This module does not import torch (the CLI parser reads its name lists): dataset names are :data:`DATASETS` (each
with its loader in :data:`trainers.inputs.datasets.LOADERS`), and a model name is checked by
:func:`trainers.inputs.models.check_model` only when a config is validated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from os import PathLike
from typing import Any, Mapping

from adaptplan.calibration import ROUNDS_LAWS
from adaptplan.errors import InputError
from adaptplan.fileio import positive_int, positive_number
from adaptplan.limits import (
    MAX_BATCH_SIZE,
    MAX_CUT_POINTS,
    MAX_DEVICES,
    MAX_MODEL_WIDTH,
    MAX_NOISE_CV,
    MAX_NUM_CLASSES,
    MAX_ROUNDS,
    MAX_SEED,
    MAX_STEPS,
    MAX_THREADS,
)
from adaptplan.plan import Plan
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
from trainers.config.fields import check_fields, described, option, resumable_keys
from trainers.config.optimizer_spec import OPTIMIZERS, OptimizerSpec

MAX_LR = 1e6               # step size γ; a diverging run stops with a message, this only keeps γ sane
MAX_WEIGHT_DECAY = 1.0     # L2 coefficient
MAX_ALPHA = 1e6            # Dirichlet concentration (large = iid)
MAX_SIZE_EXPONENT = 10.0   # power-law size skew: beyond 10 one device takes ~all samples
MAX_SCALE = 1e6            # --flops-scale / --bandwidth-scale: a million times the generator's ranges
DATASETS = ("cifar10-subset", "mnist-subset", "mnist", "cifar10", "cifar100", "fashion-mnist", "shakespeare",
            "synthetic", "synthetic-text")
"""Valid values of ``--dataset``: each has its loader in trainers.inputs.datasets.LOADERS (tests/trainers/inputs/test_datasets.py)."""
# built-ins; any torchvision name or package.module:factory is valid too
MODELS = ("cnn", "mlp", "vgg16-cifar", "resnet18-cifar", "resnet34-cifar", "resnet50-cifar", "leaf-lstm")
#: How ``package.module:factory`` is found (profilers.models._factory), for the --model/MODEL help of
#: `adaptplan train` and `adaptplan profile`: the working directory is appended to sys.path unless it
#: (or "") is already there, as it is not for the installed `adaptplan` script.
OWN_MODEL_HELP = ("package.module:factory, your own function returning an nn.Module, or an nn.Module class (called "
                  "as factory(num_classes=M) when it has that parameter, else factory(); it gets no input shape or "
                  "width, and any other parameter needs a default), imported with the working directory on the "
                  "import path (appended, after PYTHONPATH and the installed packages): run from the folder that "
                  "holds the module, or put that folder on PYTHONPATH")
PARTITIONS = ("iid", "shards", "dirichlet", "dirichlet-equal", "quantity", "labels", "power-law", "roles")
TRANSPORTS = ("gloo", "mqtt")
"""What carries a distributed run's frames: torch.distributed's gloo, or an MQTT broker."""
DEVICES = ("auto", "cpu", "cuda")          # auto = cuda when torch sees a GPU, else cpu (trainers.config.devices)
CLIENT_BATCHING = ("auto", "on", "off")    # auto = batched on CUDA, per device on a CPU (trainers.roles.batching)
CLIENT_RECOMPUTE = ("auto", "on", "off")   # auto = when the waiting graphs exceed RECOMPUTE_BYTES (trainers.engine.execution)
RECOMPUTE_BYTES = 2**30
"""``client_recompute = "auto"``: a group of devices whose client graphs would keep more than this many bytes
for backward in all (1 GiB; each cut's bytes per sample measured once, :func:`trainers.engine.execution.graph_bytes_per_sample`)
recomputes its client forwards at backward time (their graphs would otherwise all wait for the edge server at
once). A barrier served as its devices forward (the default serve) waits one server chunk at a time, within
``server_pass_samples``: it never recomputes by default."""
SERVER_PASS_SAMPLES = 1024
"""Most samples per edge-server pass (``server_pass_samples = "auto"``) on a GPU: a barrier round over more
is served in chunks. 1024 samples of the CIFAR CNN at cut 1 hold ≈ 0.25 GiB of server graph; the default
population (20 devices × 16 samples) is one pass."""
CPU_PASS_SAMPLES = 128
"""Most samples per edge-server pass (``server_pass_samples = "auto"``) on a CPU, where passes that fit the
caches are faster per sample: measured (CIFAR CNN cut 1, 200 devices × 16, 1 thread, AdaptSFL / PSL,
2026-11-26) 0.69 / 0.70 × centralized batch-16 throughput with 1,024-sample passes, 1.01 / 1.06 × with 128,
1.06 / 1.04 × with 64, and 644 → 139 MiB peak (docs/measured.md "The engine and its memory")."""


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
SAVED_BEFORE = {"local_test_fraction": 0.0, "pilots": None, "aggregation": "mean", "trim": 0.1, "rounds_law": "eq15",
                "client_state": "algorithm", "labels_per_device": 2, "size_exponent": 1.0, "activation_clip": 0.0,
                "activation_noise": 0.0, "nopeek": 0.0, "privacy_delta": 1e-5, "label_epsilon": None,
                "clip_per_value": False, "u_shaped": 0, "head_clip": 0.0, "head_noise": 0.0, "leakage_table": None,
                "max_leakage": None}
"""Options a configuration saved before they existed ran with: no local test split, no pilots; the partition
options of issue 70 at their defaults (no partition of before read them); no defence of the activations and no leakage budget (issue 71)."""

CLIENT_STATES = ("algorithm", "keep", "restart")
"""``--client-state``: a device's optimizer state when it loads the global client model."""
POLICIES = ("adaptsfl", "rma+ms", "ma+rms", "rma+rms", "dama+rms", "rma+ams", "sfl", "psl", "fixed-cut")
REDRAWING_POLICIES = ("rma+ms", "ma+rms", "rma+rms", "dama+rms", "rma+ams")   # re-drawn at every aggregation


def as_saved_run_trained(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A configuration saved before some options existed, with them as that run trained: both roles at its
    ``lr`` and its ``optimizer`` (before the per-role options), no local test split and no pilots (:data:`SAVED_BEFORE`);
    options the configuration holds are kept."""
    return {**{k: saved.get("lr") for k in ("client_lr", "server_lr")},
            **{k: saved.get("optimizer") for k in ("client_optimizer", "server_optimizer")}, **SAVED_BEFORE, **saved}


# ---- the parts of a run's configuration ----------------------------------------------------------------------
# Each field declares its flat key (saved configurations, error messages), flag, help, unit, limits and whether a
# resumed run may change it (trainers.config.fields.Meta); the range checks, RESUMABLE, the flags' names and the
# command line's options (adaptplan.cli.config_flags) are generated from them.


@dataclass
class DataConfig:
    """The data set, its partition over the devices and each device's local test split. ``batch_size`` b in
    samples per device per round; ``local_test_fraction``: the share of each device's samples held out for the
    local evaluation protocol (CycleSL §4.1's sample-wise split; :func:`trainers.inputs.partition.local_test_split`),
    never trained on; 0 = none."""

    dataset: str = option("cifar10-subset", f"one of {', '.join(DATASETS)} (default cifar10-subset; synthetic = tiny "
                          "generated data for tests)", choices=DATASETS)
    devices: int = option(20, "number of devices N (default 20)", high=MAX_DEVICES, unit="devices")
    partition: str = option("iid", f"one of {', '.join(PARTITIONS)} (default iid)", choices=PARTITIONS)
    dirichlet_alpha: float = option(0.5, "Dirichlet concentration α for --partition dirichlet and dirichlet-equal "
                                    "(default 0.5)", flag="--alpha", low=0.0, high=MAX_ALPHA, low_open=True)
    labels_per_device: int = option(2, "labels per device for --partition quantity (SCALA's α: K·α/M portions per "
                                    "label, α to each device) and labels (the pathological k) (default 2)",
                                    low=1, high=MAX_NUM_CLASSES, unit="labels")
    size_exponent: float = option(1.0, "power-law exponent γ of the device sizes for --partition power-law "
                                  "(n_i ∝ rank^−γ; 0 = equal sizes; default 1)", low=0.0, high=MAX_SIZE_EXPONENT)
    batch_size: int = option(16, "mini-batch size b per device per round, in samples (default 16)",
                             high=MAX_BATCH_SIZE, unit="samples")
    local_test_fraction: float = option(
        LOCAL_TEST_FRACTION, "share of each device's samples held out (never trained on) for the local evaluation "
        "protocol: every evaluation also reports the accuracy of each device's model on its own held-out samples, "
        "pooled over the devices (CycleSL's sample-wise 90/10 split); 0 = none, at most 0.5 (default 0.1)",
        low=0.0, high=MAX_LOCAL_TEST_FRACTION)
    data_root: str | None = option(
        None, "folder with the dataset files: cifar10_subset.npz / mnist_test.npz for cifar10-subset and "
        "mnist-subset (default: $ADAPTPLAN_DATA_DIR, else the project's data/ folder), or torchvision's files for "
        "cifar10, cifar100, fashion-mnist and full mnist (required for those)", metavar="DIR")
    download: bool = option(False, "let torchvision fetch cifar10/cifar100/mnist/fashion-mnist into --data-root "
                            "(needs a network)")
    device_data: str | None = option(
        None, "a per-device data folder (adaptplan split-data; docs/distributed.md): each device trains on its own "
        "file and the folder fixes the partition (--dataset, --partition do not apply); with --distributed the edge "
        "server reads only manifest.json and test.npz, a device rank only its devices' files", metavar="DIR")


@dataclass
class ModelConfig:
    """``name``: a built-in (:data:`MODELS`), a torchvision classification model name (random weights) or
    ``package.module:factory``; ``width`` (channels of the first layer) applies to the built-ins ``cnn`` and
    ``mlp`` only."""

    name: str = option("cnn", f"built-in {', '.join(MODELS)} (default cnn), a torchvision classification model name "
                       f"(resnet18, mobilenet_v2, ...; random weights) or {OWN_MODEL_HELP}", key="model")
    width: int = option(32, "channels of the built-ins' first layer", key="model_width", flag=None,
                        high=MAX_MODEL_WIDTH, unit="channels")


@dataclass
class OptimConfig:
    """Both roles' optimizers. None = the algorithm's paper default (:data:`ALGORITHM_DEFAULTS`), filled by
    :meth:`resolve`; ``lr`` γ is a dimensionless step size (also the planner's γ)."""

    lr: float | None = option(None, "learning rate γ of both roles, also the planner's γ (default: the algorithm's)",
                              low=0.0, high=MAX_LR, low_open=True)
    client_lr: float | None = option(None, "the devices' learning rate (default: --lr if given, else the algorithm's)",
                                     low=0.0, high=MAX_LR, low_open=True)
    server_lr: float | None = option(None, "the edge server's learning rate (default: --lr if given, else the "
                                     "algorithm's)", low=0.0, high=MAX_LR, low_open=True)
    momentum: float | None = option(None, "SGD momentum of both roles (default: the algorithm's)", low=0.0, high=1.0,
                                    high_open=True)
    weight_decay: float | None = option(None, "weight decay, L2 coefficient (default: the algorithm's)", low=0.0,
                                        high=MAX_WEIGHT_DECAY)
    optimizer: str | None = option(None, f"optimizer of both roles: {', '.join(OPTIMIZERS)} (default: the "
                                   "algorithm's)", choices=OPTIMIZERS)
    client_optimizer: str | None = option(None, "the devices' optimizer (default: --optimizer)", choices=OPTIMIZERS)
    server_optimizer: str | None = option(None, "the edge server's optimizer (default: --optimizer)",
                                          choices=OPTIMIZERS)
    aggregation: str = option(
        "mean", "how the fed server combines uploads: mean (FedAvg, eq. 7; default), or median / trimmed-mean "
        "(coordinate-wise, Yin et al. ICML 2018), which bound what a minority of lying devices can move; their sorts "
        "are charged to the clock", choices=("mean", "median", "trimmed-mean"))
    trim: float = option(0.1, "share β of the largest and of the smallest values the trimmed mean drops per entry "
                         "(default 0.1; below 0.5)", low=0.0, high=0.5, high_open=True)
    client_state: str = option(
        "algorithm", "a device that loads the global client model keeps its optimizer state (momentum, Adam's "
        "moments) or restarts it: keep, restart, or algorithm (default: each algorithm's own, docs/algorithms.md "
        "\"Optimizer state\"); a comparison gives every method one of keep or restart", choices=CLIENT_STATES)
    clip_norm: float | None = option(None, "clip each role's gradient 2-norm at this value before every step; 0 = no "
                                     "clipping (default: the algorithm's, 10 for SCALA and GAS as in their code)", low=0.0)

    def resolve(self, defaults: TrainingDefaults) -> None:
        """Fill the options left None with ``defaults``: ``client_lr`` and ``server_lr`` default to ``lr`` when
        ``lr`` is given, else to the algorithm's per-role rates; ``client_optimizer`` and ``server_optimizer`` to
        ``optimizer``; ``clip_norm`` 0 means no clipping."""
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

    def check(self) -> None:
        check_fields(self)
        if self.clip_norm is not None and self.clip_norm != 0:
            positive_number(self.clip_norm, "clip_norm")

    def spec(self, role: str = "client") -> OptimizerSpec:
        """The optimizer of ``role``: "client" (the devices) or "server" (the edge server's instances)."""
        lr, name = (self.client_lr, self.client_optimizer) if role == "client" else (self.server_lr, self.server_optimizer)
        assert name is not None and lr is not None and self.momentum is not None and self.weight_decay is not None, \
            "filled by resolve"
        restart = None if role != "client" or self.client_state == "algorithm" else self.client_state == "restart"
        return OptimizerSpec(name, lr, self.momentum, self.weight_decay, self.clip_norm or None,
                             restart_on_download=restart)


@dataclass
class PlanConfig:
    """Cuts and aggregation interval. ``cuts``: one 1-based cut index ℓ_i per device (device i runs chain blocks
    1..ℓ_i); a single value is broadcast to all devices. None → the plan (``path``), else the policy, else the
    built-in planner, else the documented default (every device at cut ⌈L/2⌉, I = 1). ``interval`` I in rounds
    (client-side MA period, eq. 7); ``replan_every`` Q in rounds (Algorithm 1; re-planning happens only at
    aggregation rounds)."""

    path: str | None = option(None, "plan JSON file (adaptplan plan --json) giving cuts and interval", key="plan_path",
                              flag="--plan")
    policy: str | None = option(
        None, f"planning policy deciding cuts and interval in the loop: {', '.join(POLICIES)} (random ones re-draw at "
        "every aggregation; adaptsfl re-plans every --replan-every rounds; fixed-cut uses --cuts J); default: plan once "
        "with the built-in planner", choices=POLICIES)
    reestimate: bool = option(False, "before the first plan (from the initial model) and at every re-planning point "
                              "(from the global model), estimate beta, sigma_j^2, G_j^2 and theta from the run's own "
                              "model and data (Algorithm 1) instead of the constants given or the placeholders")
    replan_every: int | None = option(None, "re-plan every Q rounds at aggregation rounds (Algorithm 1), in rounds",
                                      high=MAX_STEPS, unit="rounds")
    interval: int | None = option(None, "client-side model-averaging interval I, in rounds (overrides the plan and "
                                  "every re-plan)", high=MAX_ROUNDS, unit="rounds")
    cuts: tuple[int, ...] | None = option(
        None, "1-based cut index per device on the model's cut points as listed by `adaptplan profile MODEL` (one "
        "value = all devices), e.g. 3 or 3,3,5; default: the built-in planner's plan", generated=False)
    constants_path: str | None = option(None, "training constants JSON for the planner, one sigma2/G2 per cut point of "
                                        "--model (default: docs/model.md §6.1 placeholders)", flag="--constants")
    pilots: str | None = option(None, "comma-separated folders of finished runs of this setting, each with one plan "
                                "(--cuts, --interval): the planner's constants are estimated from this run's model and "
                                "data and fitted to the rounds the pilots took to --target-accuracy (docs/model.md §10), "
                                "so the plan predicts rounds and seconds to that accuracy", metavar="RUN[,RUN...]")
    rounds_law: str = option("eq15", "with --pilots, the rounds to the target they are fitted to: eq15 (eq. 15's "
                             "constants, docs/model.md §10) or linear (R(I) = R1 (1 + kappa (I - 1)) at every cut, the "
                             "latency-best cuts at each I up to the pilots' longest; §12; needs pilots at two intervals) "
                             "or per-cut (each cut its own line R_j(I) through its pilots' intervals, R = max_i "
                             "R_{cut_i}(I), §12 \"Per cut\": for a defence whose cost differs by cut)",
                             choices=ROUNDS_LAWS)
    allow_fallback: bool = option(False, "when the planner finds no feasible plan, train every device at cut "
                                  "ceil(L/2) with I = 1 (printed) instead of stopping with the reason")
    leakage_table: str | None = option(None, "leakage table of the model (`adaptplan profile MODEL --leakage "
                                       "--leakage-out FILE` under this run's defence setting, or `train --leakage-out`) "
                                       "that --max-leakage reads", metavar="FILE")
    max_leakage: str | None = option(None, "keep every plan of the run (the first and every re-plan; --cuts and --plan "
                                     "are checked) within this leakage budget over --leakage-table: METRIC=LIMIT for "
                                     "every device or METRIC=L0,L1,... one per device (docs/privacy.md)",
                                     metavar="METRIC=LIMIT")

    def check(self, devices: int) -> None:
        """The fields' own checks, then cuts (one per device, or one for all), plan file, policy, interval and
        re-planning agree with each other."""
        check_fields(self)
        if self.cuts is not None and not isinstance(self.cuts, (tuple, list)):
            raise InputError(f"must be a list of cut indices or null, got {type(self.cuts).__name__}", field="cuts")
        if self.cuts is not None:
            cuts = tuple(positive_int(c, f"cuts[{i}]", MAX_CUT_POINTS) for i, c in enumerate(self.cuts))
            if len(cuts) == 1:
                cuts = cuts * devices
            if len(cuts) != devices:
                raise InputError(f"need 1 or {devices} cut indices (one per device), got {len(cuts)}", field="cuts")
            self.cuts = cuts
        if self.path is not None and self.cuts is not None:
            raise InputError("give either a plan file or explicit cuts, not both", field="cuts")
        if self.pilots is not None:
            self._check_pilots()
        elif self.rounds_law != "eq15":
            raise InputError("a rounds law is fitted to pilot runs: add --pilots RUN,RUN", field="rounds_law")
        self._check_budget(devices)
        if self.reestimate and self.replan_every is None and self.policy not in REDRAWING_POLICIES:
            raise InputError("re-estimation happens at re-planning points: add --replan-every Q (or a random --policy)",
                             field="reestimate")
        if self.policy is None:
            return
        if self.path is not None:
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

    def _check_budget(self, devices: int) -> None:
        """A leakage budget names its table and a figure (:func:`adaptplan.leakage_table.parse_budget`), and plans
        with the planner or checks the cuts given: a policy that draws cuts over the whole model is refused."""
        from adaptplan.leakage_table import check_budget_pair, parse_budget

        check_budget_pair(self.leakage_table, self.max_leakage, ("leakage_table", "max_leakage"))
        if self.max_leakage is None:
            return

        parse_budget(self.max_leakage, devices)
        if self.policy not in (None, "adaptsfl", "fixed-cut"):
            raise InputError(f"the {self.policy} policy chooses cuts without the leakage budget; plan within it with "
                             "the AdaptSFL planner (leave --policy out) or give --cuts", field="policy")

    @property
    def pilot_folders(self) -> list[str]:
        """The folders of ``pilots`` (empty without)."""
        return [part.strip() for part in (self.pilots or "").split(",") if part.strip()]

    def _check_pilots(self) -> None:
        """Pilots calibrate the planner's constants: there must be a folder, and a planner (no --cuts, --plan)
        whose constants no file gives."""
        if not self.pilot_folders:
            raise InputError("must name at least one run folder", field="pilots")
        clash = ("constants_path" if self.constants_path is not None else "plan_path" if self.path is not None
                 else "cuts" if self.cuts is not None and self.policy is None else None)
        if clash is not None:
            raise InputError(f"the pilots calibrate the planner's constants; {clash} leaves nothing to calibrate "
                             f"(drop one of them)", field="pilots")
        if self.rounds_law != "eq15" and (self.reestimate or self.policy not in (None, "adaptsfl")):
            raise InputError(f"the {self.rounds_law} rounds law is fitted to the pilots alone: it plans with no constants to "
                             "re-estimate and no other policy; drop " + ("--reestimate" if self.reestimate else
                                                                        f"--policy {self.policy}"),
                             field="rounds_law")


@dataclass
class SystemConfig:
    """The simulated system the clock charges: a file or one generated from ``seed``, its per-round re-draws and
    the planner's measurement noise (``noise_cv``, a coefficient of variation); ``flops_scale`` and
    ``bandwidth_scale`` multiply the generator's ranges."""

    path: str | None = option(None, "system JSON/TOML (default: generated from --system-seed)", key="system_path",
                              flag="--system")
    seed: int = option(0, "seed of the generated system and its per-round re-draws (default 0)", key="system_seed",
                       low=0, high=MAX_SEED)
    redraw_resources: bool = option(True, "do not re-draw device FLOP/s and uplinks every round (re-drawing applies to "
                                    "generated systems only; a --system file keeps its resources)",
                                    flag="--static-resources", negated=True)
    noise_cv: float = option(0.0, "coefficient of variation of the noise on what planners measure", flag=None, low=0.0,
                             high=MAX_NOISE_CV)
    flops_scale: float = option(1.0, "scale of the device FLOP/s range", flag=None, low=0.0, high=MAX_SCALE,
                                low_open=True)
    bandwidth_scale: float = option(1.0, "scale of every link rate", flag=None, low=0.0, high=MAX_SCALE, low_open=True)


def resume_command(out: str, distributed: bool = False, transport: str = "gloo") -> str:
    """``adaptplan train --out OUT --resume`` with what continues the run where it ran: nothing (the simulator),
    ``--distributed`` (gloo) or ``--runtime mqtt``."""
    flags = "" if not distributed else "--distributed" if transport == "gloo" else f"--runtime {transport}"
    return f"adaptplan train --out {out} --resume {flags}".rstrip()


@dataclass
class RuntimeConfig:
    """Where the roles run: one process (the simulator), or ranks over torch.distributed (``transport`` gloo) or an
    MQTT broker; ``rank_timeout`` in seconds. A resumed run may change every one of them."""

    distributed: bool = option(
        False, "run the roles as processes on this machine: rank 0 edge server, rank 1 fed server, the others host the "
        "devices; same numbers as the simulation, plus measured seconds per stage (across machines: torchrun ... -m "
        "adaptplan.distributed OPTIONS)", resumable=True)
    transport: str = option("gloo", "what carries a distributed run's frames", flag="--runtime", generated=False,
                            choices=TRANSPORTS, resumable=True)
    ranks: int | None = option(None, "processes of a --distributed run, ≥ 3 (default: 2 + min(devices, 8); a device "
                               "rank hosts several devices when there are more devices than device ranks)",
                               high=MAX_DEVICES + 2, unit="ranks", resumable=True)
    emulate_links: bool = option(False, "deliver every message no earlier than its size over the link's rate in the "
                                 "round's system (bit/s), so measured transfer times follow the latency model on "
                                 "loopback", resumable=True)
    rank_timeout: float = option(
        12.0, "seconds rank 0 waits for another rank's reply before the run stops naming it (default 12; must exceed "
        "one device rank's work in a round); the other ranks wait 1.5x this for rank 0's next message (rank 0 sends "
        "a heartbeat every half time-out while it evaluates, re-plans or writes files)", low=1.0, high=86400.0,
        unit="s", resumable=True)

    def resume_command(self, out: str) -> str:
        """The command that continues the run in ``out`` on this runtime (:func:`resume_command`)."""
        return resume_command(out, self.distributed, self.transport)

    def check(self) -> None:
        """The fields' own checks, and that the distributed options come with --distributed."""
        check_fields(self)
        if self.ranks is not None and self.ranks < 3:
            raise InputError(f"a distributed run needs at least 3 ranks (edge server, fed server, one device rank), "
                             f"got {self.ranks}", field="ranks")
        if self.transport != "gloo" and not self.distributed:
            raise InputError(f"the {self.transport} transport carries a distributed run; use --runtime {self.transport}",
                             field="transport")
        if (self.ranks is not None or self.emulate_links) and not self.distributed:
            raise InputError("applies to --distributed runs; add --distributed",
                             field="ranks" if self.ranks is not None else "emulate_links")


@dataclass
class ExecutionConfig:
    """How the run is executed, never what it computes: a resumed run may change every one of them (results then
    agree up to floating-point rounding; docs/engine.md "Batched client passes")."""

    device: str = option("auto", "where models and data live: auto (default: cuda when torch sees a GPU, else cpu), "
                         "cpu or cuda (an error where there is no GPU)", choices=DEVICES, resumable=True)
    client_batching: str = option(
        "auto", "run the client blocks of devices that share a cut as one call (stacked per-device weights, "
        "torch.func.vmap; same results up to rounding): auto (default: on with cuda, off on a cpu, where per-device "
        "calls are faster), on or off; models with BatchNorm or Dropout stay per device", choices=CLIENT_BATCHING,
        resumable=True)
    client_recompute: str = option(
        "auto", "a device waiting for its reply keeps only its sample indices and recomputes its forward at backward "
        "time (one more client forward per step, no client activations held; the same results): auto (default: when "
        f"the waiting devices' graphs would hold more than {RECOMPUTE_BYTES / 2**30:g} GiB; a barrier of the default "
        "serve waits one server pass at a time), on or off", choices=CLIENT_RECOMPUTE, resumable=True)
    server_pass_samples: int | str = option(
        "auto", "the most samples the edge server runs through its blocks in one pass: a barrier round over more is "
        "served in chunks, its gradients accumulated (results equal up to float rounding): auto (default: "
        f"{CPU_PASS_SAMPLES} on a cpu, where passes that fit the caches are faster, {SERVER_PASS_SAMPLES} on cuda) or "
        "a number; cyclesl steps on its own b_S = b batches and gapsl's gradients g_i are taken one device at a time",
        auto=True, high=MAX_STEPS, unit="samples", metavar="SAMPLES", resumable=True)
    threads: int | None = option(None, "torch CPU threads (default: torch's choice)", high=MAX_THREADS,
                                 unit="threads", resumable=True)
    batch_devices: bool = option(True, "run the devices of one round through the engine's batched paths", flag=None)
    eval_batch_size: int = option(EVAL_BATCH_SIZE, "samples per evaluation pass", flag=None, high=MAX_BATCH_SIZE,
                                  unit="samples")


@dataclass
class RunConfig:
    """The run's length, seed, evaluation and folder. ``rounds`` R (one round = every device processes one
    mini-batch, docs/model.md §2.1), ``eval_every`` and ``checkpoint_every`` in rounds, ``target_accuracy`` a
    fraction in (0, 1]."""

    rounds: int = option(200, "training rounds R (default 200)", high=MAX_STEPS, unit="rounds", resumable=True)
    seed: int = option(0, "seed for model init, partition and samplers (default 0)", low=0, high=MAX_SEED)
    eval_every: int = option(10, "evaluate on the test set every K rounds (default 10; an evaluation costs about as "
                             "much as 3 training rounds of the default run)", high=MAX_STEPS, unit="rounds",
                             resumable=True)
    max_test_samples: int | None = option(None, "evaluate on the first K test images only (default: all)",
                                          high=MAX_STEPS, unit="samples")
    target_accuracy: float | None = option(None, "report simulated seconds to reach this test accuracy (fraction 0-1)",
                                           low=0.0, high=1.0, low_open=True, resumable=True)
    out: str | None = option(None, "run folder for history.json/.csv, accuracy.png and checkpoint.pt", resumable=True)
    checkpoint_every: int | None = option(None, "write a checkpoint every K rounds (needs --out)", high=MAX_STEPS,
                                          unit="rounds", resumable=True)
    resume: bool = option(
        False, "continue the run in --out from its checkpoint with the options it was started with (only the options "
        "listed in `adaptplan train --help` under \"may be given anew\" may change)", resumable=True)
    overwrite: bool = option(False, "replace the run already in --out (its history, checkpoint and plot are removed "
                             "first)", resumable=True)
    progress: bool = option(False, "no progress bar", flag="--no-progress", negated=True, resumable=True)
    mlflow: str | None = option(
        None, "also log the run to MLflow at this tracking URI (e.g. http://127.0.0.1:5000), or 'local' for a store "
        "in the run folder (RUN/mlflow.db; needs --out and the [mlflow] extra): parameters, every round's metrics, "
        "the history and plots as artifacts (docs/formats.md \"Tracking\")", metavar="URI", resumable=True)

    def check_tracking(self) -> None:
        """``mlflow``: :data:`MLFLOW_LOCAL` with a run folder, or a URI of a scheme MLflow serves (InputError)."""
        uri = self.mlflow
        if uri is None:
            return
        if uri == MLFLOW_LOCAL:
            if not self.out:
                raise InputError("'local' is a store in the run folder: give --out too", field="mlflow")
            return
        scheme = uri.split(":", 1)[0].split("+", 1)[0].lower() if ":" in uri else ""
        if scheme not in MLFLOW_SCHEMES:
            raise InputError(f"{uri[:80]!r} is not an MLflow tracking URI: 'local' (a store in the run folder) or one "
                             f"of the schemes {', '.join(MLFLOW_SCHEMES)} (e.g. http://127.0.0.1:5000)", field="mlflow")


@dataclass
class PrivacyConfig:
    """What each device does to its activations before sending them (trainers/roles/defences.py, docs/privacy.md
    "Defences"): ``activation_clip`` C and ``activation_noise`` σ (the Gaussian mechanism per sample, σ·C the noise's
    standard deviation; ``clip_per_value``: C = c·√d, c the bound per value), ``nopeek`` α (NoPeek's
    distance-correlation weight), ``privacy_delta`` the δ its ε is reported at, ``label_epsilon`` ε of the randomised
    response on the labels; ``u_shaped`` K, a U-shaped split: the last K blocks and the labels stay on the device,
    ``head_clip`` C_g and ``head_noise`` σ_g the Gaussian mechanism on each sample's gradient the head sends."""

    activation_clip: float = option(0.0, "clip each sample's cut-layer activation to this L2 norm C on the device "
                                    "before sending it (default 0: no clip)", low=0.0, high=1e12)
    activation_noise: float = option(0.0, "noise multiplier σ: the device adds Gaussian noise of standard deviation "
                                     "σ·C to each clipped activation, and the run records each device's (ε, δ) "
                                     "(default 0: none; needs --activation-clip)", low=0.0, high=1e6)
    nopeek: float = option(0.0, "NoPeek's weight α: the device's objective gains α·dCor(inputs, activations) over "
                           "its mini-batch (default 0: none)", low=0.0, high=1e6)
    privacy_delta: float = option(1e-5, "δ of the (ε, δ) recorded under --activation-noise (default 1e-5)", low=0.0,
                                  high=1.0, low_open=True, high_open=True)
    label_epsilon: float | None = option(None, "randomised response on the labels: each device sends, for each of its "
                                         "samples, a label drawn once (its own with probability e^ε/(e^ε+M−1), else "
                                         "another uniformly): ε-label-DP (default: the true labels)", low=0.0,
                                         high=1e3)
    clip_per_value: bool = option(False, "--activation-clip is c, a bound per value: each sample's bound is c·√d for "
                                  "the d values it sends at its cut (an RMS of c per value at every cut)")
    u_shaped: int = option(0, "a U-shaped split: the model's last K blocks and the labels stay on the device, which "
                           "gets the server's features and returns their gradient each step (default 0: the server "
                           "computes the loss from the labels the devices send)", low=0, high=1000)
    head_clip: float = option(0.0, "under --u-shaped: clip each sample's gradient the head sends (b times its row of "
                              "∂F/∂h) to this L2 norm C_g (default 0: no clip)", low=0.0, high=1e12)
    head_noise: float = option(0.0, "under --u-shaped: noise multiplier σ_g on the head's clipped per-sample "
                               "gradients (standard deviation σ_g·C_g); the run records each device's (ε, δ) of them "
                               "(default 0: none; needs --head-clip)", low=0.0, high=1e6)

    def check(self) -> None:
        check_fields(self)
        if self.activation_noise > 0 and self.activation_clip <= 0:
            raise InputError("the noise's scale is σ·C: give --activation-clip C > 0 too", field="activation_noise")
        if self.clip_per_value and self.activation_clip <= 0:
            raise InputError("a bound per value needs --activation-clip c > 0", field="clip_per_value")
        if (self.head_clip > 0 or self.head_noise > 0) and self.u_shaped == 0:
            raise InputError("the head's gradient is sent only under a U-shaped split: give --u-shaped K too",
                             field="head_clip" if self.head_clip > 0 else "head_noise")
        if self.head_noise > 0 and self.head_clip <= 0:
            raise InputError("the noise's scale is σ_g·C_g: give --head-clip C_g > 0 too", field="head_noise")


MLFLOW_LOCAL = "local"
"""``--mlflow local``: MLflow's store in the run folder (trainers/run/tracking.py)."""
MLFLOW_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "file", "databricks")
"""The tracking-URI schemes ``--mlflow`` takes (MLflow's stores; ``file`` only where MLflow allows its file store)."""


PARTS = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig, "plan": PlanConfig, "system": SystemConfig,
         "runtime": RuntimeConfig, "execution": ExecutionConfig, "run": RunConfig, "privacy": PrivacyConfig}
"""The parts of :class:`TrainConfig`, by attribute name."""
TOP_LEVEL = ("algorithm", "extra")
"""The flat keys that are :class:`TrainConfig`'s own fields."""
WHERE = {d.key: (part, d.name) for part, cls in PARTS.items() for d in described(cls)}
"""Flat key (``"dirichlet_alpha"``) → (part, attribute) (``("data", "dirichlet_alpha")``)."""
FLAT_KEYS = TOP_LEVEL + tuple(WHERE)
FLAG_OF = {"algorithm": "--algorithm", **{d.key: d.flag for cls in PARTS.values() for d in described(cls)
                                          if d.flag is not None}}
"""Flat key → the flag that sets it (the flag errors name); the keys without a flag are Python-only options."""
DEFAULTS = {"algorithm": "adaptsfl", "extra": {}, **{d.key: d.default for cls in PARTS.values() for d in described(cls)}}
"""Flat key → the default a configuration that does not give it takes (None: the algorithm's, for the optimizer)."""
RESUMABLE = resumable_keys(*PARTS.values())
"""The flat keys of the options a resumed run may change; every other one must equal the checkpointed run's. (A
checkpoint holds CPU tensors whatever the device that wrote it, so ``device`` may change; results then agree up to
floating-point rounding instead of bit for bit, as with another ``server_pass_samples``.)"""


@dataclass
class TrainConfig:
    """All options of one split-training run, by part (:data:`PARTS`): ``config.data.devices``,
    ``config.optim.lr``, ``config.run.rounds``... ``algorithm`` names a registered algorithm, ``extra`` holds its
    options (:data:`ALGORITHM_OPTIONS`, by name).

    :meth:`flat` builds one from flat keys (``TrainConfig.flat(devices=4, lr=0.01)``), the form saved in run
    folders and checkpoints (:meth:`to_json`, :meth:`from_json`; docs/formats.md), so a run folder written before
    the parts existed resumes unchanged; ``TrainConfig.flat(plan=plan, ...)`` takes a :class:`Plan`'s cuts,
    interval and devices. Constructing one fills the options the algorithm decides
    (:meth:`resolve_defaults`) and checks every field (:meth:`validate`, an InputError naming the flat key).
    """

    algorithm: str = "adaptsfl"
    extra: dict[str, Any] = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    run: RunConfig = field(default_factory=RunConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)

    def __post_init__(self) -> None:
        for name, cls in PARTS.items():
            if not isinstance(getattr(self, name), cls):
                raise InputError(f"must be a {cls.__name__}, got {type(getattr(self, name)).__name__}", field=name)
        self.resolve_defaults()
        self.validate()

    @classmethod
    def flat(cls, plan: Plan | None = None, **values: Any) -> "TrainConfig":
        """The configuration of the flat keys ``values`` (:data:`FLAT_KEYS`; the rest at their defaults).

        ``plan``: the planner's answer (:class:`adaptplan.plan.Plan`, from ``Planner(...).plan()`` or
        ``Plan.load(path)``), whose cuts and interval the run takes, and its number of devices when ``devices`` is
        not given (:func:`plan_values`); a plan file goes as ``plan_path`` instead.
        """
        if plan is not None:
            values = {**values, **plan_values(plan, values)}
        unknown = sorted(set(values) - set(FLAT_KEYS))
        if unknown:
            raise InputError(f"unknown key(s) {unknown}; valid: {', '.join(sorted(FLAT_KEYS))}", field="config")
        parts: dict[str, dict[str, Any]] = {name: {} for name in PARTS}
        for key, value in values.items():
            if key not in TOP_LEVEL:
                part, attribute = WHERE[key]
                parts[part][attribute] = value
        top = {k: values[k] for k in TOP_LEVEL if k in values}
        return cls(**top, **{name: PARTS[name](**fields) for name, fields in parts.items()})

    def value(self, key: str) -> Any:
        """The value of the flat key ``key``."""
        if key in TOP_LEVEL:
            return getattr(self, key)
        part, attribute = WHERE[key]
        return getattr(getattr(self, part), attribute)

    def resolve_defaults(self) -> None:
        """Fill the options left None with the algorithm's (:data:`ALGORITHM_DEFAULTS`, :meth:`OptimConfig.resolve`);
        ``interval`` takes the algorithm's I (SCALA's 20) when no policy or plan file decides."""
        defaults = ALGORITHM_DEFAULTS.get(self.algorithm) if isinstance(self.algorithm, str) else None
        if defaults is None:
            return                                       # validate() names the unknown algorithm
        self.optim.resolve(defaults)
        if self.plan.interval is None and self.plan.policy is None and self.plan.path is None:
            self.plan.interval = defaults.interval

    def validate(self) -> None:
        """Raise InputError naming the first bad field (its flat key)."""
        if not isinstance(self.algorithm, str):
            raise InputError(f"must be text, got {type(self.algorithm).__name__}", field="algorithm")
        if not isinstance(self.extra, dict) or not all(isinstance(k, str) for k in self.extra):
            raise InputError("must be an object whose option names are text", field="extra")
        check_choice(self.algorithm, ALGORITHMS, "algorithm")
        algorithm_options(self.algorithm, self.extra)      # each option within its choices and limits (the registry's)
        check_fields(self.data)
        check_fields(self.model)
        check_model(self.model.name, "model")
        self.optim.check()
        self.plan.check(self.data.devices)
        check_fields(self.system)
        self.runtime.check()
        check_fields(self.execution)
        check_fields(self.run)
        self.run.check_tracking()
        self.privacy.check()
        if self.plan.pilots is not None and self.run.target_accuracy is None:
            raise InputError("the pilots are fitted to the rounds they took to a test accuracy: give "
                             "--target-accuracy A", field="pilots")
        if (self.plan.reestimate or self.plan.pilots is not None) and self.data.device_data is not None \
                and self.runtime.distributed:
            raise InputError("estimating the constants needs training samples on the edge server; with --device-data "
                             "they stay on the devices (give --constants instead)",
                             field="reestimate" if self.plan.reestimate else "pilots")

    def optimizer_spec(self, role: str = "client") -> OptimizerSpec:
        """The optimizer of ``role``: "client" (the devices) or "server" (the edge server's instances)."""
        return self.optim.spec(role)

    def to_json(self) -> dict[str, Any]:
        """The flat form (:data:`FLAT_KEYS` → value), as run folders and checkpoints store it."""
        data = {key: self.value(key) for key in FLAT_KEYS}
        data["extra"] = dict(self.extra)
        if data["cuts"] is not None:
            data["cuts"] = list(data["cuts"])
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "TrainConfig":
        """The configuration of a flat mapping (:meth:`to_json`; unknown keys are an error naming them)."""
        values = dict(data)
        if isinstance(values.get("cuts"), list):
            values["cuts"] = tuple(values["cuts"])
        return cls.flat(**values)

    def replaced(self, **values: Any) -> "TrainConfig":
        """A copy with the flat keys ``values`` replaced (checked again)."""
        return TrainConfig.from_json({**self.to_json(), **values})


def plan_values(plan: Plan, values: Mapping[str, Any]) -> dict[str, Any]:
    """The flat keys a run takes from ``plan`` beside the flat keys ``values`` it is configured with: ``cuts`` (ℓ_i,
    one per device), ``interval`` (I in rounds; an ``interval`` in ``values`` overrides it, as ``--interval``
    overrides a plan file) and ``devices`` (N = one per cut).

    Raises:
        InputError: naming ``plan``: not a :class:`Plan`, given with ``cuts``, ``plan_path`` or ``policy`` (each
            decides the cuts too), or made for another number of devices than ``values["devices"]``.
    """
    if not isinstance(plan, Plan):
        hint = f"; a plan file goes as plan_path={str(plan)!r}, or pass Plan.load(path)" \
            if isinstance(plan, (str, PathLike)) else ""
        raise InputError(f"must be a Plan (the planner's answer: Planner(...).plan() or Plan.load(path)), got "
                         f"{type(plan).__name__}{hint}", field="plan")
    for key in ("cuts", "plan_path", "policy"):
        if values.get(key) is not None:
            raise InputError(f"{key}= decides the cuts too: give either plan= or {key}=, not both", field="plan")
    devices = values.get("devices", len(plan.cuts))
    if devices != len(plan.cuts):
        raise InputError(f"the plan is for {len(plan.cuts)} devices (one cut each) but devices = {devices!r}: train "
                         f"with devices={len(plan.cuts)}, or plan for a system of {devices!r} devices", field="plan")
    interval = values.get("interval")
    return {"devices": len(plan.cuts), "cuts": tuple(plan.cuts),
            "interval": plan.interval if interval is None else interval}


def check_model(name: str, field: str = "model") -> None:
    """Raise InputError naming ``field`` (and listing the valid names) unless ``name`` is a
    built-in (:data:`MODELS`), a torchvision classification model or an importable
    ``package.module:factory``."""
    if name not in MODELS and ":" in name:          # the user's code: imported and checked here
        from profilers.models import check_model_spec

        check_model_spec(name, field, extra_names=MODELS)
    elif name not in MODELS:                        # a torchvision name: checked without torch where it can be
        from profilers.model_names import check_model_name

        check_model_name(name, field, extra_names=MODELS)
