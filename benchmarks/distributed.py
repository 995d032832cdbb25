"""torch.distributed runtime against the simulator, measured side by side in one run (issue 11).

    python benchmarks/distributed.py [--devices 3] [--rounds 30] [--model cnn] [--algorithm sfl-v1] [--mqtt]

Runs the same training three ways — the simulator, ``--distributed`` on loopback, and
``--distributed --emulate-links`` — (with ``--mqtt`` also ``--runtime mqtt``, with and without
emulated links, through a local Mosquitto broker with TLS) and prints:

* the per-round wall seconds of each (median over the rounds without evaluation, round 1 left out:
  it carries the ranks' first use of torch) and the distributed runtime's overhead per round;
* for both distributed runs, every stage's mean predicted seconds (latency model) next to the mean
  measured ones and their ratio (the table of ``adaptplan plot --predicted-vs-measured``);
* whether the training losses of the three runs agree (max |difference|);
* the time from killing one device rank (SIGKILL) to the end of every rank, and the exit code.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainers.run.history import History  # noqa: E402


def train(argv: list[str], out: Path) -> History:
    started = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "adaptplan.cli", "train", *argv, "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"{' '.join(argv)} failed ({run.returncode}):\n{run.stderr}")
    print(f"  {'mqtt' if 'mqtt' in argv else 'distributed' if '--distributed' in argv else 'simulated'}"
          f"{' + emulated links' if '--emulate-links' in argv else ''}: {time.perf_counter() - started:.1f} s in all",
          flush=True)
    return History.load(out)


def per_round_wall(history: History, eval_every: int) -> float:
    walls = [r.wall_seconds for r in history.records]
    steps = [b - a for a, b, r in zip(walls, walls[1:], history.records[1:]) if r.round % eval_every and r.round > 2]
    return statistics.median(steps)


def stage_table(history: History) -> str:
    lines = [f"    {'stage':<16}{'predicted s':>13}{'measured s':>13}{'measured/pred.':>16}"]
    first = history.records[0].round
    trimmed = History([r for r in history.records if r.round != first], history.meta, history.events)
    for row in trimmed.stage_comparison():
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
        lines.append(f"    {row['stage']:<16}{row['predicted_s']:>13.5f}{row['measured_s']:>13.5f}{ratio:>16}")
    return "\n".join(lines)


def kill_time(argv: list[str], out: Path) -> tuple[float, int, str]:
    proc = subprocess.Popen([sys.executable, "-m", "adaptplan.cli", "train", "--distributed", *argv,
                             "--rounds", "100000", "--checkpoint-every", "2", "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not (out / "checkpoint.pt").exists():
        if proc.poll() is not None:
            raise SystemExit(proc.communicate()[1])
        time.sleep(0.2)
    victim = None
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                environ = (entry / "environ").read_bytes()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == proc.pid and b"RANK=2\0" in environ:
                victim = int(entry.name)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    _, err = proc.communicate()
    return time.monotonic() - killed, proc.returncode, err.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--algorithm", default="sfl-v1")
    parser.add_argument("--cuts", default="2")
    parser.add_argument("--mqtt", action="store_true", help="also the MQTT runtime (needs mosquitto; docs/mqtt.md)")
    args = parser.parse_args()
    eval_every = 10
    common = ["--algorithm", args.algorithm, "--model", args.model, "--devices", str(args.devices), "--rounds",
              str(args.rounds), "--cuts", args.cuts, "--seed", "11", "--eval-every", str(eval_every),
              "--max-test-samples", "200", "--no-progress", "--threads", "1"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        print(f"{args.algorithm}, {args.model}, {args.devices} devices, {args.rounds} rounds, cuts {args.cuts}; "
              f"CPU cores: {os.cpu_count()}", flush=True)
        runs = {"simulator": train(common, tmp_path / "sim"),
                "distributed": train([*common, "--distributed"], tmp_path / "dist"),
                "distributed + emulated links": train([*common, "--distributed", "--emulate-links"], tmp_path / "emu")}
        if args.mqtt:
            runs["mqtt"] = train([*common, "--runtime", "mqtt"], tmp_path / "mqtt")
            runs["mqtt + emulated links"] = train([*common, "--runtime", "mqtt", "--emulate-links"], tmp_path / "mqtt-emu")
        sim = runs["simulator"]
        base = per_round_wall(sim, eval_every)
        print("\nwall seconds per round (median, rounds without evaluation):")
        for name, h in runs.items():
            w = per_round_wall(h, eval_every)
            print(f"  {name:<30}{w:>9.4f} s   ×{w / base:.2f} the simulator's   (+{w - base:.4f} s per round)")
        diff = max(abs(a.train_loss - b.train_loss) for h in runs.values() for a, b in zip(sim.records, h.records))
        print(f"\nmax |training loss difference| over {args.rounds} rounds: {diff:.3g}")
        for name, h in runs.items():
            if name != "simulator":
                print(f"\nper stage, {name} (rounds 2..):")
                print(stage_table(h))
        at = common.index("--rounds")
        took, code, err = kill_time(common[:at] + common[at + 2:], tmp_path / "kill")
        print(f"\nSIGKILL of rank 2 (a device rank): every rank ended {took:.1f} s later, exit code {code}; it said:")
        for line in err.splitlines():
            print(f"  {line}")


if __name__ == "__main__":
    main()
