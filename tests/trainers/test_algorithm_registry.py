"""The algorithm registry (trainers/algorithms.py): every table the CLI, the configuration and the runs read is
derived from it, so that an algorithm is one strategy file and one entry."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from adaptplan.benches.comparison import Setting
from adaptplan.errors import InputError
from adaptplan.limits import MAX_DEVICES
from trainers import algorithms
from trainers.algorithms import REGISTRY, Algorithm, Option, TrainingDefaults

DEFAULTS = TrainingDefaults("sgd", 0.1, 0.1, 0.1, 0.0, 0.0, None, None, "a test")


def test_the_strategy_table_and_each_strategys_name_follow_the_registry() -> None:
    from trainers.strategies import STRATEGIES, make_strategy

    assert tuple(STRATEGIES) == algorithms.ALGORITHMS == tuple(REGISTRY)
    for name, entry in REGISTRY.items():
        cls = entry.strategy_class()
        assert STRATEGIES[name] is cls and cls.name == name
        assert cls.allows_absence is entry.allows_absence          # the trait comes from the entry
        assert type(make_strategy(name)) is cls


def test_each_strategys_own_defaults_are_its_entrys() -> None:
    """A strategy built directly (a test, a script: ``GAS()``) has the defaults its registry entry declares (what the
    CLI and make_strategy give): every option of the entry is a parameter of the class with the same default, and
    the class takes no other option."""
    import inspect

    for name, entry in REGISTRY.items():
        parameters = inspect.signature(entry.strategy_class().__init__).parameters
        declared = {n: p.default for n, p in parameters.items() if n != "self"}
        assert declared == {o.name: o.default for o in entry.options}, name


def test_traits_of_the_papers() -> None:
    assert [n for n, a in REGISTRY.items() if a.one_client_model] == ["sl"]
    assert [n for n, a in REGISTRY.items() if a.planned_interval] == ["adaptsfl"]
    # the papers' sampling algorithms let a lost device go; the six that need every device of a round stop (a
    # baseline joins either side by its entry, e.g. FedBuff and MiniBatch-SFL, which sample as GAS and SCALA do)
    absent = {n for n, a in REGISTRY.items() if a.allows_absence}
    assert {"cyclesl", "gas", "scala"} <= absent and not {"sl", "psl", "sfl-v1", "sfl-v2", "adaptsfl", "gapsl", "sglr"} & absent


def test_the_flag_table_has_one_row_per_option_name_with_each_algorithms_default() -> None:
    rows = {o.name: o for o in algorithms.ALGORITHM_OPTIONS}
    assert len(rows) == len(algorithms.ALGORITHM_OPTIONS)
    p = rows["participation"]
    # the algorithms whose entries list it, in the registry's order (a new algorithm with it joins them) ...
    assert p.algorithms == tuple(name for name, entry in REGISTRY.items() if "participation" in entry.option_names)
    # ... among them the papers' (SL trains one device at a time; GAS counts its active devices with its own C)
    assert {"psl", "sfl-v1", "sfl-v2", "adaptsfl", "gapsl", "scala", "cyclesl", "sglr"} <= set(p.algorithms)
    assert not {"sl", "gas"} & set(p.algorithms)
    assert p.default == 1.0 and {"scala": 0.1, "cyclesl": 0.05, "sglr": 0.05}.items() <= dict(p.per_algorithm).items()
    assert p.default_for("cyclesl") == 0.05 and p.default_for("psl") == 1.0
    assert p.describe_default().startswith("1.0; scala 0.1; cyclesl 0.05; sglr 0.05")     # then later algorithms'
    assert rows["la_tau"].algorithms[:2] == ("scala", "gas") and rows["la_tau"].per_algorithm == ()
    for entry in REGISTRY.values():               # every option of every entry is in the table, under its flag
        for option in entry.options:
            assert entry.name in rows[option.name].algorithms
            assert rows[option.name].flag == "--" + option.name.replace("_", "-")


def test_algorithm_options_fill_defaults_and_name_the_flag_of_a_foreign_or_unknown_option() -> None:
    assert algorithms.algorithm_options("scala", {}) == {"participation": 0.1, "la_tau": 1.0, "server_prior": "batch"}
    assert algorithms.algorithm_options("sl", {}) == {}
    assert algorithms.algorithm_options("gas", {"active": 3})["active"] == 3
    with pytest.raises(InputError) as err:
        algorithms.algorithm_options("psl", {"la_tau": 2.0})
    users = ", ".join(n for n, entry in REGISTRY.items() if "la_tau" in entry.option_names)
    assert err.value.field == "--la-tau" and users.startswith("scala, gas")
    assert err.value.message == f"applies to {users}, not --algorithm psl"
    with pytest.raises(InputError) as err:
        algorithms.algorithm_options("psl", {"nope": 1})
    assert err.value.field == "extra"
    with pytest.raises(InputError) as err:
        algorithms.algorithm_options("scala", {"server_prior": "epoch"})
    assert err.value.field == "--server-prior" and "valid: batch, round" in err.value.message
    with pytest.raises(InputError) as err:
        algorithms.algorithm("fedsgd")
    assert err.value.field == "algorithm" and "valid: sl, psl," in err.value.message


def test_a_new_entry_reaches_the_flag_table_and_the_comparison_setting(monkeypatch) -> None:
    """What one registry entry gives an algorithm: its flags (a shared option keeps one row), its defaults, and
    the comparison's mapping of ρ and the local rounds onto its own options."""
    extra = Option("cohort", int, 2, "a test option", unit="devices")
    entry = Algorithm("toy", "trainers.strategies.psl:PSL", "a test entry", DEFAULTS,
                      (algorithms.PARTICIPATION.with_default(0.5), extra), active_option="cohort",
                      local_rounds_option=None)
    registry = {**REGISTRY, "toy": entry}
    monkeypatch.setattr(algorithms, "REGISTRY", registry)
    monkeypatch.setattr(algorithms, "ALGORITHMS", tuple(registry))
    table = {o.name: o for o in algorithms._flag_table()}
    assert table["participation"].algorithms[-1] == "toy" and table["participation"].default_for("toy") == 0.5
    assert table["cohort"].algorithms == ("toy",) and table["cohort"].unit == "devices"
    setting = Setting("sgd", 0.1, 0.1, 0.0, 0.0, 0.0, 16, 0.3, 4, 10)
    fields = setting.fields("toy", 10)
    assert fields["extra"] == {"cohort": 3} and fields["interval"] == 4      # ⌈0.3·10⌉ devices; I = 4


def test_the_registry_loads_without_torch() -> None:
    code = ("import sys; import trainers.algorithms as a; import trainers.config.train_config; "
            "assert 'torch' not in sys.modules, 'torch imported'; print(len(a.REGISTRY))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(len(REGISTRY))


# ---- the options' limits: declared once in the registry, checked from there ----------------------------------------
DOCUMENTED_LIMITS = {     # (low, high, low_open, high_open) as docs/algorithms.md and each option's help state them
    "participation": (0, 1, True, False),         # ρ in (0, 1]
    "la_tau": (0, None, False, False),            # τ ≥ 0 (SCALA eqs. 12–13, GAS-9)
    "k_min": (0, 1, True, False),                 # K_min in (0, 1] (GAPSL eq. 2)
    "k_max": (0, 1, False, False),                # K_max in [K_min, 1]: the lower end is the strategy's (K_min ≤ K_max)
    "eta_th": (0, None, False, False),            # η_th ≥ 0 (eq. 6)
    "gda_lambda": (0, None, False, False),        # λ ≥ 0 (eq. 7)
    "horizon": (0, None, False, False),           # T ≥ 0 rounds, 0 = the run's --rounds
    "server_epochs": (None, None, False, False),  # E ≥ 1 (an integer's default lower end)
    "averaged_fraction": (0, 1, True, False),     # φ in (0, 1]
    "active": (0, MAX_DEVICES, False, False),     # C ≥ 0, 0 = ⌈N/2⌉; at most the devices a run may have
    "local_steps": (None, None, False, False),    # E ≥ 1
    "buffer": (0, None, False, False),            # Q_s ≥ 0, 0 = C
}


def test_every_numeric_option_declares_the_documented_limits() -> None:
    numeric = {o.name: o for entry in REGISTRY.values() for o in entry.options if o.type in (int, float)}
    assert set(DOCUMENTED_LIMITS) <= set(numeric)
    for name, limits in DOCUMENTED_LIMITS.items():
        option = numeric[name]
        assert (option.low, option.high, option.low_open, option.high_open) == limits, name


def _edge_cases(option: Option) -> list[tuple[object, bool]]:
    """(value, accepted) at and just beyond each end of ``option``'s declared limits, written from the Option's
    documented defaults: an integer in 1..10⁹ (MAX_STEPS) unless declared, a number finite within ±10³⁰."""
    if option.type is int:
        low = 1 if option.low is None else int(option.low)
        high = 10**9 if option.high is None else int(option.high)
        return [(low, True), (low - 1, False), (high, True), (high + 1, False), (float(low), False), (True, False),
                (str(low), False)]
    low = -1e30 if option.low is None else float(option.low)
    high = 1e30 if option.high is None else float(option.high)
    return [(low, not option.low_open), (math.nextafter(low, -math.inf), False), (math.nextafter(low, math.inf), True),
            (high, not option.high_open), (math.nextafter(high, math.inf), False),
            (math.nextafter(high, -math.inf), True), (math.nan, False), (math.inf, False), ("0.5", False), (None, False)]


@pytest.mark.parametrize("name", algorithms.ALGORITHMS)
def test_every_numeric_option_is_taken_just_inside_its_limits_and_refused_just_outside(name: str) -> None:
    for option in REGISTRY[name].options:
        if option.type not in (int, float):
            continue
        for value, accepted in _edge_cases(option):
            if accepted:
                assert algorithms.algorithm_options(name, {option.name: value})[option.name] == value
            else:
                with pytest.raises(InputError) as info:
                    algorithms.algorithm_options(name, {option.name: value})
                assert info.value.field == option.flag, (option.name, value)


def test_a_whole_model_algorithm_trains_at_cut_l_whatever_cut_is_asked() -> None:
    assert [REGISTRY[n].cut_for(2, 11) for n in ("fedavg", "fedprox", "fedlc", "psl", "lla-sfl")] == [11, 11, 11, 2, 2]
    assert {n for n, entry in REGISTRY.items() if entry.cut_for(1, 5) == 5} == \
        {n for n, entry in REGISTRY.items() if entry.whole_model}
