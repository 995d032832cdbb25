"""What a plan predicts, and how a measured run compares with it (docs/model.md §10, docs/api.md "Plan, train and
check in your own loop").

A :class:`Prediction` is a plan's ⌈R⌉ rounds (eq. 15) and its simulated seconds (eq. 26) to the end the constants
describe: a test accuracy where they were calibrated on pilot runs (:mod:`adaptplan.calibration`), else an
ε-stationary point of Corollary 1, which no run can measure. :func:`compare` sets a run's evaluations beside it: the
rounds and simulated seconds at which the test accuracy first reached the target, interpolated between evaluations
(:func:`adaptplan.crossing.first_crossing`), and measured/predicted seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from adaptplan.crossing import first_crossing
from adaptplan.errors import InputError
from adaptplan.plan import Plan


@dataclass(frozen=True)
class Prediction:
    """A plan's ``cuts`` and ``interval`` I, its ``rounds`` ⌈R⌉ (eq. 15) and ``seconds`` (eq. 26, simulated s) to
    ``target_accuracy`` (a fraction; None: to an ε-stationary point, the constants being uncalibrated)."""

    cuts: tuple[int, ...]
    interval: int
    rounds: int
    seconds: float
    target_accuracy: float | None

    @classmethod
    def of(cls, plan: Plan, target_accuracy: float | None) -> Prediction:
        return cls(tuple(plan.cuts), plan.interval, plan.rounds, plan.total_latency_s, target_accuracy)

    def describe(self) -> str:
        """``predicted 57 rounds, 0.41 simulated s to 30.0% test accuracy`` (or ``... to an ε-stationary point``)."""
        end = ("an ε-stationary point of its constants (uncalibrated: not an accuracy)" if self.target_accuracy is None
               else f"{self.target_accuracy:.1%} test accuracy")
        return f"predicted {self.rounds} rounds, {self.seconds:.4g} simulated s to {end}"


@dataclass(frozen=True)
class Comparison:
    """A run's measured ``rounds`` and simulated ``seconds`` to the prediction's target (interpolated; None where
    the run never reached it; ``upper_bound`` where its first evaluation already had), beside the ``prediction``."""

    prediction: Prediction
    rounds: float | None
    seconds: float | None
    upper_bound: bool

    @property
    def measured_over_predicted(self) -> float | None:
        """Measured / predicted simulated seconds (None where never reached or nothing was predicted)."""
        if self.seconds is None or not self.prediction.seconds:
            return None
        return self.seconds / self.prediction.seconds

    def describe(self) -> str:
        """``measured 61.2 rounds, 0.44 s (interpolated); predicted 57 rounds, 0.41 s: measured/predicted 1.07``."""
        target = self.prediction.target_accuracy
        if self.rounds is None or self.seconds is None:
            return f"never reached {target:.1%} test accuracy; {self.prediction.describe()}"
        how = "at or before the first evaluation" if self.upper_bound else "interpolated"
        ratio = self.measured_over_predicted
        return (f"measured {self.rounds:.4g} rounds, {self.seconds:.4g} simulated s to {target:.1%} ({how}); "
                f"{self.prediction.describe()}" + ("" if ratio is None else f": measured/predicted {ratio:.2f}"))


def compare(prediction: Prediction, evaluations: Sequence[Sequence[float]]) -> Comparison:
    """The :class:`Comparison` of a run's ``evaluations`` — (round, test accuracy, simulated seconds) each, in order —
    with ``prediction``; an uncalibrated prediction (no target accuracy) cannot be measured and is refused."""
    if prediction.target_accuracy is None:
        raise InputError("this prediction is to an ε-stationary point of uncalibrated constants, which no run "
                         "measures. Fix: calibrate the planner on pilot runs (Planner.calibrate) for a target accuracy",
                         field="prediction.target_accuracy")
    found = first_crossing([(accuracy, rounds, seconds) for rounds, accuracy, seconds in evaluations],
                           prediction.target_accuracy)
    if found is None:
        return Comparison(prediction, None, None, False)
    return Comparison(prediction, found.at[0], found.at[1], found.upper_bound)
