"""`adaptplan plan`: optimal cuts and aggregation interval (docs/formats.md "CLI contract")."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adaptplan.calibration import ROUNDS_LAWS
from adaptplan.cli.flags import float_flag, int_flag
from adaptplan.errors import InputError
from adaptplan.fileio import show
from adaptplan.limits import MAX_DEVICES, MAX_SEED

if TYPE_CHECKING:  # pragma: no cover
    from adaptplan.calibration import Calibration
    from adaptplan.constants import ConvergenceConstants
    from adaptplan.linear_rounds import RoundsLaw
    from adaptplan.model_profile import ModelProfile
    from adaptplan.system import SystemSpec


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "plan",
        help="compute the optimal cut per device and aggregation interval (AdaptSFL BCD)",
        description="Plan split federated learning with AdaptSFL's BCD (Theorem-2 interval step + Dinkelbach "
                    "MILFP split step). With no arguments: the built-in default scenario (VGG-16 on CIFAR-10, "
                    "20 generated devices, placeholder constants of docs/model.md §6.1). Prints a table; --json prints "
                    "the plan of docs/formats.md. Times are seconds.",
    )
    parser.add_argument("--profile", metavar="FILE", help="model profile JSON/TOML from `adaptplan profile` "
                        "(cumulative FLOPs per sample, bits per sample); default: shipped VGG-16/CIFAR-10 profile")
    parser.add_argument("--system", metavar="FILE", help="system JSON/TOML (FLOP/s, bit/s, batch size); "
                        "default: generated with --devices and --seed from the placeholder ranges")
    parser.add_argument("--system-from", metavar="RUN", help="the system fitted to what a run of processes measured "
                        "(the --out folder of train --distributed, with or without --emulate-links): per device FLOP/s "
                        "and link rates, the server's FLOP/s and its links, each the median over rounds of work the "
                        "latency model counted / seconds measured (docs/model.md §11); not with --system")
    parser.add_argument("--constants", metavar="FILE", help="training constants JSON/TOML (beta, gamma, theta, "
                        "epsilon, sigma2[], G2[]); default: placeholder constants of docs/model.md §6.1")
    parser.add_argument("--cuts", metavar="LIST", help="restrict candidate cut indices, comma-separated 1-based "
                        "(e.g. 1,2,5); default 1..L-1")
    parser.add_argument("--backend", choices=("highs", "cbc"), default="highs", help="MILP solver of the MS step (default highs)")
    parser.add_argument("--epsilon", type=float_flag(0.0, 1e6, low_open=True),
                        help="target ε of the placeholder constants (default 0.1, or twice the noise floor β·γ·Σσ²/N "
                             "where 0.1 is unreachable, as train uses); with --constants, set epsilon in the file")
    parser.add_argument("--devices", type=int_flag(1, MAX_DEVICES, "devices"), default=20,
                        help="number of generated devices when --system is not given (default 20)")
    parser.add_argument("--seed", type=int_flag(0, MAX_SEED), default=0, help="seed of the generated system when --system is not given (default 0)")
    parser.add_argument("--all-devices", action="store_true", help="list every device in the table "
                        "(default: the 20 slowest when there are more)")
    parser.add_argument("--pilots", metavar="RUN[,RUN...]",
                        help="plan for the setting of these finished runs (train --out folders, each trained with one "
                             "plan): its model profile and round-1 system, constants estimated from its model and data "
                             "and fitted to the rounds the pilots took to --target-accuracy (docs/model.md §10), so the "
                             "plan's rounds and seconds are to that accuracy; not with --profile, --system, --constants, "
                             "--epsilon")
    parser.add_argument("--target-accuracy", type=float_flag(0.0, 1.0, low_open=True), metavar="A",
                        help="with --pilots: the test accuracy (a fraction) the plan's rounds and seconds are to")
    parser.add_argument("--rounds-law", choices=ROUNDS_LAWS, default="eq15",
                        help="with --pilots, what they are fitted to: eq15 (eq. 15's constants, docs/model.md §10; "
                             "default), linear (R(I) = R1 (1 + kappa (I - 1)) at every cut, the latency-best cuts at "
                             "each I up to the pilots' longest, §12) or per-cut (R1 measured at each cut by a pilot at "
                             "I = 1, the plan as slow as its slowest cut: for a defence whose cost differs by cut)")
    parser.add_argument("--leakage-table", metavar="FILE", help="the model's leakage per cut, from `adaptplan profile "
                        "MODEL --leakage --leakage-out FILE` (docs/privacy.md); with --max-leakage")
    parser.add_argument("--max-leakage", metavar="METRIC=LIMIT", help="plan every device within this leakage budget: "
                        "dcor, norm_auc, direction_auc, psnr or ssim at most LIMIT, or mse at least LIMIT, per the "
                        "--leakage-table (cut L, the whole model on the device, is not admitted); METRIC=L0,L1,… gives "
                        "device i the i-th limit (one per device)")
    parser.add_argument("--defence", metavar="SETTING", help="plan for devices that defend their activations "
                        "(clip=C,noise=σ,nopeek=α, any of them; docs/privacy.md \"Defences\"): the defence's FLOPs per "
                        "sample are charged at each cut (eqs. 16, 21), at the system's batch size; with --leakage-table, "
                        "give a table measured under the same setting (profile --leakage-defence)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON (docs/formats.md) instead of a table")
    parser.add_argument("-o", "--output", metavar="FILE", help="also write the plan JSON to FILE")
    parser.set_defaults(func=run)


def parse_cuts(text: str) -> list[int]:
    """Parse ``--cuts`` ("1,2,5") into sorted unique 1-based indices (checked against the profile by
    :func:`check_candidates`)."""
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise InputError(f"must be comma-separated integers like 1,2,5, got {show(text)}", field="--cuts") from None
    if not values:
        raise InputError("must list at least one cut index", field="--cuts")
    return values


def check_candidates(candidates: list[int], num_cuts: int) -> list[int]:
    """``candidates`` if every index is a cut point 1..``num_cuts`` of the profile, else InputError naming ``--cuts``."""
    bad = [c for c in candidates if not 1 <= c <= num_cuts]
    if bad:
        raise InputError(f"cut index {show(bad[0])} is not a cut point of the profile (1..{num_cuts})", field="--cuts")
    return candidates


def load_instance(args: argparse.Namespace) -> tuple[ModelProfile, SystemSpec, ConvergenceConstants, str]:
    """(profile, system, constants, title) from the options, defaulting to the built-in scenario."""
    from dataclasses import replace

    from adaptplan.constants import ConvergenceConstants
    from adaptplan.model_profile import ModelProfile
    from adaptplan.scenarios import default_profile
    from adaptplan.system import SystemSpec, generate_system

    profile = ModelProfile.load(args.profile) if args.profile else default_profile()
    measured = measured_system(args)
    system = measured[0] if measured else SystemSpec.load(args.system) if args.system else generate_system(args.devices,
                                                                                                          args.seed)
    epsilon = getattr(args, "epsilon", None)
    if args.constants:
        if epsilon is not None:
            raise InputError("the constants file sets the target: change its epsilon (or drop --constants)",
                             field="--epsilon")
        constants = ConvergenceConstants.load(args.constants)
        what = args.constants
    else:   # the rule `train` uses: ε = 0.1, or twice the noise floor where 0.1 is unreachable (Corollary 1)
        placeholder = ConvergenceConstants.placeholder(profile.num_cuts)
        constants = ConvergenceConstants.training_placeholder(profile.num_cuts, placeholder.gamma, system.num_devices)
        what = "placeholder constants (docs/model.md §6.1, not the paper's)"
        if epsilon is not None:
            constants = replace(constants, epsilon=epsilon)
            what += f", target ε = {epsilon:g} (--epsilon)"
        elif constants.epsilon != placeholder.epsilon:
            what += f", target ε = {constants.epsilon:g}: twice the noise floor, 0.1 being unreachable with " \
                    f"{system.num_devices} devices (as train does; set it with --epsilon)"
    sources = [
        args.profile or "built-in VGG-16/CIFAR-10 profile",
        measured[1] if measured else args.system or f"{args.devices} generated devices (seed {args.seed}, placeholder "
                                                     "ranges)",
        what,
    ]
    return profile, system, constants, "Plan for " + "; ".join(sources)


def measured_system(args: argparse.Namespace) -> tuple[SystemSpec, str] | None:
    """(the system fitted to what ``--system-from`` RUN measured, how the title names it), or None without it."""
    if getattr(args, "system_from", None) is None:
        return None
    if args.system is not None:
        raise InputError("--system-from gives the system: drop --system (or --system-from)", field="--system")
    from adaptplan.measured_system import run_measured_system

    system, rates = run_measured_system(args.system_from)
    rounds = max((len(r) for r in rates.rates.values()), default=0)
    return system, (f"the system measured by {args.system_from} ({len(rates.rates)} rates, medians over up to "
                    f"{rounds} rounds; the rest as its round-1 system)")


def pilot_instance(args: argparse.Namespace) -> tuple[ModelProfile, SystemSpec, Calibration | RoundsLaw, str, str]:
    """(profile, system, the pilots' fit, title, what the rounds are to) of the pilots' setting (``--pilots``): a
    trainer built from the first pilot's configuration (nothing trained) estimates and calibrates the constants, or
    fits the rounds law linear in I (``--rounds-law linear``, or ``per-cut``: R₁ per cut)."""
    for flag in ("profile", "system", "constants", "epsilon"):
        if getattr(args, flag, None) is not None:
            raise InputError("the pilots' run gives the profile, system and constants; drop it", field=f"--{flag}")
    if args.target_accuracy is None:
        raise InputError("the pilots are fitted to the rounds they took to a test accuracy: give --target-accuracy A",
                         field="--pilots")
    from adaptplan.calibration import Calibration
    from trainers.config.train_config import TrainConfig, as_saved_run_trained
    from trainers.run.driver import Trainer
    from trainers.run.history import History

    folders = [part.strip() for part in args.pilots.split(",") if part.strip()]
    if not folders or not all((Path(f) / "history.json").is_file() for f in folders):
        missing = next((f for f in folders if not (Path(f) / "history.json").is_file()), args.pilots)
        raise InputError(f"{missing!r} holds no history.json: give the folders of finished runs (--out of adaptplan "
                         "train)", field="--pilots")
    saved = as_saved_run_trained(History.load(folders[0]).meta.get("config", {}))
    unplanned = {"rounds": 1, "cuts": None, "interval": None, "plan_path": None, "policy": None, "replan_every": None,
                 "reestimate": False, "constants_path": None, "pilots": ",".join(folders),
                 "target_accuracy": args.target_accuracy, "rounds_law": args.rounds_law, "out": None, "resume": False,
                 "overwrite": False,
                 "mlflow": None, "progress": False}
    trainer = Trainer(TrainConfig.from_json({**saved, **unplanned}))
    calibration = trainer.calibration
    assert calibration is not None, "pilots given"
    c = trainer.config
    fitted = ("constants estimated from its model and data, calibrated" if isinstance(calibration, Calibration)
              else f"rounds linear in I{' per cut' if args.rounds_law == 'per-cut' else ''} (docs/model.md §12), fitted")
    title = (f"Plan for {c.model.name} on {c.data.dataset}, {c.data.devices} devices ({c.data.partition}), lr {c.optim.lr:g}, "
             f"batch {c.data.batch_size}: the setting of {folders[0]}; its round-1 system; {fitted} on "
             f"{len(folders)} pilot{'s' if len(folders) > 1 else ''}: {calibration.message}")
    measured = measured_system(args)
    if measured is not None:
        title += f"; {measured[1]}"
    law = "Corollary 1 calibrated" if isinstance(calibration, Calibration) else \
        f"the rounds law linear in I{' per cut' if args.rounds_law == 'per-cut' else ''}"
    return trainer.profile, measured[0] if measured else trainer.clock.system(1), calibration, title, \
        f"to {args.target_accuracy:.1%} test accuracy, {law}"


def run(args: argparse.Namespace) -> int:
    from adaptplan.convergence import step_note
    from adaptplan.linear_rounds import ROUNDS_LAW_TYPES, as_plan
    from adaptplan.planner import Planner
    from adaptplan.report import DEVICE_ROWS, format_plan

    rounds_to = "Corollary 1"
    fit: Calibration | RoundsLaw | None = None
    if args.pilots is not None:
        profile, system, fit, title, rounds_to = pilot_instance(args)
    else:
        for flag, value, given in (("--target-accuracy", args.target_accuracy, args.target_accuracy is not None),
                                   ("--rounds-law", args.rounds_law, args.rounds_law != "eq15")):
            if given:
                raise InputError(f"{flag} {value} goes with pilot runs: add --pilots RUN[,RUN...] (a plan's rounds are "
                                 "to a test accuracy only when fitted to them)", field=flag)
        profile, system, constants, title = load_instance(args)
    candidates = check_candidates(parse_cuts(args.cuts), profile.num_cuts) if args.cuts else None
    setting = defence_setting(args)
    profile = setting.charged(profile, system.batch_size)
    candidates = head_candidates(candidates, profile.num_cuts, setting.head)
    leakage, weights = leakage_budget(args, profile, system.num_devices, setting.name)
    start = time.perf_counter()
    if isinstance(fit, ROUNDS_LAW_TYPES):
        plan = as_plan(fit.plan(profile, system, candidates=candidates, leakage=leakage), fit, profile, system)
    else:
        constants = fit.constants if fit is not None else constants
        plan = Planner(profile, system, constants, candidates=candidates, backend=args.backend, leakage=leakage).plan()
    elapsed = time.perf_counter() - start
    note = step_note(constants) if not isinstance(fit, ROUNDS_LAW_TYPES) else None
    if note:                                     # said once, about a plan that exists
        print(f"note: {note}", file=sys.stderr)
    if args.output:
        plan.save(args.output)
    if args.json:
        json.dump(plan.to_json(), sys.stdout, indent=2)
        print()
    else:
        print(format_plan(plan, profile, system, title=title, max_devices=None if args.all_devices else DEVICE_ROWS,
                          rounds_to=rounds_to))
        if leakage is not None:
            print(f"leakage budget: {args.max_leakage} per {args.leakage_table} ({weights} weights): every device "
                  f"within it (cuts {sorted(set(plan.cuts))} planned)")
            if not weights.startswith("worst of"):
                print("  the table holds for the model at those weights only: the activations of a run leak most "
                      "early in training (docs/privacy.md \"Leakage over the run\"); `train --leakage-out FILE "
                      "--leakage-every N` writes the worst over a run")
        print(f"\nplanned in {elapsed:.2f} s wall-clock")
    return 0


def defence_setting(args: argparse.Namespace) -> Any:
    """``--defence`` (none without it): a :class:`adaptplan.defence_cost.DefenceSetting` whose FLOPs the plan charges."""
    from adaptplan.defence_cost import DefenceSetting

    setting = DefenceSetting.parse(args.defence, "--defence") if args.defence else DefenceSetting()
    if setting.labels is not None:
        raise InputError("randomised labels cost nothing on the clock; give them to `train --label-epsilon`",
                         field="--defence")
    return setting


def head_candidates(candidates: list[int] | None, num_cuts: int, head: int) -> list[int] | None:
    """The cuts a plan may use under a U-shaped split of a ``head`` of K blocks (``--defence head=K``): ``--cuts``' or
    all, within 1..L−K−1 (:func:`adaptplan.defence_cost.head_cuts`); InputError naming ``--cuts`` when none is."""
    if not head:
        return candidates
    from adaptplan.defence_cost import head_cuts

    allowed = head_cuts(num_cuts, head)
    kept = [c for c in (candidates or allowed) if c in allowed]
    if not kept:
        raise InputError(f"a head of {head} blocks leaves the cuts 1..{allowed[-1]}; none of {candidates} is one of them",
                         field="--cuts")
    return kept


def leakage_budget(args: argparse.Namespace, profile: Any, num_devices: int, defence: str = "none") -> tuple[Any, str]:
    """The budget of ``--max-leakage`` over ``--leakage-table`` (both or neither; None without) and the weights the
    table was measured at; the table must have been measured under the plan's ``defence`` setting (its name;
    InputError naming ``--defence`` otherwise)."""
    from adaptplan.leakage_table import check_budget_pair

    check_budget_pair(args.leakage_table, args.max_leakage)
    if args.max_leakage is None:
        return None, ""
    from solvers.leakage_budget import LeakageBudget

    budget, table = LeakageBudget.from_table(args.leakage_table, args.max_leakage, profile, num_devices, defence,
                                             "--defence")
    return budget, table.weights
