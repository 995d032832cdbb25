"""`adaptplan bench`'s options that a run's configuration declares come from that declaration (issue 68 item 3):
the limits, choices and help of `adaptplan train`'s field, each limit tested at its edge from the declaration
itself, not from the bench's code."""

from __future__ import annotations

import argparse

import pytest

from adaptplan.cli import build_parser
from adaptplan.cli.config_flags import _with_default, add_field
from trainers.algorithms import PARTICIPATION
from trainers.config.fields import described
from trainers.config.train_config import PARTS

# (bench command, its flag, the TrainConfig flat key or algorithm option it declares)
SHARED = [
    ("engine", "--batch-size", "batch_size"), ("engine", "--threads", "threads"), ("engine", "--rounds", "rounds"),
    ("algorithms", "--devices", "devices"), ("algorithms", "--seed", "seed"), ("algorithms", "--eval-every", "eval_every"),
    ("algorithms", "--test-samples", "max_test_samples"), ("algorithms", "--target-accuracy", "target_accuracy"),
    ("algorithms", "--lr", "lr"), ("algorithms", "--momentum", "momentum"), ("algorithms", "--clip-norm", "clip_norm"),
    ("algorithms", "--weight-decay", "weight_decay"), ("training", "--replan-every", "replan_every"),
    ("training", "--noise-cv", "noise_cv"), ("plans", "--alpha", "dirichlet_alpha"), ("plans", "--model-width", "model_width"),
    ("plans", "--rounds", "rounds"), ("papers", "--target-accuracy", "target_accuracy"),
]
FIELDS = {d.key: d for part in PARTS.values() for d in described(part)}


def _parse(command: str, flag: str, text: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", command, f"{flag}={text}"])


def _refused(command: str, flag: str, text: str, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        _parse(command, flag, text)
    assert info.value.code == 2
    return capsys.readouterr().err


def _edges(d) -> list[tuple[str, bool]]:
    """(value as text, accepted) just inside and just outside each declared limit of the field ``d``."""
    meta = d.meta
    if d.base == "int":
        low, high = d.int_limits
        return [(str(low), True), (str(low - 1), False), (str(high), True), (str(high + 1), False)]
    cases = []
    if meta.low is not None:
        cases += [(repr(meta.low), not meta.low_open), (repr(meta.low - 1e-9), False),
                  (repr(meta.low + 1e-9), True)]
    if meta.high is not None:
        cases += [(repr(meta.high), not meta.high_open), (repr(meta.high * (1 + 1e-9) + 1e-9), False)]
    return cases


@pytest.mark.parametrize("command, flag, key", SHARED, ids=[f"{c}{f}" for c, f, _ in SHARED])
def test_a_shared_flag_takes_the_fields_limits_at_their_edges(command, flag, key, capsys) -> None:
    d = FIELDS[key]
    assert _edges(d), key                   # every shared number declares a limit
    for text, accepted in _edges(d):
        if accepted:
            args = _parse(command, flag, text)
            value = next(v for k, v in vars(args).items() if k in (key, "alpha", "test_samples") and v is not None
                         and k == {"dirichlet_alpha": "alpha", "max_test_samples": "test_samples"}.get(key, key))
            assert value == (int(text) if d.base == "int" else float(text)), (flag, text)
        else:
            err = _refused(command, flag, text, capsys)
            assert f"argument {flag}: must be" in err and d.meta.unit in err, (flag, text, err)


def test_the_shared_flags_say_the_fields_help_and_the_benchs_default() -> None:
    parser = argparse.ArgumentParser()
    add_field(parser, "devices")
    add_field(parser, "rounds", default=600)
    add_field(parser, "eval_every", default=5)
    add_field(parser, "lr", default=None, shown="the comparison's")
    helps = {a.dest: (a.help, a.default) for a in parser._actions}
    assert helps["devices"] == ("number of devices N (default 20)", 20)
    assert helps["rounds"] == ("training rounds R (default 600)", 600)
    # the field's own parenthesis holds a second clause and a nested one: the whole of it is replaced
    assert helps["eval_every"] == ("evaluate on the test set every K rounds (default 5)", 5)
    assert helps["lr"] == ("learning rate γ of both roles, also the planner's γ (default the comparison's)", None)
    assert _with_default("a count", 3) == "a count (default 3)"            # none to replace: appended
    assert _with_default("x (default 0.5) and (y)", 0.25) == "x (default 0.25) and (y)"
    assert _with_default("a (default 1) or (default 2)", 3) == "a (default 3) or (default 2)"     # the first only


def test_an_algorithm_option_takes_the_registrys_limits(capsys) -> None:
    """--participation of the benches is the registry's option: (0, 1], open at 0."""
    assert (PARTICIPATION.low, PARTICIPATION.high, PARTICIPATION.low_open) == (0, 1, True)
    assert _parse("algorithms", "--participation", "1").participation == 1.0
    assert _parse("algorithms", "--participation", "1e-9").participation == 1e-9
    for text in ("0", "1.000001", "nan"):
        assert "argument --participation: must be" in _refused("algorithms", "--participation", text, capsys)
    assert _parse("algorithms", "--local-steps", "1").local_steps == 1
    assert "argument --local-steps: must be an integer in 1..1,000,000,000 rounds" in _refused(
        "algorithms", "--local-steps", "0", capsys)


def test_a_choice_field_keeps_its_choices(capsys) -> None:
    assert _parse("plans", "--partition", "dirichlet-equal").partition == "dirichlet-equal"
    assert "invalid choice: 'shard'" in _refused("plans", "--partition", "shard", capsys)
    assert _parse("algorithms", "--optimizer", "adam").optimizer == "adam"
    assert "invalid choice: 'rmsprop'" in _refused("algorithms", "--optimizer", "rmsprop", capsys)


def test_add_field_refuses_a_name_nothing_declares() -> None:
    with pytest.raises(KeyError, match="no configuration field or algorithm option named 'nope'"):
        add_field(argparse.ArgumentParser(), "nope")


def test_a_generated_flag_shows_its_own_name_or_the_declared_metavar() -> None:
    """train's --alpha (field dirichlet_alpha) reads ALPHA, not its key; --data-root its declared DIR."""
    text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert "--alpha ALPHA" in text and "DIRICHLET_ALPHA" not in text and "--data-root DIR" in text
