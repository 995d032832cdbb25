"""`ModelProfile`: the per-cut-point description of a model (docs/formats.md "Model profile").

Cut points are indexed j = 1..L along the profiler's chain of blocks; entry j = L is the model
output. All FLOP counts are **cumulative per sample** over blocks 1..j (ρ_j, ϖ_j of
docs/model.md §1) with **2 FLOPs per multiply–add**; sizes are **bits per sample** (ψ_j, χ_j)
and parameter sizes are **bits** (δ_j). Optional ``client_memory_bytes`` (bytes) is the device memory
the client part of cut j needs to train (parameters, their gradients, optimizer state and the
activations of one mini-batch, measured by :mod:`profilers.memory`); the top-level ``memory``
object says for which ``batch_size`` and ``optimizer`` it was measured.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np

from adaptplan.errors import InputError
from adaptplan.fileio import (
    check_keys,
    load_file,
    mapping_value,
    non_empty_list,
    non_negative_number,
    positive_int,
    positive_number,
    save_json,
    show,
    text_value,
)
from adaptplan.limits import MAX_BITS_PER_VALUE, MAX_CUT_POINTS, MAX_INPUT_VALUES

FLOP_CONVENTION = "2 per multiply-add"

_CUT_REQUIRED = ("index", "name", "fp_flops", "bp_flops", "activation_bits", "gradient_bits", "client_param_bits")
_CUT_OPTIONAL = ("server_bp_flops", "fp_seconds", "bp_seconds", "client_memory_bytes", "defence_fp_flops",
                 "defence_bp_flops")
_TOP_REQUIRED = ("model", "input_shape", "bits_per_value", "cut_points")
_TOP_OPTIONAL = ("flop_convention", "timing", "memory", "flop_counting")
#: Optimizer names of the profile's ``memory`` object → optimizer state per parameter (× parameter bytes).
OPTIMIZER_STATE = {"sgd": 0, "sgd-momentum": 1, "adam": 2}
# unit of each numeric cut-point field (messages name it); activation/gradient sizes must be > 0:
# a tensor of at least one value crosses every cut
_CUT_UNITS = {"fp_flops": "FLOPs", "bp_flops": "FLOPs", "activation_bits": "bits", "gradient_bits": "bits",
              "client_param_bits": "bits", "server_bp_flops": "FLOPs", "fp_seconds": "s", "bp_seconds": "s",
              "client_memory_bytes": "bytes", "defence_fp_flops": "FLOPs", "defence_bp_flops": "FLOPs"}
_CUT_POSITIVE = ("activation_bits", "gradient_bits")


def _cut_from_json(entry: Any, where: str) -> "CutPoint":
    """One cut point of a profile file; every field is checked and named (``where`` = ``profile.cut_points[k]``)."""
    check_keys(entry, _CUT_REQUIRED, _CUT_OPTIONAL, where)
    numbers = {}
    for key, unit in _CUT_UNITS.items():
        if key in _CUT_OPTIONAL and entry.get(key) is None:
            continue
        check = positive_number if key in _CUT_POSITIVE else non_negative_number
        numbers[key] = check(entry[key], f"{where}.{key}", unit)
    return CutPoint(index=positive_int(entry["index"], f"{where}.index", MAX_CUT_POINTS),
                    name=text_value(entry["name"], f"{where}.name"), **numbers)


@dataclass(frozen=True)
class CutPoint:
    """One cut point j of the chain.

    Attributes:
        index: j, 1-based position along the chain.
        name: the fx node / module name whose output crosses the cut.
        fp_flops: ρ_j, cumulative forward FLOPs per sample of blocks 1..j.
        bp_flops: ϖ_j, cumulative backward FLOPs per sample of blocks 1..j (input gradient of
            block 1 not needed, as on the device).
        activation_bits: ψ_j, bits per sample of the tensor crossing cut j.
        gradient_bits: χ_j, bits per sample of its gradient.
        client_param_bits: δ_j, bits of the parameters of blocks 1..j.
        server_bp_flops: optional backward FLOPs per sample of blocks j+1..L with the cut
            activation requiring a gradient (used in eq. (19) in place of ϖ_L − ϖ_j).
        fp_seconds, bp_seconds: optional measured cumulative seconds per sample of blocks 1..j on
            the profiling machine (median of repeats).
        client_memory_bytes: optional bytes the device needs to train blocks 1..j on one
            mini-batch (the profile's ``memory`` says which batch size and optimizer).
        defence_fp_flops, defence_bp_flops: optional FLOPs per sample a device cutting at j spends on the defence of
            its activations, forward and backward (:func:`adaptplan.defence_cost.defence_flops`; not cumulative:
            charged at the cut only, eqs. (16) and (21)).
    """

    index: int
    name: str
    fp_flops: float
    bp_flops: float
    activation_bits: float
    gradient_bits: float
    client_param_bits: float
    server_bp_flops: float | None = None
    fp_seconds: float | None = None
    bp_seconds: float | None = None
    client_memory_bytes: float | None = None
    defence_fp_flops: float | None = None
    defence_bp_flops: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class ModelProfile:
    """Per-cut profile of a model; see the module docstring for units.

    ``timing`` (optional) describes how ``fp_seconds``/``bp_seconds`` were measured, e.g.
    ``{"batch_size": 16, "repeats": 5, "threads": 2, "statistic": "median"}``.
    ``memory`` (optional, required with ``client_memory_bytes``) says for what the memory was
    measured: ``{"batch_size": 16, "optimizer": "adam"}`` (optimizer one of :data:`OPTIMIZER_STATE`).
    ``flop_counting`` (optional, written by the profiler) names the FLOP counters, the ops counted
    as zero, and the independent cross-check of the forward total (docs/formats.md).
    """

    model: str
    input_shape: tuple[int, ...]
    bits_per_value: int
    cut_points: tuple[CutPoint, ...]
    flop_convention: str = FLOP_CONVENTION
    timing: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    flop_counting: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.cut_points:
            raise InputError("must list at least one cut point", field="cut_points")
        for position, cut in enumerate(self.cut_points, start=1):
            if cut.index != position:
                raise InputError(f"indices must be 1..L in order; found {cut.index} at position {position}",
                                 field=f"cut_points[{position - 1}].index")
        for name in ("fp_flops", "bp_flops", "client_param_bits"):
            values = np.array([getattr(c, name) for c in self.cut_points])
            if np.any(np.diff(values) < 0):
                raise InputError("must be cumulative (non-decreasing in j)", field=f"cut_points.{name}")
        if self.cut_points[-1].fp_flops <= 0:
            raise InputError("must be > 0 at the model output (j = L): a model that computes nothing cannot be "
                             "planned", field=f"cut_points[{len(self.cut_points) - 1}].fp_flops")
        if self.flop_convention != FLOP_CONVENTION:
            raise InputError(f"only {FLOP_CONVENTION!r} is supported, got {self.flop_convention!r}", field="flop_convention")
        self._check_memory()

    def _check_memory(self) -> None:
        """``client_memory_bytes`` on every cut or on none, > 0, and then a valid ``memory`` object."""
        given = [c.client_memory_bytes is not None for c in self.cut_points]
        if not any(given):
            if self.memory is not None:
                raise InputError("is given but no cut point has client_memory_bytes", field="memory")
            return
        if not all(given):
            k = given.index(False)
            raise InputError("client_memory_bytes must be given on every cut point or on none",
                             field=f"cut_points[{k}].client_memory_bytes")
        for k, cut in enumerate(self.cut_points):
            positive_number(cut.client_memory_bytes, f"cut_points[{k}].client_memory_bytes")
        if not isinstance(self.memory, dict):
            raise InputError('must say what client_memory_bytes was measured for, e.g. '
                             '{"batch_size": 16, "optimizer": "adam"}', field="memory")
        check_keys(self.memory, ("batch_size", "optimizer"), (), "memory")
        positive_int(self.memory["batch_size"], "memory.batch_size")
        if not isinstance(self.memory["optimizer"], str) or self.memory["optimizer"] not in OPTIMIZER_STATE:
            raise InputError(f"must be one of {', '.join(OPTIMIZER_STATE)}, got {show(self.memory['optimizer'])}",
                             field="memory.optimizer")

    def identity(self) -> dict[str, Any]:
        """What a plan records about the model it was made for: the profile's model name, L, and
        a SHA-256 of the structure at every cut (name, activation bits ψ_j, parameter bits δ_j) —
        the same for every profile of one architecture and input shape, whatever the FLOP counter
        or the measured times."""
        import hashlib
        import json

        structure = [[c.name, float(c.activation_bits), float(c.client_param_bits)] for c in self.cut_points]
        digest = hashlib.sha256(json.dumps([list(self.input_shape), structure]).encode()).hexdigest()
        return {"name": self.model, "num_cuts": self.num_cuts, "structure_sha256": digest}

    # ---- arrays (index 0 ↔ cut j = 1) ---------------------------------------------------------
    @property
    def num_cuts(self) -> int:
        """L, the number of cut points (the last one is the model output)."""
        return len(self.cut_points)

    def _array(self, name: str) -> np.ndarray:
        return np.array([float(getattr(c, name)) for c in self.cut_points])

    @property
    def rho(self) -> np.ndarray:
        """ρ_j, cumulative FP FLOPs per sample, shape (L,)."""
        return self._array("fp_flops")

    @property
    def varpi(self) -> np.ndarray:
        """ϖ_j, cumulative BP FLOPs per sample, shape (L,)."""
        return self._array("bp_flops")

    @property
    def defence_fp(self) -> np.ndarray:
        """ο^F_j, the defence's forward FLOPs per sample at cut j (0 where none is given), shape (L,)."""
        return np.array([float(c.defence_fp_flops or 0.0) for c in self.cut_points])

    @property
    def defence_bp(self) -> np.ndarray:
        """ο^B_j, the defence's backward FLOPs per sample at cut j (0 where none is given), shape (L,)."""
        return np.array([float(c.defence_bp_flops or 0.0) for c in self.cut_points])

    @property
    def psi(self) -> np.ndarray:
        """ψ_j, activation bits per sample at cut j, shape (L,)."""
        return self._array("activation_bits")

    @property
    def chi(self) -> np.ndarray:
        """χ_j, gradient bits per sample at cut j, shape (L,)."""
        return self._array("gradient_bits")

    @property
    def delta(self) -> np.ndarray:
        """δ_j, client-side parameter bits for cut j, shape (L,)."""
        return self._array("client_param_bits")

    @property
    def server_bp(self) -> np.ndarray:
        """Server backward FLOPs per sample for cut j: ``server_bp_flops`` if every cut has it,
        else ϖ_L − ϖ_j (docs/formats.md, eq. (19))."""
        if all(c.server_bp_flops is not None for c in self.cut_points):
            return self._array("server_bp_flops")
        varpi = self.varpi
        return varpi[-1] - varpi

    @property
    def client_memory(self) -> np.ndarray | None:
        """``client_memory_bytes`` per cut j (bytes, shape (L,)), or ``None`` when not profiled."""
        return self._array("client_memory_bytes") if self.memory is not None else None

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.cut_points]

    # ---- JSON -----------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "model": self.model,
            "input_shape": list(self.input_shape),
            "bits_per_value": self.bits_per_value,
            "flop_convention": self.flop_convention,
            "cut_points": [c.to_json() for c in self.cut_points],
        }
        if self.timing is not None:
            data["timing"] = dict(self.timing)
        if self.memory is not None:
            data["memory"] = dict(self.memory)
        if self.flop_counting is not None:
            data["flop_counting"] = dict(self.flop_counting)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ModelProfile":
        check_keys(data, _TOP_REQUIRED, _TOP_OPTIONAL, "profile")
        shape = non_empty_list(data["input_shape"], "profile.input_shape", "a non-empty list of positive integers", 8)
        cuts_data = non_empty_list(data["cut_points"], "profile.cut_points", "a non-empty list of cut points", MAX_CUT_POINTS)
        cuts = [_cut_from_json(entry, f"profile.cut_points[{k}]") for k, entry in enumerate(cuts_data)]
        timing = data.get("timing")
        if timing is not None and not isinstance(timing, dict):
            raise InputError("must be an object", field="profile.timing")
        counting = data.get("flop_counting")
        if counting is not None and not isinstance(counting, dict):
            raise InputError("must be an object", field="profile.flop_counting")
        return cls(
            model=text_value(data["model"], "profile.model"),
            input_shape=tuple(positive_int(s, f"profile.input_shape[{i}]", MAX_INPUT_VALUES) for i, s in enumerate(shape)),
            bits_per_value=positive_int(data["bits_per_value"], "profile.bits_per_value", MAX_BITS_PER_VALUE, "bits"),
            cut_points=tuple(cuts),
            flop_convention=text_value(data.get("flop_convention", FLOP_CONVENTION), "profile.flop_convention"),
            timing=None if timing is None else mapping_value(timing, "profile.timing"),
            memory=data.get("memory"),
            flop_counting=counting,
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ModelProfile":
        return load_file(path, "profile", cls.from_json)

    def save(self, path: str | os.PathLike) -> None:
        save_json(self.to_json(), path)
