"""`Plan`: the planner's answer (docs/formats.md "Plan").

``cuts[i]`` is device i's 1-based cut index ℓ_i; ``rounds`` = ⌈R⌉ of Corollary 1 (eq. 15);
``aggregations`` = ⌊rounds/interval⌋; ``total_latency_s`` is eq. (26) with those integers;
``objective_s`` is the relaxed objective (28). Optional ``breakdown`` holds the stage terms of
§2.4 in seconds (written by the planner, not required when reading). Optional ``lower_bound_s``
is a certified lower bound on the optimum of (28) (seconds) and ``gap`` =
(objective_s − lower_bound_s)/objective_s, 0 when the plan is proven optimal.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from adaptplan.errors import InfeasibleError, InputError
from adaptplan.fileio import check_keys, int_in_range, load_file, mapping_value, non_empty_list, non_negative_number, positive_int, save_json, show
from adaptplan.limits import MAX_CUT_POINTS, MAX_DEVICES, MAX_ROUNDS


def check_cut_vector(cuts: Sequence[int], num_devices: int, num_cuts: int) -> np.ndarray:
    """``cuts`` as an int array of 1-based cut indices, one per device, each in 1..``num_cuts``;
    otherwise :class:`InputError` naming ``cuts`` or the bad entry ``cuts[i]``."""
    array = np.asarray(cuts, dtype=int)
    if array.shape != (num_devices,):
        raise InputError(f"need one cut per device ({num_devices}), got {array.size}", field="cuts")
    bad = np.flatnonzero((array < 1) | (array > num_cuts))
    if bad.size:
        raise InputError(f"cut {array[bad[0]]} is outside 1..{num_cuts}", field=f"cuts[{bad[0]}]")
    return array


_REQUIRED = ("interval", "cuts", "rounds", "aggregations", "round_latency_s", "aggregation_latency_s",
             "total_latency_s", "objective_s")
_OPTIONAL = ("solver", "breakdown", "model", "lower_bound_s", "gap")


def _model_identity(value: Any) -> dict[str, Any] | None:
    """The plan's ``model`` block: {"name": str, "num_cuts": int ≥ 1, "structure_sha256": 64 hex digits}."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InputError("must be an object with name, num_cuts and structure_sha256", field="plan.model")
    check_keys(value, ("name", "num_cuts", "structure_sha256"), (), "plan.model")
    digest = value["structure_sha256"]
    if not isinstance(value["name"], str) or not isinstance(digest, str) or len(digest) != 64 \
            or any(ch not in "0123456789abcdef" for ch in digest):
        raise InputError("name must be a string and structure_sha256 64 lower-case hex digits", field="plan.model")
    return {"name": value["name"], "num_cuts": positive_int(value["num_cuts"], "plan.model.num_cuts"),
            "structure_sha256": digest}


def check_rounds(rounds: int, field: str = "plan.rounds") -> int:
    """``rounds`` if it is at most :data:`MAX_ROUNDS`; else :class:`InfeasibleError`: a plan that
    needs more rounds than that means the constants (ϑ, γ, ε, σ², G²) make the target unreachable in
    practice."""
    if rounds > MAX_ROUNDS:
        count = f"{float(rounds):.3g}" if rounds < 10**300 else show(rounds)
        raise InfeasibleError(f"the plan needs {count} rounds, more than the {MAX_ROUNDS:.0e} a plan may "
                              f"have: the target epsilon is unreachable in practice with these constants (check "
                              f"theta, gamma, epsilon, sigma2 and G2)", field=field)
    return rounds


def _breakdown(value: Any) -> dict[str, float]:
    """A plan file's ``breakdown``: an object of stage name → seconds ≥ 0."""
    return {key: non_negative_number(v, f"plan.breakdown.{key}", "s")
            for key, v in mapping_value(value, "plan.breakdown").items()}


@dataclass(frozen=True)
class Plan:
    interval: int
    cuts: tuple[int, ...]
    rounds: int
    aggregations: int
    round_latency_s: float
    aggregation_latency_s: float
    total_latency_s: float
    objective_s: float
    solver: dict[str, Any] = field(default_factory=dict)
    breakdown: dict[str, float] | None = None
    model: dict[str, Any] | None = None       # ModelProfile.identity() of the model planned for
    lower_bound_s: float | None = None
    gap: float | None = None

    def __post_init__(self) -> None:
        check_rounds(self.rounds)

    @property
    def deepest_cut(self) -> int:
        """L_c = max_i ℓ_i."""
        return max(self.cuts)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "interval": self.interval,
            "cuts": list(self.cuts),
            "rounds": self.rounds,
            "aggregations": self.aggregations,
            "round_latency_s": self.round_latency_s,
            "aggregation_latency_s": self.aggregation_latency_s,
            "total_latency_s": self.total_latency_s,
            "objective_s": self.objective_s,
            "solver": dict(self.solver),
        }
        if self.lower_bound_s is not None:
            data["lower_bound_s"] = self.lower_bound_s
            data["gap"] = self.gap
        if self.breakdown is not None:
            data["breakdown"] = dict(self.breakdown)
        if self.model is not None:
            data["model"] = dict(self.model)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Plan":
        check_keys(data, _REQUIRED, _OPTIONAL, "plan")
        cuts = non_empty_list(data["cuts"], "plan.cuts", "a non-empty list of 1-based cut indices", MAX_DEVICES)
        return cls(
            interval=positive_int(data["interval"], "plan.interval", MAX_ROUNDS, "rounds"),
            cuts=tuple(positive_int(c, f"plan.cuts[{i}]", MAX_CUT_POINTS) for i, c in enumerate(cuts)),
            rounds=positive_int(data["rounds"], "plan.rounds", MAX_ROUNDS, "rounds"),
            aggregations=int_in_range(data["aggregations"], "plan.aggregations", 0, MAX_ROUNDS),
            **{k: non_negative_number(data[k], f"plan.{k}", "s") for k in _REQUIRED[4:]},
            solver=dict(mapping_value(data.get("solver", {}), "plan.solver")),
            breakdown=None if data.get("breakdown") is None else _breakdown(data["breakdown"]),
            model=_model_identity(data.get("model")),
            **{k: non_negative_number(data[k], f"plan.{k}") for k in ("lower_bound_s", "gap") if k in data},
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Plan":
        return load_file(path, "plan", cls.from_json)

    def save(self, path: str | os.PathLike) -> None:
        save_json(self.to_json(), path)
