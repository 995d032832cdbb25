"""TrainConfig's ranges at their edges, written from README "Input limits" (training --lr in (0, 10⁶],
--momentum in [0, 1), --weight-decay in [0, 1], --noise-cv 0..1, seeds 0..2³²−1, devices ≤ 10,000,
batch size ≤ 10⁶) and the TrainConfig docstring (fractions in (0, 1], counts ≥ 1, cuts per device)."""

from __future__ import annotations

import pytest

from adaptplan.errors import InputError
from trainers.algorithms import REGISTRY
from trainers.config.train_config import TrainConfig

BASE = dict(dataset="synthetic", devices=4)

EDGES = [  # field, largest/smallest value accepted, nearest value refused
    ("lr", 1e6, 1000000.5), ("lr", 1e-300, 0.0),
    ("momentum", 0.0, -1e-9), ("momentum", 0.999999, 1.0),
    ("weight_decay", 0.0, -1e-9), ("weight_decay", 1.0, 1.0000001),
    ("noise_cv", 0.0, -1e-9), ("noise_cv", 1.0, 1.0000001),
    ("dirichlet_alpha", 1e6, 1000000.5), ("dirichlet_alpha", 1e-300, 0.0),
    ("target_accuracy", 1.0, 1.0000001), ("target_accuracy", 1e-9, 0.0),
    ("seed", 0, -1), ("seed", 2**32 - 1, 2**32), ("system_seed", 2**32 - 1, 2**32),
    ("devices", 10_000, 10_001), ("devices", 1, 0),
    ("batch_size", 10**6, 10**6 + 1), ("batch_size", 1, 0),
    ("rounds", 10**9, 10**9 + 1), ("eval_every", 1, 0), ("eval_batch_size", 1, 0),
    ("interval", 1, 0), ("interval", 10**12, 10**12 + 1), ("replan_every", 1, 0), ("checkpoint_every", 1, 0),
    ("max_test_samples", 1, 0), ("threads", 1024, 1025), ("model_width", 4096, 4097),
    ("clip_norm", 1e-30, -1e-9), ("clip_norm", 0.0, -1e-9), ("client_lr", 1e-300, 0.0), ("server_lr", 1e6, 1000000.5),
    ("flops_scale", 1e-30, 0.0), ("bandwidth_scale", 1e-30, 0.0),
]


@pytest.mark.parametrize("field, good, bad", EDGES)
def test_numeric_options_at_their_edges(field, good, bad) -> None:
    assert TrainConfig.flat(**{**BASE, field: good}).value(field) == good
    with pytest.raises(InputError) as info:
        TrainConfig.flat(**{**BASE, field: bad})
    assert info.value.field == field


def test_optional_options_may_be_absent() -> None:
    config = TrainConfig.flat(**BASE)
    assert (config.plan.interval, config.plan.replan_every, config.run.checkpoint_every, config.run.max_test_samples, config.execution.threads,
            config.run.target_accuracy, config.plan.cuts) == (None,) * 7
    assert config.optim.clip_norm == 0                 # AdaptSFL's default: no clipping (0 = off)


def test_cuts_are_one_per_device_or_one_for_all() -> None:
    assert TrainConfig.flat(**BASE, cuts=(3,)).plan.cuts == (3, 3, 3, 3)
    assert TrainConfig.flat(**BASE, cuts=(1, 2, 3, 4)).plan.cuts == (1, 2, 3, 4)
    for cuts in ((1, 2), (1, 2, 3, 4, 5)):
        with pytest.raises(InputError, match=f"need 1 or 4 cut indices .*got {len(cuts)}") as info:
            TrainConfig.flat(**BASE, cuts=cuts)
        assert info.value.field == "cuts"
    with pytest.raises(InputError) as info:
        TrainConfig.flat(**BASE, cuts=(2, 0, 2, 2))
    assert info.value.field == "cuts[1]"
    with pytest.raises(InputError, match="either a plan file or explicit cuts") as info:
        TrainConfig.flat(**BASE, cuts=(2,), plan_path="plan.json")


def test_json_round_trip_and_unknown_keys() -> None:
    config = TrainConfig.flat(**BASE, cuts=(2,), extra={"participation": 0.5}, algorithm="psl")
    data = config.to_json()
    assert data["cuts"] == [2, 2, 2, 2]                      # a list in JSON
    assert TrainConfig.from_json(data) == config
    with pytest.raises(InputError, match=r"unknown key\(s\) \['colour'\]") as info:
        TrainConfig.from_json({**data, "colour": "red"})
    assert info.value.field == "config"


def test_algorithm_option_defaults_are_the_strategies_and_the_specs() -> None:
    """The CLI's defaults (trainers.config.train_config.ALGORITHM_OPTIONS) are the strategy classes' own defaults, so a run
    from the command line and one from Python agree; and the spec values of docs/algorithms.md (τ = 1 for SCALA's
    and GAS's logit adjustment, B.3 and GAS-9; GAPSL's K_min 0.2, K_max 0.8)."""
    import inspect

    from trainers.config.train_config import ALGORITHM_OPTIONS, OPTION_BY_NAME
    from trainers.strategies import STRATEGIES

    for option in ALGORITHM_OPTIONS:
        for algorithm in option.algorithms:
            parameter = inspect.signature(STRATEGIES[algorithm].__init__).parameters[option.name]
            assert parameter.default == option.default_for(algorithm), (option.name, algorithm)
    assert OPTION_BY_NAME["la_tau"].default == 1.0
    participation = OPTION_BY_NAME["participation"]
    assert (participation.default_for("scala"), participation.default_for("cyclesl"), participation.default_for("psl")) \
        == (0.1, 0.05, 1.0)                                          # SCALA's ρ = 10%, CycleSL's 5% attendance
    assert (OPTION_BY_NAME["local_steps"].default_for("gas"), OPTION_BY_NAME["active"].default_for("gas")) == (20, 0)
    assert (OPTION_BY_NAME["k_min"].default, OPTION_BY_NAME["k_max"].default) == (0.2, 0.8)


def test_unknown_algorithm_is_refused_by_the_config() -> None:
    with pytest.raises(InputError, match="unknown value 'splitfed'; valid: sl, psl, sfl-v1") as info:
        TrainConfig.flat(**BASE, algorithm="splitfed")
    assert info.value.field == "algorithm"


def test_each_algorithm_trains_with_its_papers_settings_unless_told() -> None:
    """docs/algorithms.md "Defaults": the papers' optimizer, per-role rates, decay, clipping and interval."""
    from trainers.config.train_config import ALGORITHM_DEFAULTS

    base = {k: v for k, v in BASE.items() if k not in ("lr", "momentum", "weight_decay", "optimizer", "clip_norm")}
    gapsl = TrainConfig.flat(**base, algorithm="gapsl")
    assert (gapsl.optim.optimizer, gapsl.optim.client_lr, gapsl.optim.server_lr, gapsl.optim.momentum) == ("sgd", 0.005, 0.01, 0.9)
    assert gapsl.optim.lr == 0.01 and gapsl.optim.clip_norm == 0                 # the planner's γ; no clipping
    scala = TrainConfig.flat(**base, algorithm="scala", cuts=(2,))
    assert (scala.optim.client_lr, scala.optim.server_lr, scala.optim.weight_decay, scala.optim.clip_norm, scala.plan.interval) == \
        (0.01, 0.01, 5e-4, 10.0, 20)
    cyclesl = TrainConfig.flat(**base, algorithm="cyclesl")
    assert (cyclesl.optim.optimizer, cyclesl.optim.client_lr, cyclesl.optim.server_lr) == ("adam", 1e-3, 1e-3)
    adaptsfl = TrainConfig.flat(**base, algorithm="adaptsfl")
    assert (adaptsfl.optim.lr, adaptsfl.optim.momentum, adaptsfl.plan.interval) == (0.05, 0.9, None)   # I: the plan's
    assert (adaptsfl.optim.optimizer, adaptsfl.optim.client_lr, adaptsfl.optim.server_lr, adaptsfl.optim.weight_decay, adaptsfl.optim.clip_norm) == \
        ("sgd", 0.05, 0.05, 0.0, 0.0)
    for splitfed in ("sfl-v1", "sfl-v2"):                             # SCALA's SplitFedV1/V2 baselines (§5.1, its code)
        c = TrainConfig.flat(**base, algorithm=splitfed)
        o = c.optim
        assert (o.optimizer, o.client_lr, o.server_lr, o.momentum, o.weight_decay, o.clip_norm, c.plan.interval) == \
            ("sgd", 0.01, 0.01, 0.9, 5e-4, 10.0, None)
        assert "SCALA" in ALGORITHM_DEFAULTS[splitfed].source
    for psl_family in ("sl", "psl"):                                  # GAPSL's baselines: its own rates
        c = TrainConfig.flat(**base, algorithm=psl_family)
        assert (c.optim.client_lr, c.optim.server_lr, c.optim.momentum) == (0.005, 0.01, 0.9)
    gas = TrainConfig.flat(**base, algorithm="gas")
    g = gas.optim
    assert (g.client_lr, g.server_lr, g.momentum, g.weight_decay, g.clip_norm) == (0.01, 0.01, 0.9, 5e-4, 10.0)
    sglr = TrainConfig.flat(**base, algorithm="sglr")              # CycleSL's SGLR baseline: its one Adam rate
    assert (sglr.optim.client_optimizer, sglr.optim.server_optimizer, sglr.optim.client_lr, sglr.optim.server_lr) == ("adam", "adam", 1e-3, 1e-3)
    assert set(ALGORITHM_DEFAULTS) == set(REGISTRY)                   # every registered algorithm has defaults
    assert all(d.source for d in ALGORITHM_DEFAULTS.values())


def test_lr_sets_both_roles_and_each_role_its_own() -> None:
    base = {k: v for k, v in BASE.items() if k not in ("lr",)}
    both = TrainConfig.flat(**base, algorithm="gapsl", lr=0.02)
    assert (both.optim.client_lr, both.optim.server_lr) == (0.02, 0.02)
    one = TrainConfig.flat(**base, algorithm="gapsl", lr=0.02, server_lr=0.5)
    assert (one.optim.client_lr, one.optim.server_lr) == (0.02, 0.5)
    alone = TrainConfig.flat(**base, algorithm="gapsl", client_lr=0.3)
    assert (alone.optim.client_lr, alone.optim.server_lr) == (0.3, 0.01)        # the other role keeps the paper's
    spec_c, spec_s = one.optimizer_spec("client"), one.optimizer_spec("server")
    assert (spec_c.lr, spec_s.lr) == (0.02, 0.5)
    assert TrainConfig.from_json(one.to_json()) == one              # resolved values round-trip
    off = TrainConfig.flat(**{k: v for k, v in base.items() if k != "clip_norm"}, algorithm="gas", clip_norm=0)
    assert off.optimizer_spec("client").clip_norm is None             # --clip-norm 0 = no clipping
    for name in ("client_lr", "server_lr"):
        with pytest.raises(InputError) as info:
            TrainConfig.flat(**base, algorithm="psl", **{name: -1.0})
        assert info.value.field == name


def test_per_role_rates_reach_the_roles_optimizers() -> None:
    """A run's devices step with --client-lr (and --client-optimizer) and the edge server's instances with
    --server-lr (and --server-optimizer)."""
    import torch

    from trainers.run.driver import Trainer

    config = TrainConfig.flat(algorithm="psl", dataset="synthetic", model="mlp", devices=3, rounds=1, cuts=(1,),
                         client_lr=0.125, server_lr=0.75, server_optimizer="adam", progress=False)
    assert (config.optim.client_optimizer, config.optim.server_optimizer) == ("sgd", "adam")
    engine = Trainer(config).engine
    assert {d.optimizer.torch.param_groups[0]["lr"] for d in engine.devices} == {0.125}
    assert {o.torch.param_groups[0]["lr"] for o in engine.edge.optimizers.values()} == {0.75}
    assert all(type(d.optimizer.torch) is torch.optim.SGD for d in engine.devices)
    assert all(type(o.torch) is torch.optim.Adam for o in engine.edge.optimizers.values())
    with pytest.raises(InputError) as info:
        TrainConfig.flat(**BASE, client_optimizer="rmsprop")
    assert info.value.field == "client_optimizer"
