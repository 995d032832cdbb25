"""The registry of split algorithms: everything the project knows about an algorithm, in one entry.

An :class:`Algorithm` names where its strategy lives (imported only when a run makes one, so this module and
everything that reads it — the CLI's choices and flags, the configuration's checks, the benches — stay
torch-free), its options (flag, default, unit, help, choices), its paper's training defaults and its traits:
whether every device trains one client model in turn (SL), whether it takes the planner's aggregation interval
(AdaptSFL) and whether a device lost in a real runtime may leave while the others go on (the evaluation
protocol a paper reports is its recipe's, adaptplan/benches/recipes). :data:`REGISTRY` lists them in the order the CLI shows them.

Adding an algorithm is one strategy file under ``trainers/strategies/`` and one entry here
(docs/algorithms.md "Adding an algorithm"); the CLI's ``--algorithm`` choices, its option flags, the defaults
table, the strategy table and the traits the trainer reads all derive from :data:`REGISTRY`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Any, Mapping

from adaptplan.errors import InputError
from adaptplan.fileio import value_in_limits
from adaptplan.limits import MAX_DEVICES, MAX_STEPS


def check_choice(value: str, valid: tuple[str, ...], field_name: str) -> str:
    """Return ``value`` if it is one of ``valid``; else raise InputError naming the field and listing the valid names."""
    if value not in valid:
        raise InputError(f"unknown value {value!r}; valid: {', '.join(valid)}", field=field_name)
    return value


@dataclass(frozen=True)
class Option:
    """One hyperparameter of an algorithm: stored in ``TrainConfig.extra[name]``, set by the flag
    ``--name-with-dashes``. ``choices`` for a categorical option; ``unit`` says what a number counts; ``low`` and
    ``high`` a number's limits (None: 1 and :data:`~adaptplan.limits.MAX_STEPS` for an integer, ±10³⁰ for a
    number), ``low_open``/``high_open`` exclude them. :func:`algorithm_options` checks every value against them (an
    InputError names the flag); a strategy checks only what relates two options. An option several algorithms
    share is one object; :meth:`with_default` gives an algorithm its paper's value."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    unit: str = ""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def with_default(self, default: Any) -> "Option":
        return replace(self, default=default)

    @property
    def limits(self) -> tuple[float | None, float | None]:
        """(low, high) as declared, an integer's missing high :data:`~adaptplan.limits.MAX_STEPS`."""
        return self.low, MAX_STEPS if self.high is None and self.type is int else self.high

    def check(self, value: Any) -> None:
        """Raise InputError naming the flag unless ``value`` is one of the choices, or a number of the option's
        type within its limits."""
        if self.choices:
            check_choice(value, self.choices, self.flag)
        elif self.type in (int, float):
            value_in_limits(value, self.flag, self.type.__name__, *self.limits, self.unit, low_open=self.low_open,
                            high_open=self.high_open)


@dataclass(frozen=True)
class AlgorithmOption:
    """An option as the CLI shows it: the algorithms that take it and each one's default (derived from
    :data:`REGISTRY`, one per option name)."""

    name: str
    algorithms: tuple[str, ...]
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    per_algorithm: tuple[tuple[str, Any], ...] = ()      # (algorithm, its paper's default) where it differs
    unit: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def default_for(self, algorithm: str) -> Any:
        """The default of ``algorithm`` (its paper's value where ``per_algorithm`` names one)."""
        return dict(self.per_algorithm).get(algorithm, self.default)

    def describe_default(self) -> str:
        """The defaults as the help prints them, e.g. ``1.0; scala 0.1, cyclesl 0.05``."""
        return "; ".join([str(self.default)] + [f"{a} {v}" for a, v in self.per_algorithm])


@dataclass(frozen=True)
class TrainingDefaults:
    """An algorithm's training settings when the run does not give them (docs/algorithms.md "Defaults"): the
    optimizer of both roles, the learning rates γ (``lr``, also the planner's γ) and per role, SGD momentum,
    weight decay (L2), gradient-norm clipping (None = off), the aggregation interval I in rounds (None = the
    plan's for AdaptSFL, 1 for the others) and ``source``, where the values come from."""

    optimizer: str
    lr: float
    client_lr: float
    server_lr: float
    momentum: float
    weight_decay: float
    clip_norm: float | None
    interval: int | None
    source: str


@dataclass(frozen=True)
class Algorithm:
    """One split algorithm: its name (``--algorithm``), its strategy (``module:Class``), one line on what it is,
    its paper's training defaults, its options and its traits."""

    name: str
    strategy: str
    summary: str
    defaults: TrainingDefaults
    options: tuple[Option, ...] = ()
    one_client_model: bool = False     # one client model handed from device to device: all at the deepest cut
    planned_interval: bool = False     # takes the planner's aggregation interval I (the others: I = 1)
    allows_absence: bool = False       # a device lost in a real runtime leaves and the run goes on
    active_option: str | None = None   # the option that counts the devices taking part (GAS's C), if not ρ
    local_rounds_option: str | None = None   # the option of its local rounds between averages, if not the interval I
    whole_model: bool = False          # federated learning, no split: every device holds all L blocks (cut L)
    labels_on_device: bool = False     # its server step needs only each device's mean CE: a U-shaped split runs it

    def cut_for(self, cut: int, num_blocks: int) -> int:
        """The cut its devices train at when ``cut`` is asked of a model of ``num_blocks`` blocks: L for an algorithm
        of the whole model (no split), else ``cut``."""
        return num_blocks if self.whole_model else cut

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    def strategy_class(self) -> type:
        """The strategy class (a :class:`trainers.api.Strategy`), imported now."""
        module, _, cls = self.strategy.partition(":")
        return getattr(importlib.import_module(module), cls)


# ---- options --------------------------------------------------------------------------------------------------
PARTICIPATION = Option(
    "participation", float, 1.0, "fraction ρ of the devices that take part, drawn uniformly without replacement "
    "(per round; SCALA: per global iteration of I rounds); 1 = all; SCALA and CycleSL take at least 2 devices "
    "(concatenating or pooling one device's activations is plain SFL/PSL)", unit="fraction of the devices", low=0,
    low_open=True, high=1)
LA_TAU = Option("la_tau", float, 1.0, "logit-adjustment temperature τ (eqs. 12-13, GAS-9), ≥ 0", low=0)
GAPSL_OPTIONS = (
    PARTICIPATION,
    Option("gda", str, "detached", "GAPSL's GDA mode (spec A.3.1): detached = the paper's filter, double_backprop = "
           "exact eq. 7, gradient_step = first-order surrogate", ("detached", "double_backprop", "gradient_step")),
    Option("k_min", float, 0.2, "GAPSL's smallest leader fraction K_min (eq. 2), in (0, 1]", unit="fraction", low=0,
           low_open=True, high=1),
    Option("k_max", float, 0.8, "GAPSL's largest leader fraction K_max (eq. 2), in [K_min, 1]", unit="fraction", low=0,
           high=1),
    Option("eta_th", float, 0.5, "GAPSL's threshold sensitivity η_th of eq. 6 (≥ 0)", low=0),
    Option("gda_lambda", float, 5e-4, "GAPSL's GDA coefficient λ of eq. 7 (≥ 0)", low=0),
    Option("excluded_update", str, "plain", "what devices outside GAPSL's aligned set get: plain (their own cut "
           "gradient, §III-A: the server sends all generated gradients) or none (no update, eq. 8 read literally)",
           ("plain", "none")),
    Option("server_step", str, "mean", "how GAPSL's server step weighs the aligned devices' terms of eq. 8: mean "
           "(|D_i|-weighted over the aligned set, PSL's rule, so that one server rate means one step size) or sum "
           "(eq. 8 literally)", ("mean", "sum")),
    Option("leader", str, "lgi", "GAPSL's leader gradient: lgi (eqs. 1-3), all (Non-LGI, the paper's Fig. 20 "
           "ablation: the mean of every device's) or random (Rand-LGI: a random subset of the same size)",
           ("lgi", "all", "random")),
    Option("horizon", int, 0, "GAPSL's T of eq. 2 (K^t grows with t/T), in rounds; 0 = the run's --rounds (a run "
           "that is the first part of a longer one gives the longer one's)", unit="rounds", low=0),
)
SCALA_OPTIONS = (
    PARTICIPATION.with_default(0.1), LA_TAU,
    Option("server_prior", str, "batch", "SCALA's server prior P_s: batch = labels of the concatenated batch, round = "
           "the participants' label counts", ("batch", "round")),
)
CYCLESL_OPTIONS = (
    PARTICIPATION.with_default(0.05),
    Option("cycle_base", str, "psl", "the algorithm CycleSL wraps: psl (CyclePSL), sfl (CycleSFL: |D_i|-weighted "
           "FedAvg broadcast to all devices, CSL-7) or sglr (CycleSGLR: a random half of the participants gets one "
           "averaged gradient row, CSL-8)", ("psl", "sfl", "sglr")),
    Option("server_epochs", int, 1, "CycleSL's server epochs E over the pooled features (CSL-4), ≥ 1", unit="epochs"),
    Option("server_phase", str, "epochs", "CycleSL's server phase: epochs = E reshuffled passes (the authors' code), "
           "steps = E single resampled mini-batches (Algorithm 1 literally)", ("epochs", "steps")),
    Option("sample_weight", str, "data_size", "CycleSL's server-loss sample weights (CSL-3)", ("data_size", "uniform")),
)
FEDLC_OPTIONS = (
    PARTICIPATION.with_default(0.1),
    Option("lc_tau", float, 1.0, "FedLC's calibration strength τ: the logit of class y is lowered by τ·n_y^(-1/4), n_y "
           "the device's samples of y (≥ 0; 0 = FedAvg)", low=0),
)
FEDPROX_OPTIONS = (
    PARTICIPATION.with_default(0.1),
    Option("prox_mu", float, 1.0, "FedProx's proximal coefficient μ: each local step adds μ(w − w^t), w^t the global "
           "model the device downloaded (≥ 0; 0 = FedAvg)", low=0),
)
LLA_SFL_OPTIONS = (PARTICIPATION.with_default(0.1), LA_TAU)
FEDCONCAT_OPTIONS = (
    PARTICIPATION.with_default(0.1),
    Option("clusters", int, 5, "FedConcat's clusters K: K-means of the devices' label distributions, one model per "
           "cluster, K encoders concatenated (its code's n_clusters)", unit="clusters", low=1, high=64),
    Option("encoder_rounds", int, 50, "FedConcat's first stage: global rounds of FedAvg within each cluster before "
           "the encoders are frozen and concatenated; the rest of --rounds trains the classifier (its code's "
           "encoder_round)", unit="global rounds"),
)
S2FL_OPTIONS = (
    PARTICIPATION.with_default(0.5),
    Option("groups", int, 2, "S²FL's activation groups G: the participants split into G label-balanced groups, the "
           "server stepping on the mean of their gradients (GAS's authors' code: 2)", unit="groups", low=1, high=64),
)
SGLR_OPTIONS = (
    PARTICIPATION.with_default(0.05),
    Option("averaged_fraction", float, 0.5, "the share φ of SGLR's participants that receive the one averaged "
           "cut-gradient row (CSL-8): 0.5 as in CycleSL's SGLR baseline, 1 = every participant (SGLR's broadcast)",
           unit="fraction of the participants", low=0, low_open=True, high=1),
)
ACTIVE = Option("active", int, 0, "an asynchronous algorithm's active devices C (capped at --devices); 0 = half the "
                "devices, ⌈N/2⌉ (GAS's 10 of 20)", unit="devices", low=0, high=MAX_DEVICES)
LOCAL_STEPS = Option("local_steps", int, 20, "an asynchronous algorithm's local iterations E per participation, ≥ 1 "
                     "(GAS's 20)", unit="rounds")
GAS_OPTIONS = (
    LA_TAU,
    ACTIVE,
    LOCAL_STEPS,
    Option("buffer", int, 0, "GAS's activation buffer Q_s in mini-batches (0 = C, the paper's choice)",
           unit="mini-batches", low=0),
    Option("generation", str, "on", "GAS's generated activations (off = asynchronous SFL without them, the ablation)",
           ("on", "off")),
    Option("covariance", str, "diag", "GAS's per-label Gaussian: diag or full covariance (GAS-5)", ("diag", "full")),
)

# ---- the papers' training defaults ----------------------------------------------------------------------------
_PSL_FAMILY: dict[str, Any] = dict(optimizer="sgd", lr=0.01, client_lr=0.005, server_lr=0.01, momentum=0.9,
                                   weight_decay=0.0, clip_norm=None, interval=None)
_SCALA_CODE: dict[str, Any] = dict(optimizer="sgd", lr=0.01, client_lr=0.01, server_lr=0.01, momentum=0.9,
                                   weight_decay=5e-4, clip_norm=10.0)
_CYCLESL_ADAM: dict[str, Any] = dict(optimizer="adam", lr=1e-3, client_lr=1e-3, server_lr=1e-3, momentum=0.0,
                                     weight_decay=0.0, clip_norm=None, interval=None)
_SPLITFED = TrainingDefaults(**_SCALA_CODE, interval=None, source="SCALA's paper, its SplitFedV1/SplitFedV2 baselines "
                             "(§5.1: SGD, learning rate 0.01); its code: momentum 0.9, weight decay 5e-4, clipping at "
                             "10; aggregation every round (SplitFed's I = 1)")

_SCALA_BASELINE = TrainingDefaults(**_SCALA_CODE, interval=20, source="SCALA's paper, its baselines share its setting "
                                   "(§5.1: SGD 0.01, I = 20 local iterations, ρ = 0.1); its code: momentum 0.9, weight "
                                   "decay 5e-4, clipping at 10")

_GAS_SETTING = TrainingDefaults(**_SCALA_CODE, interval=None, source="GAS's paper: lr 0.01, E = 20 local iterations, "
                                "C = 10 of 20 clients active, its baselines in its setting; its code: SGD momentum 0.9, "
                                "weight decay 5e-4, clipping at 10")

SERVER_COPIES = Option("server_copies", str, "device", "SplitFed V1's server-side copies: device (one per device, "
                       "trained and averaged when it is drawn) or slot (one per participant slot of the round, each "
                       "filled every aggregation period: the CycleSL authors' code)", ("device", "slot"))

# ---- the registry ---------------------------------------------------------------------------------------------
REGISTRY: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("sl", "trainers.strategies.sl:SL", "vanilla split learning: one client model handed from device to "
              "device", TrainingDefaults(**_PSL_FAMILY, source="GAPSL's paper, its vanilla-SL baseline "
                                         "(VGG-16/CIFAR-10): SGD, momentum 0.9, client 0.005, server 0.01"),
              one_client_model=True, labels_on_device=True),
    Algorithm("psl", "trainers.strategies.psl:PSL", "parallel split learning: per-device client models, one server "
              "model stepped on the |D_i|-weighted mean loss", TrainingDefaults(
                  **_PSL_FAMILY, source="GAPSL's paper, its PSL baseline: SGD, momentum 0.9, client 0.005, server 0.01"),
              (PARTICIPATION,), labels_on_device=True),
    Algorithm("sfl-v1", "trainers.strategies.sfl:SFLV1", "SplitFed V1: a server copy per device, client and server "
              "copies FedAvg'd every I rounds", _SPLITFED, (PARTICIPATION, SERVER_COPIES), labels_on_device=True),
    Algorithm("sfl-v2", "trainers.strategies.sfl:SFLV2", "SplitFed V2: one server model stepped per device in "
              "arrival order, client models FedAvg'd", _SPLITFED, (PARTICIPATION,), labels_on_device=True),
    Algorithm("adaptsfl", "trainers.strategies.adaptsfl:AdaptSFL", "AdaptSFL: per-device cuts, the planner's "
              "aggregation interval I", TrainingDefaults(
                  optimizer="sgd", lr=0.05, client_lr=0.05, server_lr=0.05, momentum=0.9, weight_decay=0.0,
                  clip_norm=None, interval=None,
                  source="AdaptSFL's paper: b = 16 (§VII-A); its learning rate is lost from the text, so SGD 0.05 with "
                         "momentum 0.9 is the project's tested value, from none of the papers"),
              (PARTICIPATION,), planned_interval=True, labels_on_device=True),
    Algorithm("gapsl", "trainers.strategies.gapsl:GAPSL", "GAPSL: leader gradient identification and gradient "
              "direction alignment on the server", TrainingDefaults(
                  **_PSL_FAMILY, source="GAPSL's paper (VGG-16/CIFAR-10): SGD, momentum 0.9, client 0.005, server "
                                        "0.01; the server steps on the sum over the aligned devices (eq. 8)"),
              GAPSL_OPTIONS),
    Algorithm("scala", "trainers.strategies.scala:SCALA", "SCALA: concatenated activations and logit adjustment on "
              "both sides", TrainingDefaults(**_SCALA_CODE, interval=20, source="SCALA's paper: SGD 0.01, I = 20 local "
                                             "iterations, ρ = 0.1; its code: momentum 0.9, weight decay 5e-4, clipping "
                                             "at 10 on both sides"),
              SCALA_OPTIONS, allows_absence=True),
    Algorithm("cyclesl", "trainers.strategies.cyclesl:CycleSL", "CycleSL: the server trains on the pooled features, "
              "then returns the clients' gradients", TrainingDefaults(
                  **_CYCLESL_ADAM, source="CycleSL's paper: Adam on both sides with one learning rate, 5% attendance; 1e-3 from its grid "
                         "{1e-5..1e-1} (spec A.9's CPU-scale value)"),
              CYCLESL_OPTIONS, allows_absence=True),
    Algorithm("gas", "trainers.strategies.gas:GAS", "GAS: asynchronous SFL with generated activations for the "
              "stragglers' labels", _GAS_SETTING, GAS_OPTIONS, allows_absence=True, active_option="active",
              local_rounds_option="local_steps"),
    Algorithm("sglr", "trainers.strategies.sglr:SGLR", "SGLR: PSL whose server returns one averaged cut-layer "
              "gradient to a share of the participants", TrainingDefaults(
                  **_CYCLESL_ADAM, source="CycleSL's paper, its SGLR baseline: Adam with one rate for clients and server (its set-up and "
                         "Table 10), 5% attendance; SGLR's own rate per side is --client-lr/--server-lr"),
              SGLR_OPTIONS),
    Algorithm("fedavg", "trainers.strategies.fedavg:FedAvg", "FedAvg: federated learning, the whole model on every "
              "device, averaged every I local steps (no split)", _SCALA_BASELINE, (PARTICIPATION.with_default(0.1),),
              whole_model=True),
    Algorithm("fedprox", "trainers.strategies.fedprox:FedProx", "FedProx: FedAvg whose local steps are pulled "
              "towards the downloaded global model by μ/2·‖w − w^t‖² (no split)", _SCALA_BASELINE, FEDPROX_OPTIONS,
              whole_model=True),
    Algorithm("fedlc", "trainers.strategies.fedlc:FedLC", "FedLC: FedAvg whose devices train on logits calibrated "
              "by their label counts (no split)", _SCALA_BASELINE, FEDLC_OPTIONS, whole_model=True),
    Algorithm("fedbuff", "trainers.strategies.fedbuff:FedBuff", "FedBuff: asynchronous federated learning, C devices "
              "training the whole model, every C finished models averaged (no split)", _GAS_SETTING,
              (ACTIVE, LOCAL_STEPS), allows_absence=True, active_option="active", local_rounds_option="local_steps",
              whole_model=True),
    Algorithm("ca2fl", "trainers.strategies.ca2fl:CA2FL", "CA²FL: FedBuff's asynchronous loop whose server steps "
              "by every device's cached update, weighted by its data share (no split)", _GAS_SETTING,
              (ACTIVE, LOCAL_STEPS), allows_absence=True, active_option="active", local_rounds_option="local_steps",
              whole_model=True),
    Algorithm("minibatch-sfl", "trainers.strategies.minibatch_sfl:MiniBatchSFL", "MiniBatch-SFL: the server steps on "
              "the participants' concatenated activations, plain cross-entropy on both sides", TrainingDefaults(
                  **_SCALA_CODE, interval=20, source="GAS's paper, its SFL baseline in its setting (lr 0.01, E = 20 local "
                  "iterations, 10 of 20 clients); its authors' code: SGD momentum 0.9, weight decay 5e-4, clipping at "
                  "10"), (PARTICIPATION.with_default(0.5),), allows_absence=True),
    Algorithm("s2fl", "trainers.strategies.s2fl:S2FL", "S²FL: MiniBatch-SFL whose server steps on the mean of its "
              "label-balanced activation groups' gradients", TrainingDefaults(
                  **_SCALA_CODE, interval=20, source="GAS's paper, its synchronous SFL baseline in its setting (lr 0.01, "
                  "E = 20 local iterations, 10 of 20 clients); its authors' baseline/S2FL.py: SGD momentum 0.9, weight "
                  "decay 5e-4, clipping at 10, 2 groups"), S2FL_OPTIONS, allows_absence=True),
    Algorithm("fedconcat", "trainers.strategies.fedconcat:FedConcat", "FedConcat: FedAvg within K clusters of "
              "devices by label distribution, then a classifier over their K frozen encoders side by side (no split)",
              _SCALA_BASELINE, FEDCONCAT_OPTIONS, whole_model=True),
    Algorithm("lla-sfl", "trainers.strategies.lla_sfl:LLASFL", "LLA-SFL: SplitFed V1 with each device's loss "
              "logit-adjusted by its own label distribution (SCALA's ablation)", _SCALA_BASELINE, LLA_SFL_OPTIONS),
)}

ALGORITHMS: tuple[str, ...] = tuple(REGISTRY)
"""Valid values of ``--algorithm``, in the registry's order."""
ALGORITHM_DEFAULTS: dict[str, TrainingDefaults] = {a.name: a.defaults for a in REGISTRY.values()}


def _flag_table() -> tuple[AlgorithmOption, ...]:
    """One :class:`AlgorithmOption` per option name, in the order the algorithms first list them; its default is
    the first algorithm's, the others' where they differ."""
    seen: dict[str, list[tuple[str, Option]]] = {}
    for algorithm in REGISTRY.values():
        for option in algorithm.options:
            seen.setdefault(option.name, []).append((algorithm.name, option))
    table = []
    for name, uses in seen.items():
        first = uses[0][1]
        if any(o.type is not first.type or o.choices != first.choices or o.help != first.help for _, o in uses):
            raise AssertionError(f"option {name!r} is declared twice with different meanings")   # pragma: no cover
        table.append(AlgorithmOption(name, tuple(a for a, _ in uses), first.type, first.default, first.help,
                                     first.choices, tuple((a, o.default) for a, o in uses if o.default != first.default),
                                     first.unit))
    return tuple(table)


ALGORITHM_OPTIONS: tuple[AlgorithmOption, ...] = _flag_table()
OPTION_BY_NAME = {o.name: o for o in ALGORITHM_OPTIONS}


def algorithm(name: str) -> Algorithm:
    """The registry's entry ``name``; an unknown name is an InputError naming ``--algorithm`` and the valid ones."""
    return REGISTRY[check_choice(name, ALGORITHMS, "algorithm")]


def algorithm_options(name: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The options of algorithm ``name``: its defaults overridden by ``extra``. An option of another
    algorithm, an unknown name or a value outside the option's choices or limits is an InputError naming its flag."""
    for key in extra:
        row = OPTION_BY_NAME.get(key)
        if row is None:
            raise InputError(f"unknown option {key!r}; valid: {', '.join(OPTION_BY_NAME)}", field="extra")
        if name not in row.algorithms:
            raise InputError(f"applies to {', '.join(row.algorithms)}, not --algorithm {name}", field=row.flag)
    out = {}
    for option in algorithm(name).options:
        value = extra.get(option.name, option.default)
        option.check(value)
        out[option.name] = value
    return out
