"""What a checkpoint's state must be before a run continues from it (docs/formats.md "Checkpoint").

A checkpoint is checked like every other input file: every top-level field's type and range, and the
fields' agreement with each other — the configuration equals the one its history recorded, the history
holds exactly rounds 1..round, the input-file digests cover exactly the files the configuration names,
one partition per device — so an edited or mismatched checkpoint is refused with one message naming the
file, the field and the cause (:class:`~adaptplan.errors.InputError`, exit code 2), never carried into the
run or met later as an internal error. The engine's own state is checked against the engine it is loaded into
(:func:`trainers.engine.state_schema.check_engine_state`, called by
:meth:`trainers.engine.split_engine.SplitEngine.load_state_dict`; its ValueError is turned into the same kind of message).
"""

from __future__ import annotations

import re
import sys
from typing import Any

import torch

from adaptplan.errors import InputError
from adaptplan.fileio import is_finite_number, is_int, show
from adaptplan.limits import MAX_STEPS

REQUIRED = ("round", "engine", "torch_rng", "numpy_rng", "clock_seconds", "last_replan", "wall_seconds", "history",
            "config", "partitions", "inputs")
OPTIONAL = ("run_id", "cuda_rng", "local_test", "history_beside")   # absent from checkpoints written before them
INPUT_FILES = ("system", "plan", "constants")      # the `<name>_path` options whose digests a checkpoint keeps
_HEX = re.compile(r"[0-9a-f]+")
MAX_SECONDS = 1e12                                  # simulated or wall seconds of a run, far above any real one


def check_state(state: dict[str, Any], where: str) -> None:
    """Raise InputError (field ``--resume``) naming ``where``, the field and the cause unless ``state`` is a
    well-formed checkpoint state (module docstring)."""

    def refuse(field: str, cause: str) -> InputError:
        return InputError(f"the checkpoint {where} is not a valid run state: {field}: {cause}; start the run again "
                          "with --overwrite", field="--resume")

    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise InputError(f"the checkpoint {where} lacks {missing}; start the run again with --overwrite",
                         field="--resume")
    unknown = sorted(str(k)[:40] for k in state if k not in REQUIRED + OPTIONAL)
    if unknown:
        raise refuse(unknown[0], "unknown field")
    round_index = state["round"]
    if not is_int(round_index) or not 0 <= round_index <= MAX_STEPS:
        raise refuse("round", f"must be an integer in [0, {MAX_STEPS}], got {show(round_index)}")
    for name in ("clock_seconds", "wall_seconds"):
        value = state[name]
        if not is_finite_number(value) or not 0 <= value <= MAX_SECONDS:
            raise refuse(name, f"must be a finite number of seconds in [0, {MAX_SECONDS:g}], got {show(value)}")
    if not is_int(state["last_replan"]) or not 0 <= state["last_replan"] <= round_index:
        raise refuse("last_replan", f"must be an integer in [0, round = {round_index}], got {show(state['last_replan'])}")
    config = state["config"]
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise refuse("config", f"must be an object of run options, got {type(config).__name__}")
    history = state["history"]
    if not isinstance(history, dict) or not isinstance(history.get("meta"), dict):
        raise refuse("history", "must be a run history with its meta")
    for name, options in (("config", config), ("history.meta.config", history["meta"].get("config"))):
        if not _plain(options):             # compared below: a tensor's truth value would raise
            raise refuse(name, "must hold only JSON values (numbers, text, true/false, null, lists, objects)")
    if history["meta"].get("config") != config:
        raise refuse("config", "differs from the configuration its history recorded")
    records = history.get("records")
    rounds = [r.get("round") if isinstance(r, dict) else None for r in records] if isinstance(records, list) else None
    # the length first: a checkpoint claiming round 10⁹ must not build a list of 10⁹ rounds to be refused
    if rounds is None or len(rounds) != round_index or rounds != list(range(1, round_index + 1)):
        raise refuse("history.records", f"must hold exactly rounds 1..{round_index} (the checkpoint's round)")
    _check_inputs(state["inputs"], config, refuse)
    fraction = config.get("local_test_fraction", 0.0)    # absent from configurations saved before it: no split
    if "local_test" not in state and fraction != 0.0:
        raise refuse("local_test", f"missing, although the run holds out {show(fraction)} of each device's samples")
    _check_partitions({k: state[k] for k in ("partitions", "local_test") if k in state}, config, refuse)
    _check_rngs(state, refuse)
    if "history_beside" in state and state["history_beside"] is not True:
        raise refuse("history_beside", f"must be true (the history is written beside the checkpoint), got "
                                       f"{show(state['history_beside'])}")
    run_id = state.get("run_id")
    if run_id is not None and not (isinstance(run_id, str) and len(run_id) == 32 and _HEX.fullmatch(run_id)):
        raise refuse("run_id", f"must be 32 hexadecimal digits, got {show(run_id)}")
    if not isinstance(state["engine"], dict):
        raise refuse("engine", f"must be an object, got {type(state['engine']).__name__}")


def _check_inputs(inputs: Any, config: dict[str, Any], refuse) -> None:
    if not isinstance(inputs, dict):
        raise refuse("inputs", f"must be an object of file digests, got {type(inputs).__name__}")
    named = {name for name in INPUT_FILES if config.get(f"{name}_path")}
    if set(inputs) != named:
        raise refuse("inputs", f"must hold the SHA-256 of exactly the files the run names ({sorted(named) or 'none'}), "
                               f"got {sorted(str(k)[:40] for k in inputs)}")
    for name, digest in inputs.items():
        if not (isinstance(digest, str) and len(digest) == 64 and _HEX.fullmatch(digest)):
            raise refuse(f"inputs.{name}", f"must be a SHA-256 (64 hexadecimal digits), got {show(digest)}")


def _check_partitions(parts: dict[str, Any], config: dict[str, Any], refuse) -> None:
    """``partitions``: one non-empty index tensor per device; ``local_test`` (when the checkpoint has it): one
    held-out index tensor per device, possibly empty; no sample in two places."""
    devices = config.get("devices")
    seen = 0
    for name, tensors in parts.items():
        if not isinstance(tensors, list) or not is_int(devices) or len(tensors) != devices:
            raise refuse(name, f"must be a list of one sample-index tensor per device ({show(devices)} devices)")
        for i, part in enumerate(tensors):
            if not (torch.is_tensor(part) and part.dim() == 1 and (part.numel() > 0 or name == "local_test")
                    and not part.is_floating_point() and part.dtype != torch.bool and not part.is_complex()):
                raise refuse(f"{name}[{i}]", "must be a " + ("" if name == "local_test" else "non-empty ")
                             + "1-D tensor of sample indices")
            if part.numel() and int(part.min()) < 0:
                raise refuse(f"{name}[{i}]", f"holds a negative sample index {int(part.min())}")
            seen += part.numel()
    indices = torch.cat([p.long() for tensors in parts.values() for p in tensors])
    if int(indices.unique().numel()) != seen:
        raise refuse("partitions", "share a sample between devices or with the held-out samples (each sample "
                                   "belongs to one device, for training or for its local test)")


def _mt19937_keys(keys: torch.Tensor) -> bool:
    """Whether ``keys`` can be MT19937's state words: integers in [0, 2³²), not all zero (a state of zeros only ever
    yields zeros)."""
    if keys.is_floating_point() or keys.is_complex() or keys.dtype == torch.bool:
        return False
    wide = keys.to(torch.int64)
    return bool(((wide >= 0) & (wide < 2 ** 32)).all()) and bool(wide.any())


def _check_rngs(state: dict[str, Any], refuse) -> None:
    numpy_rng = state["numpy_rng"]
    ok = (isinstance(numpy_rng, (list, tuple)) and len(numpy_rng) == 5 and numpy_rng[0] == "MT19937"
          and torch.is_tensor(numpy_rng[1]) and tuple(numpy_rng[1].shape) == (624,) and _mt19937_keys(numpy_rng[1])
          and is_int(numpy_rng[2]) and 0 <= numpy_rng[2] <= 624 and numpy_rng[3] in (0, 1) and is_int(numpy_rng[3])
          and is_finite_number(numpy_rng[4]) and abs(numpy_rng[4]) <= sys.float_info.max)
    if not ok:
        raise refuse("numpy_rng", "must be numpy's MT19937 state [name, 624 keys, position, has_gauss, cached]")
    for name in ("torch_rng", "cuda_rng"):
        if name in state and not (torch.is_tensor(state[name]) and state[name].dtype == torch.uint8
                                  and state[name].dim() == 1 and state[name].numel() > 0):
            raise refuse(name, "must be a generator state (a 1-D uint8 tensor)")


def _plain(value: Any, depth: int = 0) -> bool:
    """True if ``value`` is a JSON value (None, a bool, a number, text, or lists and objects with text keys of
    such values, at most 8 deep)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if depth >= 8:
        return False
    if isinstance(value, (list, tuple)):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    return False
