"""Device memory budgets as a constraint on the cut (issue 16).

A cut j is *admissible* for device i when the client part of cut j fits into the device's memory:
``client_memory_bytes[j] ≤ memory_bytes[i]`` (bytes; the profile's ``client_memory_bytes`` is
measured by :mod:`profilers.memory` for the batch size and optimizer in its ``memory`` object).
Every solver restricts device i to its admissible cuts; the MILP by extra rows
Σ_{j inadmissible} x_{i,j} = 0, the threshold method by infinite keys, the baselines by drawing or
choosing among admissible cuts only.
"""

from __future__ import annotations

import numpy as np

from adaptplan.errors import InputError
from adaptplan.model_profile import ModelProfile
from adaptplan.system import SystemSpec


def admissible_cuts(profile: ModelProfile, system: SystemSpec) -> np.ndarray | None:
    """Boolean (N, L) matrix, entry [i, j−1] true iff cut j fits device i; ``None`` when the system
    has no memory budgets (every cut admissible).

    Raises:
        InputError: the system has ``memory_bytes`` but the profile has no ``client_memory_bytes``,
            or the profile's memory was measured for another batch size than the system's.
    """
    budgets = system.memory_budgets()
    if budgets is None:
        return None
    need = profile.client_memory
    if need is None:
        raise InputError("the system gives memory_bytes but the profile has no client_memory_bytes per cut point; "
                         "re-profile with `adaptplan profile` (it measures client_memory_bytes)",
                         field="profile.cut_points")
    assert profile.memory is not None, "client_memory_bytes come with the batch size they were measured at"
    measured_batch = int(profile.memory["batch_size"])
    if measured_batch != system.batch_size:
        raise InputError(f"the profile's client_memory_bytes were measured for batch size {measured_batch} but the "
                         f"system's batch_size is {system.batch_size}; re-profile with --time-batch-size "
                         f"{system.batch_size}", field="profile.memory.batch_size")
    return need[None, :] <= budgets[:, None]


def check_every_device_fits(admissible: np.ndarray, profile: ModelProfile, system: SystemSpec,
                            candidates: np.ndarray) -> None:
    """Raise :class:`InputError` naming the first device that fits none of ``candidates`` (1-based)
    and the smallest memory (bytes) that would admit one of them."""
    fits = admissible[:, candidates - 1].any(axis=1)
    if fits.all():
        return
    i = int(np.flatnonzero(~fits)[0])
    assert profile.client_memory is not None, "admissible cuts exist only with client_memory_bytes"
    need = profile.client_memory[candidates - 1]
    k = int(np.argmin(need))
    raise InputError(f"device {i} has {system.devices[i].memory_bytes:.6g} bytes but no candidate cut fits: the "
                     f"smallest client part (cut {int(candidates[k])}) needs {need[k]:.6g} bytes; give it at least "
                     f"that much memory or allow shallower cuts", field=f"system.devices[{i}].memory_bytes")
