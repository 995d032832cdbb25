"""A device that holds the run's secret and lies (issue 67 E1–E8), over both runtimes: real ranks over gloo and
through a Mosquitto broker, device 0's messages changed in flight by a ``sitecustomize`` module on its rank
(tests/process_runs.py: lying_device). Every lie is refused before it is used, with one line that names the device's
rank, the message and the field, exit 3; a stated FedAvg weight is never believed (the run equals the simulation)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.process_runs import LIES, losses, lying_device, simulate

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ranks bind to the loopback device 'lo'")
MOSQUITTO = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
RUNTIMES = {"torch.distributed": ["--distributed"],
            "mqtt": pytest.param(["--runtime", "mqtt"], marks=pytest.mark.skipif(
                MOSQUITTO is None, reason="the mosquitto broker is not installed (.ci/run installs it)"))}
ARGV = ["--algorithm", "sfl-v1", "--devices", "2", "--rounds", "2", "--dataset", "synthetic", "--model", "mlp",
        "--seed", "5", "--eval-every", "2", "--no-progress", "--cuts", "2", "--client-batching", "off"]
STOPPED = "adaptplan train: rank 0 (edge server) stopped: rank 2 (devices 0, 1) sent "
REFUSED = {
    "E1 shape": "a message its role may not send: device 0's activation: tensor.shape: is [16, 3], expected [16, 128] "
                "(16 samples asked for)",
    "E2 float64": "a message its role may not send: device 0's activation: tensor.dtype: is torch.float64, expected "
                  "torch.float32",
    "E3 labels 10^12": "a message its role may not send: device 0's activation: labels: span "
                       "1000000000000..1000000000000, outside 0..9",
    "E4 15 labels for 16 rows": "a message its role may not send: device 0's activation: labels: are torch.int64[15], "
                                "expected torch.int64[16] (one per row)",
    "E5 empty": "a message its role may not send: device 0's activation: tensor.shape: is [0, 128], expected "
                "[16, 128] (16 samples asked for)",
    "E7 3e38": "a message its role may not send: device 0's activation: tensor: holds 3e+38: NaN, infinite or above "
               "1e+10 in absolute value",
    "S1 the next step's number": "a message its role may not send: device 0's activation: step: is 3, but its last "
                                 "was 1: a device counts its steps by one",   # hostile_device.py: was an internal error
    "E6 upload shape": "rank 1 (fed server) a message its role may not send: device 0's model upload: "
                       "blocks[0].0.1.weight: is torch.float32[2], expected float32[128, 64]",
}


@pytest.mark.parametrize("runtime", RUNTIMES.values(), ids=list(RUNTIMES))
@pytest.mark.parametrize("lie", list(REFUSED))
def test_a_lie_is_refused_naming_the_rank_and_the_field(tmp_path: Path, lie: str, runtime: list[str]) -> None:
    run = lying_device(tmp_path, lie, [*ARGV, *runtime, "--ranks", "3", "--out", str(tmp_path / "run")])
    assert run.returncode == 3, run.stderr
    assert f"{STOPPED}{REFUSED[lie]}\n" in run.stderr, run.stderr
    assert "internal error" not in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert "rank 1 (fed server) internal" not in run.stderr


@pytest.mark.parametrize("runtime", RUNTIMES.values(), ids=list(RUNTIMES))
def test_a_stated_fedavg_weight_is_never_believed(tmp_path: Path, runtime: list[str]) -> None:
    """E8: device 0 states a weight of 10³⁰ for its uploads; the fed server weighs by the partition the edge server
    knows, so the run trains exactly as the simulation does (its model did not become the global one)."""
    assert "E8 weight 1e30" in LIES
    run = lying_device(tmp_path, "E8 weight 1e30", [*ARGV, *runtime, "--ranks", "3", "--out", str(tmp_path / "run")])
    assert run.returncode == 0, run.stderr
    got, expected = losses(tmp_path / "run"), simulate(tmp_path, "sim", ARGV)
    assert len(got) == 2 and max(abs(a - b) for a, b in zip(got, expected)) <= 1e-4


def test_under_partial_participation_the_liar_leaves_and_the_run_goes_on(tmp_path: Path) -> None:
    """An algorithm that allows absence (GAS) takes the lying device's rank out of the run and trains on."""
    argv = ["--algorithm", "gas", "--devices", "2", "--rounds", "4", "--dataset", "synthetic", "--model", "mlp",
            "--seed", "5", "--eval-every", "2", "--no-progress", "--cuts", "2", "--active", "2", "--local-steps", "1",
            "--client-batching", "off", "--distributed", "--ranks", "4", "--out", str(tmp_path / "run")]
    run = lying_device(tmp_path, "E1 shape", argv)
    assert run.returncode == 0, run.stderr
    assert ("adaptplan train: rank 2 (device 0) sent a message its role may not send: device 0's activation: "
            "tensor.shape: is [16, 3], expected [16, 128] (16 samples asked for); gas goes on without devices 0 "
            "(partial participation: they are absent from now on)") in run.stderr, run.stderr


@pytest.mark.parametrize("runtime", RUNTIMES.values(), ids=list(RUNTIMES))
def test_a_robust_rule_reaches_the_fed_rank_and_trains_as_the_simulation(tmp_path: Path, runtime: list[str]) -> None:
    """--aggregation median (issue 67 item 2) is told to the fed server's rank; the run's losses are the
    simulation's with the same rule, and differ from FedAvg's mean."""
    argv = [*ARGV, "--devices", "3", "--rounds", "3", "--eval-every", "3", "--aggregation", "median"]
    run = lying_device(tmp_path, "none", [*argv, *runtime, "--ranks", "3", "--out", str(tmp_path / "run")])
    assert run.returncode == 0, run.stderr
    got, expected = losses(tmp_path / "run"), simulate(tmp_path, "sim", argv)
    assert len(got) == 3 and max(abs(a - b) for a, b in zip(got, expected)) <= 1e-4
    mean = simulate(tmp_path, "mean", [a for a in argv if a not in ("--aggregation", "median")])
    assert mean[2] != expected[2]


def test_a_rank_reporting_another_devices_seconds_is_stopped_naming_it(tmp_path: Path) -> None:
    """R1: the measured seconds fit the system that distributed re-plans use (docs/model.md §11); device 0's rank
    (rank 2 of 4, hosting device 0 only) reports device 1 as slow. Rank 0 refuses the report before merging it
    (trainers.distributed.rank_checks). One runtime: the check is rank 0's, the same over both."""
    run = lying_device(tmp_path, "R1 report of another device",
                       [*ARGV, "--distributed", "--ranks", "4", "--out", str(tmp_path / "run")])
    assert run.returncode == 3, run.stderr
    assert ("adaptplan train: rank 0 (edge server) stopped: rank 2 (device 0) sent a message its role may not send: "
            "rank 2's report: seconds['device FP']: names 1, not one of its devices [0]\n") in run.stderr, run.stderr
    assert "internal error" not in run.stderr and "Traceback" not in run.stderr, run.stderr
