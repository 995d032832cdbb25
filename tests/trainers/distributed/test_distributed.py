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
from tests.process_runs import adaptplan, after_loss, finished_slowly, losses, rank_pids, simulate, wait_for
from trainers.algorithms import REGISTRY
from trainers.config.train_config import ALGORITHMS
from trainers.run.checkpoint import load_checkpoint
from trainers.run.history import History

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ranks bind to the loopback device 'lo'")

SMALL = ["--dataset", "synthetic", "--model", "mlp", "--seed", "5", "--eval-every", "3", "--no-progress"]
# per algorithm: options that make a 3-device run meaningful (the planner needs more devices for a plan)
ALGORITHM_ARGS = {"adaptsfl": ["--cuts", "1,2,2", "--interval", "2"], "gas": ["--cuts", "2", "--active", "2",
                                                                              "--local-steps", "2"],
                  # the model changes after round 1: rounds 2 and 3 train the 2 encoders' classifier
                  "fedconcat": ["--encoder-rounds", "1", "--clusters", "2", "--interval", "1"]}


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
    extra = ALGORITHM_ARGS.get(algorithm, [] if REGISTRY[algorithm].whole_model else ["--cuts", "2"])
    argv = ["--algorithm", algorithm, "--devices", "3", "--rounds", "3", *SMALL, *extra]
    # 3 ranks: edge, fed, and one rank hosting all three devices
    run = adaptplan("train", "--distributed", "--ranks", "3", *argv, "--out", str(tmp_path / "dist"))
    assert run.returncode == 0, run.stderr
    got, expected = losses(tmp_path / "dist"), simulate(tmp_path, "sim", argv)
    assert len(got) == 3 and max(abs(a - b) for a, b in zip(got, expected)) <= 1e-4


def test_fedconcat_resumed_after_its_change_of_model_has_the_simulations_numbers(tmp_path: Path) -> None:
    """Stage 1 for one round, then two encoders under a new classifier: a run stopped after round 2 (past the
    change) and resumed to round 4 sets the device ranks up for stage 1, then again for stage 2 (architecture built
    there from the spec, rank 0's weights, the fed server emptied) before loading the checkpoint; its losses, its
    accuracy and its change of model are the simulator's run of 4 rounds straight."""
    argv = ["--algorithm", "fedconcat", "--devices", "3", *SMALL, *ALGORITHM_ARGS["fedconcat"], "--participation", "1",
            "--checkpoint-every", "1"]
    for rounds, more in (("2", []), ("4", ["--resume"])):
        run = adaptplan("train", "--distributed", "--ranks", "3", *argv, "--rounds", rounds, *more, "--out",
                        str(tmp_path / "dist"))
        assert run.returncode == 0, run.stderr
    expected = simulate(tmp_path, "sim", [*argv, "--rounds", "4"])
    got = History.load(tmp_path / "dist")
    assert len(got.records) == 4 and max(abs(r.train_loss - e) for r, e in zip(got.records, expected)) <= 1e-4
    sim = History.load(tmp_path / "sim")
    assert [r.accuracy for r in got.records] == [r.accuracy for r in sim.records] and got.records[2].accuracy
    assert [e for e in got.events if e["event"] == "model"] == [e for e in sim.events if e["event"] == "model"] != []


def test_a_defended_run_adds_its_noise_on_the_device_ranks_with_the_simulations_numbers(tmp_path: Path) -> None:
    """Clipping, noise and NoPeek run in the device role on its own rank (the edge server's rank receives the noised
    activation only): the losses and every device's ε equal the simulator's."""
    argv = ["--algorithm", "sfl-v1", "--devices", "3", "--rounds", "3", "--cuts", "2", "--activation-clip", "1.0",
            "--activation-noise", "0.7", "--nopeek", "0.2", *SMALL]
    run = adaptplan("train", "--distributed", "--ranks", "4", *argv, "--out", str(tmp_path / "dist"))
    assert run.returncode == 0, run.stderr
    got, expected = losses(tmp_path / "dist"), simulate(tmp_path, "sim", argv)
    assert len(got) == 3 and max(abs(a - b) for a, b in zip(got, expected)) <= 1e-4
    dist, sim = History.load(tmp_path / "dist").meta["privacy"], History.load(tmp_path / "sim").meta["privacy"]
    assert dist == sim and dist["releases"] == [3, 3, 3]


@pytest.mark.parametrize("algorithm, noise", [("psl", ["--head-clip", "0.05", "--head-noise", "1"]), ("sfl-v2", [])])
def test_a_u_shaped_run_keeps_heads_and_labels_on_the_device_ranks_with_the_simulations_numbers(
        tmp_path: Path, algorithm: str, noise: list[str]) -> None:
    """The heads live on the device ranks: the edge rank sends them features and back-propagates their gradients
    (PSL evaluates each device's own model, its head read from its rank; SplitFed V2 averages the heads every 2
    rounds through the fed server's rank); losses, accuracies and bytes are the simulator's, under noise on the
    head gradients too (drawn on the device ranks from the simulator's streams)."""
    argv = ["--algorithm", algorithm, "--devices", "3", "--rounds", "4", "--cuts", "1", "--u-shaped", "1",
            "--interval", "2", *SMALL, "--eval-every", "2", *noise]
    run = adaptplan("train", "--distributed", "--ranks", "4", *argv, "--out", str(tmp_path / "dist"))
    assert run.returncode == 0, run.stderr
    got, expected = losses(tmp_path / "dist"), simulate(tmp_path, "sim", argv)
    assert len(got) == 4 and max(abs(a - b) for a, b in zip(got, expected)) <= 1e-4
    dist, sim = History.load(tmp_path / "dist"), History.load(tmp_path / "sim")
    assert [r.accuracy for r in dist.records] == pytest.approx([r.accuracy for r in sim.records], abs=1e-9)
    assert [(r.bytes_up, r.bytes_down) for r in dist.records] == [(r.bytes_up, r.bytes_down) for r in sim.records]
    assert dist.meta["privacy"]["u_shaped"] == 1
    assert dist.meta["privacy"].get("head_epsilon") == sim.meta["privacy"].get("head_epsilon")
    measured = dist.records[-1].measured_stage_seconds
    assert measured["device FP"] > 0 and measured["device BP"] > 0 and measured["uplink"] >= 0


@pytest.mark.parametrize("algorithm", ["sfl-v1", "adaptsfl"])
def test_partial_participation_runs_distributed_with_the_simulations_losses(tmp_path: Path, algorithm: str) -> None:
    """FedAvg under sampling over real processes: a device drawn after missing an average downloads the
    global model from the fed server rank first (its server copy too, SFL-V1), as in the simulator."""
    argv = ["--algorithm", algorithm, "--devices", "4", "--rounds", "5", "--participation", "0.5", "--cuts", "2",
            "--interval", "1", *SMALL]
    run = adaptplan("train", "--distributed", "--ranks", "4", *argv, "--out", str(tmp_path / "dist"))
    assert run.returncode == 0, run.stderr
    got, expected = losses(tmp_path / "dist"), simulate(tmp_path, "sim", argv)
    assert len(got) == 5 and max(abs(a - b) for a, b in zip(got, expected)) <= 1e-4
    drawn = [r.participants for r in History.load(tmp_path / "dist").records]
    assert all(len(p) == 2 for p in drawn) and len({d for p in drawn for d in p}) > 2


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


def _start(tmp_path: Path, argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "adaptplan.cli", "train", "--distributed", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[3])


@pytest.mark.parametrize("slowed", [("trainers.run.history", "History", "save"),
                                    ("trainers.run.driver", "Trainer", "evaluate")], ids=["files", "evaluation"])
def test_a_finished_run_exits_0_on_every_rank_however_long_rank_0_pauses(tmp_path: Path, slowed) -> None:
    """Issue 65: rank 0 writes the history, plot and event files after training, and evaluates on its own; the other
    ranks allow it 1.5 x 2 s of silence. They are released when training ends (Stop after the last evaluation), and
    rank 0 sends a heartbeat to a rank it has been silent to for a half time-out, so neither an 8 s history write
    nor an 8 s evaluation (at rounds 3 and 6, the last) ends them with code 3. The launcher returns 0 only when every
    rank did."""
    out = tmp_path / "run"
    run = finished_slowly(tmp_path, ["--distributed", "--algorithm", "sfl-v1", "--devices", "3", "--rounds", "6",
                                     "--rank-timeout", "2", *SMALL, "--cuts", "2", "--out", str(out)], seconds=8,
                          slowed=slowed)
    assert run.returncode == 0, run.stderr
    assert "sent nothing" not in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert [r.round for r in History.load(out).records] == [1, 2, 3, 4, 5, 6]


def test_a_killed_device_rank_stops_every_rank_cleanly_and_resume_continues(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = ["--algorithm", "adaptsfl", "--devices", "6", "--rounds", "400", "--checkpoint-every", "2",
            "--rank-timeout", "10", "--ranks", "4", *SMALL, "--cuts", "1,2,2,1,2,2", "--interval", "2"]
    proc = _start(tmp_path, [*argv, "--out", str(out)])
    try:
        wait_for(out / "checkpoint.pt", proc)
        pids = rank_pids(proc.pid)
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
    assert all(line.count("(") == line.count(")") for line in err.splitlines()), err   # no cut-off library text
    stopped_at = load_checkpoint(out)["round"]           # the last checkpoint is intact (its digest is checked)
    assert stopped_at >= 2
    kept = History.load(out)                             # and the history up to the last finished round
    assert len(kept.records) >= stopped_at and [r.round for r in kept.records] == list(range(1, len(kept.records) + 1))
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
        wait_for(out / "checkpoint.pt", proc)
        pids = rank_pids(proc.pid)
        os.kill(pids[2], signal.SIGSTOP)
        _, err = proc.communicate(timeout=60)      # without the --rank-timeout the run would hang: TimeoutExpired
    finally:
        for pid in rank_pids(proc.pid).values() if proc.poll() is None else []:
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3 and "Traceback" not in err
    assert "rank 2 (devices 0, 1, 2) sent nothing for 10 s" in err, err


def test_a_hanging_device_rank_under_partial_participation_is_left_behind(tmp_path: Path) -> None:
    """GAS allows absence: a device rank that stops answering is taken out after --rank-timeout, its
    devices' slots go to others and the run ends normally (the stopped process is then ended)."""
    out = tmp_path / "run"
    argv = ["--algorithm", "gas", "--active", "2", "--local-steps", "2", "--devices", "6", "--rounds", "40",
            "--checkpoint-every", "2", "--rank-timeout", "3", "--ranks", "4", *SMALL, "--cuts", "2"]
    proc = _start(tmp_path, [*argv, "--out", str(out)])
    try:
        wait_for(out / "checkpoint.pt", proc)
        pids = rank_pids(proc.pid)
        os.kill(pids[2], signal.SIGSTOP)
        _, err = proc.communicate(timeout=120)
    finally:
        for pid in rank_pids(proc.pid).values() if proc.poll() is None else []:
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert ("rank 2 (devices 0, 2, 4) sent nothing for 3 s (--rank-timeout): it hangs or is too slow; gas goes on "
            "without devices 0, 2, 4 (partial participation: they are absent from now on)") in err, err
    assert after_loss(out, {0, 2, 4}, 40) >= 2


def test_emulated_links_deliver_at_the_latency_models_time(tmp_path: Path) -> None:
    """With slow links written in the system file, every transfer's measured seconds are at least the
    size over the rate (never early, in every round) and, in the least delayed round, close to the latency
    model's prediction for the stage: a rank that the operating system does not run for a moment (five ranks
    on two cores) delays a round's measurement beyond the link's emulated time, never below it (seen: 1.06 s
    measured for a 0.10 s model upload in one round of three, the other two 0.099 s)."""
    device = {"flops": 1e9, "up_bps": 2e6, "down_bps": 4e6, "fed_up_bps": 8e6, "fed_down_bps": 8e6}
    system = {"batch_size": 16, "server_flops": 1e10, "edge_to_fed_bps": 1e7, "fed_to_edge_bps": 1e7,
              "devices": [device] * 3}
    (tmp_path / "system.json").write_text(json.dumps(system))
    argv = ["--algorithm", "sfl-v1", "--devices", "3", "--rounds", "3", *SMALL, "--cuts", "2",
            "--system", str(tmp_path / "system.json"), "--distributed", "--emulate-links", "--ranks", "5"]
    run = adaptplan("train", *argv, "--out", str(tmp_path / "dist"))
    assert run.returncode == 0, run.stderr
    records = History.load(tmp_path / "dist").records
    assert len(records) == 3
    for stage in ("uplink", "downlink", "model upload", "model download"):
        pairs = sorted((r.measured_stage_seconds[stage], r.stage_seconds[stage]) for r in records)
        assert all(predicted > 0.002 for _, predicted in pairs), (stage, pairs)    # slow enough links to matter
        assert all(measured >= predicted * 0.98 for measured, predicted in pairs), (stage, pairs)
        measured, predicted = pairs[0]                                            # the least delayed round
        assert measured <= predicted * 1.25 + 0.05, (stage, pairs)


def test_a_loopback_run_with_emulated_links_fits_the_links_it_emulated(tmp_path: Path, capsys) -> None:
    """Every link rate of the system fitted to what the run measured (adaptplan.measured_system, history.json
    meta.measured_system) is within 10 % of the rate written in the system file and emulated (issue 66 item 5);
    `adaptplan plan --system-from RUN` plans on that fitted system. Compute is not emulated: the FLOP/s fitted are
    this machine's, so only their presence is checked."""
    def device(up: float, down: float, fed_up: float, fed_down: float) -> dict:
        return {"flops": 1e9, "up_bps": up, "down_bps": down, "fed_up_bps": fed_up, "fed_down_bps": fed_down}

    system = {"batch_size": 16, "server_flops": 1e10, "edge_to_fed_bps": 1e6, "fed_to_edge_bps": 2e6,
              "devices": [device(2e5, 4e5, 8e5, 8e5), device(1e5, 3e5, 6e5, 5e5), device(3e5, 2e5, 4e5, 9e5)]}
    (tmp_path / "system.json").write_text(json.dumps(system))
    argv = ["--algorithm", "sfl-v1", "--devices", "3", "--rounds", "3", *SMALL, "--cuts", "2",
            "--system", str(tmp_path / "system.json"), "--distributed", "--emulate-links", "--ranks", "5"]
    run = adaptplan("train", *argv, "--out", str(tmp_path / "dist"))
    assert run.returncode == 0, run.stderr
    measured = History.load(tmp_path / "dist").meta["measured_system"]
    fitted = measured["system"]
    assert measured["base"] == {**system, "batch_size": 16}
    for name in ("edge_to_fed_bps", "fed_to_edge_bps"):
        assert abs(fitted[name] / system[name] - 1) <= 0.10, (name, fitted[name])
    for i, (emulated, got) in enumerate(zip(system["devices"], fitted["devices"])):
        for name in ("up_bps", "down_bps", "fed_up_bps", "fed_down_bps"):
            assert abs(got[name] / emulated[name] - 1) <= 0.10, (i, name, got[name])
        assert len(measured["rates"][f"devices[{i}].flops"]) == 3 and got["flops"] != emulated["flops"]
    assert main(["plan", "--system-from", str(tmp_path / "dist"), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert len(plan["cuts"]) == 3


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


# ---- security: loopback, authentication, data that stays on its device -----------------------------------------------
LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
"""127.0.0.1 and ::1 and ::ffff:127.0.0.1 as /proc/net/tcp{,6} write them."""


def _listening(pids: list[int]) -> set[tuple[int, str]]:
    """(pid, local address in /proc/net hex) of every listening TCP socket the processes hold."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:       # state LISTEN
                found.add((inodes[fields[9]], fields[1].split(":")[0]))
    return found


def test_a_local_run_listens_on_loopback_only_and_no_frame_carries_input_samples(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    trace.mkdir()
    env = dict(os.environ, ADAPTPLAN_WIRE_TRACE=str(trace))
    proc = subprocess.Popen([sys.executable, "-m", "adaptplan.cli", "train", "--distributed", "--dataset", "cifar10-subset",
                             "--model", "cnn", "--devices", "3", "--rounds", "4", "--cuts", "1,2,1", "--algorithm",
                             "sfl-v1", "--max-test-samples", "64", "--no-progress", "--out", str(tmp_path / "run")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=Path(__file__).resolve().parents[3])
    seen: set[tuple[int, str]] = set()
    ranks: dict[int, int] = {}
    while proc.poll() is None:
        ranks.update(rank_pids(proc.pid))
        seen |= _listening(list(ranks.values()))
        time.sleep(0.05)
    _, err = proc.communicate()
    assert proc.returncode == 0, err
    assert sorted(ranks) == [0, 1, 2, 3, 4]
    assert {pid for pid, _ in seen} == set(ranks.values()), seen        # every rank was seen listening (gloo's pairs)
    assert {address for _, address in seen} <= LOOPBACK, seen
    frames = [json.loads(line) for path in trace.glob("rank*.jsonl") for line in path.read_text().splitlines()]
    shapes = [tuple(shape) for f in frames for _, shape in f["tensors"]]
    assert {f["dst"] for f in frames} == {0, 1, 2, 3, 4}
    assert (16, 32, 16, 16) in shapes                                  # activations at cut 1 did cross (b = 16)
    assert not [s for s in shapes if s[-3:] == (3, 32, 32)], "an input sample crossed the wire"
    setup = [shape for f in frames if f["dst"] >= 2 and f["src"] == 0 for dtype, shape in f["tensors"]
             if dtype == "int64" and len(shape) == 1]                  # the positions of each device's samples instead
    from trainers.inputs.datasets import load_dataset
    from trainers.inputs.partition import local_test_split, partition_indices

    labels = load_dataset("cifar10-subset").y_train.numpy()                 # the run's partition and held-out split
    trained, _ = local_test_split(partition_indices(labels, 3, "iid", 0), 0.1, 0)
    assert sorted(s[0] for s in setup) == sorted(len(p) for p in trained)   # only the samples each device trains on


def _machines(ranks: dict[int, tuple[dict[str, str], list[str]]], timeout: float) -> tuple[list[int], list[str]]:
    """Start ``python -m adaptplan.distributed ARGV`` once per rank as torchrun would on separate
    machines (its environment, the TCP store on loopback, no local store file), each with its own
    extra environment; (exit codes, stderr texts) in rank order."""
    from trainers.distributed.launch import free_port

    port = str(free_port())
    procs = []
    for rank, (extra, argv) in sorted(ranks.items()):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(len(ranks)), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, GLOO_SOCKET_IFNAME="lo", **extra)
        env.pop("ADAPTPLAN_STORE_FILE", None)
        procs.append(subprocess.Popen([sys.executable, "-m", "adaptplan.distributed", *argv], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env, cwd=Path(__file__).resolve().parents[3]))
    errs = []
    try:
        for p in procs:
            errs.append(p.communicate(timeout=timeout)[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [p.returncode for p in procs], errs


def test_a_rank_with_another_secret_is_refused_across_two_machines(tmp_path: Path) -> None:
    """Two "machines" on loopback: torchrun's TCP store (no local store file), ranks 0 and 1 with one
    secret, rank 2 with another. Rank 2 refuses rank 0's first frame; every rank stops."""

    argv = ["--devices", "3", "--rounds", "2", "--rank-timeout", "10", *SMALL, "--cuts", "2"]
    codes, errs = _machines({rank: ({"ADAPTPLAN_SECRET": secret}, argv) for rank, secret in
                             ((0, "machine-A-secret-0123456789"), (1, "machine-A-secret-0123456789"),
                              (2, "machine-B-secret-0123456789"))}, timeout=120)
    assert codes == [3, 3, 3], errs
    assert "rank 0 (edge server) sent rank 2 a frame it refused: its authentication tag is wrong" in errs[2], errs
    assert all("Traceback" not in e for e in errs), errs
    assert "rank 2" in errs[0], errs[0]


def test_a_rank_without_a_secret_says_how_to_give_one(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTPLAN_SECRET")}
    env.update(RANK="1", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    run = subprocess.run([sys.executable, "-m", "adaptplan.distributed", "--devices", "3", *SMALL], capture_output=True,
                         text=True, env=env, timeout=120, cwd=Path(__file__).resolve().parents[3])
    assert run.returncode == 2
    assert run.stderr == ("adaptplan train: rank 1: ADAPTPLAN_SECRET_FILE: a rank needs the run's shared secret: set "
                          "ADAPTPLAN_SECRET_FILE to a file holding it (the same secret on every machine, e.g. from "
                          "'openssl rand -hex 32'), or ADAPTPLAN_SECRET; adaptplan train --distributed on one machine "
                          "makes one for its ranks itself\n")


def test_each_machine_holds_only_its_own_devices_files_and_the_losses_equal_the_simulation(tmp_path: Path) -> None:
    """A deployment with a per-device data folder (adaptplan split-data): four "machines" on loopback
    (torchrun's environment per rank). Rank 0 has the manifest and the test set only, rank 1 (fed
    server) no data, rank 2 the files of devices 0 and 2, rank 3 device 1's. The losses equal the
    simulator's on the whole folder, which equal those of the data set the folder was split from."""
    import shutil


    full = tmp_path / "full"
    assert main(["split-data", "--dataset", "synthetic", "--devices", "3", "--seed", "5", "--out", str(full)]) == 0
    folders = {0: ["manifest.json", "test.npz"], 1: [], 2: ["manifest.json", "device-0.npz", "device-2.npz"],
               3: ["manifest.json", "device-1.npz"]}
    for rank, names in folders.items():
        (tmp_path / f"machine{rank}").mkdir()
        for name in names:
            shutil.copy(full / name, tmp_path / f"machine{rank}" / name)
    argv = ["--algorithm", "sfl-v1", "--devices", "3", "--rounds", "3", *SMALL, "--cuts", "2"]
    codes, errs = _machines({rank: ({"ADAPTPLAN_SECRET": "one-run-secret-0123456789"},
                                    [*argv, "--device-data", str(tmp_path / f"machine{rank}"), "--out", str(tmp_path / "dist")])
                             for rank in folders}, timeout=180)
    assert codes == [0, 0, 0, 0], errs
    got = losses(tmp_path / "dist")
    on_folder = simulate(tmp_path, "sim-folder", [*argv, "--device-data", str(full)])
    on_dataset = simulate(tmp_path, "sim-dataset", argv)
    assert on_folder == on_dataset                                  # one process: bit-identical
    assert len(got) == 3 and max(abs(a - b) for a, b in zip(got, on_folder)) <= 1e-4
