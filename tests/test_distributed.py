"""The torch.distributed runtime (docs/distributed.md): real processes on loopback with gloo.

Every test launches ranks as separate processes (``adaptplan train --distributed``), so the
numbers compared here crossed process boundaries as messages. References are the simulator's
histories for the same options (the same role code in one process), the simulated clock's own
stage seconds, and the link rates of a system file written in the test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adaptplan.cli import main
from trainers.checkpoint import load_checkpoint
from trainers.config import ALGORITHMS
from trainers.history import History

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ranks bind to the loopback device 'lo'")

SMALL = ["--dataset", "synthetic", "--model", "mlp", "--seed", "5", "--eval-every", "3", "--no-progress"]
# per algorithm: options that make a 3-device run meaningful (the planner needs more devices for a plan)
ALGORITHM_ARGS = {"adaptsfl": ["--cuts", "1,2,2", "--interval", "2"], "gas": ["--cuts", "2", "--active", "2",
                                                                              "--local-steps", "2"]}


def adaptplan(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``adaptplan ARGV`` in a fresh interpreter (as a user runs it)."""
    return subprocess.run([sys.executable, "-m", "adaptplan.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=Path(__file__).resolve().parents[1])


def losses(folder: Path) -> list[float]:
    return [r.train_loss for r in History.load(folder).records]


def simulate(tmp_path: Path, name: str, argv: list[str]) -> list[float]:
    assert main(["train", *argv, "--out", str(tmp_path / name)]) == 0
    return losses(tmp_path / name)


def test_done_when_sfl_v1_on_cifar10_subset_equals_the_simulation(tmp_path: Path, capsys) -> None:
    argv = ["--algorithm", "sfl-v1", "--dataset", "cifar10-subset", "--model", "cnn", "--devices", "3", "--rounds", "4",
            "--cuts", "2", "--seed", "11", "--no-progress", "--max-test-samples", "200"]
    run = adaptplan("train", "--distributed", *argv, "--out", str(tmp_path / "dist"))
    assert run.returncode == 0, run.stderr
    expected = simulate(tmp_path, "sim", argv)
    got = losses(tmp_path / "dist")
    assert len(got) == 4 and max(abs(a - b) for a, b in zip(got, expected)) <= 1e-4
    history = History.load(tmp_path / "dist")
    for record in history.records:          # every stage of an SFL-V1 round was measured, and the round itself
        assert set(record.measured_stage_seconds) == set(record.stage_seconds)
        assert all(v >= 0 for v in record.measured_stage_seconds.values())
        assert record.measured_round_seconds > 0
    assert history.meta["config"]["distributed"] is True


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_runs_distributed_with_the_simulations_losses(tmp_path: Path, algorithm: str) -> None:
    extra = ALGORITHM_ARGS.get(algorithm, ["--cuts", "2"])
    argv = ["--algorithm", algorithm, "--devices", "3", "--rounds", "3", *SMALL, *extra]
    # 3 ranks: edge, fed, and one rank hosting all three devices
    run = adaptplan("train", "--distributed", "--ranks", "3", *argv, "--out", str(tmp_path / "dist"))
    assert run.returncode == 0, run.stderr
    got, expected = losses(tmp_path / "dist"), simulate(tmp_path, "sim", argv)
    assert len(got) == 3 and max(abs(a - b) for a, b in zip(got, expected)) <= 1e-4


def test_repartition_under_a_random_policy_moves_blocks_between_ranks(tmp_path: Path) -> None:
    """rma+rms re-draws cuts at every aggregation: blocks move device ↔ edge rank with their optimizer state."""
    argv = ["--policy", "rma+rms", "--devices", "10", "--rounds", "8", *SMALL]
    run = adaptplan("train", "--distributed", "--ranks", "4", *argv, "--out", str(tmp_path / "dist"))
    assert run.returncode == 0, run.stderr
    history = History.load(tmp_path / "dist")
    moved = [e for e in history.events if e["event"] == "replan" and e["cuts"] != e["old_cuts"]]
    assert moved, history.events
    expected = simulate(tmp_path, "sim", argv)
    assert max(abs(a - b) for a, b in zip(losses(tmp_path / "dist"), expected)) <= 1e-4


def _rank_pids(launcher: int) -> dict[int, int]:
    """{rank: pid} of the launcher's children, read from /proc (their RANK variable)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher:
            for item in env:
                if item.startswith(b"RANK="):
                    found[int(item[5:])] = int(entry.name)
    return found


def _start(tmp_path: Path, argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "adaptplan.cli", "train", "--distributed", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


def test_a_killed_device_rank_stops_every_rank_cleanly_and_resume_continues(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["--algorithm", "adaptsfl", "--devices", "6", "--rounds", "400", "--checkpoint-every", "2",
            "--rank-timeout", "10", "--ranks", "4", *SMALL, "--cuts", "1,2,2,1,2,2", "--interval", "2"]
    proc = _start(tmp_path, [*argv, "--out", str(out)])
    try:
        _wait_for(out / "checkpoint.pt", proc)
        pids = _rank_pids(proc.pid)
        assert sorted(pids) == [0, 1, 2, 3], pids
        os.kill(pids[3], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)      # a run left hanging fails here (TimeoutExpired)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3
    assert "Traceback" not in err
    assert "rank 3 (devices 1, 3, 5)" in err and "--resume" in err, err
    assert len(err.strip().splitlines()) <= 6, err
    stopped_at = load_checkpoint(out)["round"]           # the last checkpoint is intact (its digest is checked)
    assert stopped_at >= 2
    total = stopped_at + 2
    resumed = adaptplan("train", "--out", str(out), "--resume", "--rounds", str(total), "--distributed")
    assert resumed.returncode == 0, resumed.stderr
    reference = ["--algorithm", "adaptsfl", "--devices", "6", "--rounds", str(total), *SMALL,
                 "--cuts", "1,2,2,1,2,2", "--interval", "2"]
    expected = simulate(tmp_path, "sim", reference)
    got = losses(out)
    assert len(got) == total and max(abs(a - b) for a, b in zip(got, expected)) <= 1e-4


def test_a_hanging_device_rank_is_named_after_the_time_out(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["--algorithm", "psl", "--devices", "3", "--rounds", "400", "--checkpoint-every", "2", "--rank-timeout", "10",
            "--ranks", "3", *SMALL, "--cuts", "2"]
    proc = _start(tmp_path, [*argv, "--out", str(out)])
    try:
        _wait_for(out / "checkpoint.pt", proc)
        pids = _rank_pids(proc.pid)
        os.kill(pids[2], signal.SIGSTOP)
        _, err = proc.communicate(timeout=60)      # without the --rank-timeout the run would hang: TimeoutExpired
    finally:
        for pid in _rank_pids(proc.pid).values() if proc.poll() is None else []:
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3 and "Traceback" not in err
    assert "rank 2 (devices 0, 1, 2) sent nothing for 10 s" in err, err


def test_emulated_links_deliver_at_the_latency_models_time(tmp_path: Path) -> None:
    """With slow links written in the system file, every transfer's measured seconds are at least the
    size over the rate (never early) and close to the latency model's prediction for the stage."""
    device = {"flops": 1e9, "up_bps": 2e6, "down_bps": 4e6, "fed_up_bps": 8e6, "fed_down_bps": 8e6}
    system = {"batch_size": 16, "server_flops": 1e10, "edge_to_fed_bps": 1e7, "fed_to_edge_bps": 1e7,
              "devices": [device] * 3}
    (tmp_path / "system.json").write_text(json.dumps(system))
    argv = ["--algorithm", "sfl-v1", "--devices", "3", "--rounds", "3", *SMALL, "--cuts", "2",
            "--system", str(tmp_path / "system.json"), "--distributed", "--emulate-links", "--ranks", "5"]
    run = adaptplan("train", *argv, "--out", str(tmp_path / "dist"))
    assert run.returncode == 0, run.stderr
    rows = {r["stage"]: r for r in History.load(tmp_path / "dist").stage_comparison()}
    for stage in ("uplink", "downlink", "model upload", "model download"):
        predicted, measured = rows[stage]["predicted_s"], rows[stage]["measured_s"]
        assert predicted > 0.002, (stage, predicted)            # the links are slow enough to matter
        assert predicted * 0.98 <= measured <= predicted + 0.25, (stage, predicted, measured)


def test_predicted_vs_measured_plot_and_table(tmp_path: Path, capsys) -> None:
    argv = ["--algorithm", "psl", "--devices", "3", "--rounds", "3", *SMALL, "--cuts", "2"]
    run = adaptplan("train", "--distributed", "--ranks", "3", *argv, "--out", str(tmp_path / "dist"))
    assert run.returncode == 0, run.stderr
    assert main(["plot", "--predicted-vs-measured", str(tmp_path / "dist"), "-o", str(tmp_path / "pvm.png")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:3] == ["stage", "predicted", "s"]
    assert [line.split()[0] for line in lines[1:-1]][:3] == ["device", "uplink", "server"] or "uplink" in lines[2]
    assert (tmp_path / "pvm.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a simulated run has nothing measured: one message naming the runs, exit 2
    assert main(["train", *argv, "--out", str(tmp_path / "sim")]) == 0
    capsys.readouterr()
    assert main(["plot", "--predicted-vs-measured", str(tmp_path / "sim"), "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--distributed" in err[0]


@pytest.mark.parametrize("argv, flag", [
    (["--distributed", "--ranks", "2"], "--ranks"),
    (["--ranks", "4"], "--ranks"),
    (["--emulate-links"], "--emulate-links"),
    (["--distributed", "--rank-timeout", "0"], "--rank-timeout"),
])
def test_distributed_flag_errors_exit_2_naming_the_flag(argv: list[str], flag: str, capsys) -> None:
    from tests.cli_checks import assert_train_flag_error

    assert_train_flag_error(argv, flag, capsys)


def test_a_user_error_on_rank_0_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """A system file for 2 devices in a 3-device run, found by rank 0 after the ranks started: rank 0 says
    so once; the other ranks stop quietly."""
    device = {"flops": 1e9, "up_bps": 2e6, "down_bps": 4e6, "fed_up_bps": 8e6, "fed_down_bps": 8e6}
    (tmp_path / "system.json").write_text(json.dumps({"batch_size": 16, "server_flops": 1e10, "edge_to_fed_bps": 1e7,
                                                      "fed_to_edge_bps": 1e7, "devices": [device] * 2}))
    run = adaptplan("train", "--distributed", "--ranks", "3", "--devices", "3", "--rounds", "2", *SMALL, "--cuts", "2",
                    "--system", str(tmp_path / "system.json"), "--out", str(tmp_path / "d"))
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "system has 2 devices but devices = 3" in lines[0], run.stderr
