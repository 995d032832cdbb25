"""Runs of ``adaptplan`` in other processes, shared by the torch.distributed and MQTT runtime tests: the command
in a fresh interpreter, a run folder's losses, the simulator's losses for the same options, the ranks of a
launcher, waiting for a file, and the check of a run that went on after losing devices."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from adaptplan.cli import main
from trainers.run.history import History


def adaptplan(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``adaptplan ARGV`` in a fresh interpreter (as a user runs it)."""
    return subprocess.run([sys.executable, "-m", "adaptplan.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=Path(__file__).resolve().parents[1])

def finished_slowly(tmp_path: Path, argv: list[str], seconds: float, timeout: float = 240,
                    slowed: tuple[str, str, str] = ("trainers.run.history", "History", "save")) -> subprocess.CompletedProcess:
    """``adaptplan train ARGV`` whose rank 0 (``RANK=0``) sleeps ``seconds`` before each call of the method ``slowed``
    (module, class, method; default :meth:`History.save`, the history write rank 0 does after training): a
    ``sitecustomize`` module on ``PYTHONPATH`` wraps it."""
    module, cls, method = slowed
    hook = tmp_path / "slow_rank0"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent(f"""\
        import os, time
        if os.environ.get("RANK") == "0":
            from {module} import {cls} as owner
            _slowed = owner.{method}
            def slow(self, *args, **kwargs):
                time.sleep({seconds!r})
                return _slowed(self, *args, **kwargs)
            owner.{method} = slow
        """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "adaptplan.cli", "train", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=Path(__file__).resolve().parents[1], env=env)

def losses(folder: Path) -> list[float]:
    return [r.train_loss for r in History.load(folder).records]

def simulate(tmp_path: Path, name: str, argv: list[str]) -> list[float]:
    assert main(["train", *argv, "--out", str(tmp_path / name)]) == 0
    return losses(tmp_path / name)

def rank_pids(launcher: int) -> dict[int, int]:
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

def wait_for(path: Path, proc: subprocess.Popen, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)

def after_loss(out: Path, lost: set[int], rounds: int) -> int:
    """Check a run that went on after losing ``lost``: ``rounds`` rounds, and after the first one that
    counted them absent (in which they may have stepped before they were lost) none of them took
    part; that first round."""
    records = History.load(out).records
    assert [r.round for r in records] == list(range(1, rounds + 1))
    first = next(r.round for r in records if r.metrics.get("absent_devices") == len(lost))
    assert first < rounds and all(r.metrics["absent_devices"] == len(lost) for r in records[first - 1:])
    assert all(not lost & set(r.participants) and r.participants for r in records[first:])
    return first


LIES = {
    "E1 shape": "msg.tensor = torch.zeros(msg.tensor.shape[0], 3)",
    "E2 float64": "msg.tensor = msg.tensor.double()",
    "E3 labels 10^12": "msg.labels = torch.full_like(msg.labels, 10**12)",
    "E4 15 labels for 16 rows": "msg.labels = msg.labels[:-1]",
    "E5 empty": "msg.tensor, msg.labels = msg.tensor[:0], msg.labels[:0]",
    "E7 3e38": "msg.tensor = torch.full_like(msg.tensor, 3e38)",
    "E6 upload shape": "first = next(iter(msg.blocks.values())); name = next(iter(first.state)); "
                       "first.state[name] = torch.zeros(2)",
    "E8 weight 1e30": "msg.weight = 1e30",
    "S1 the next step's number": "msg.step = msg.step + 1",
    "none": "pass",
    "R1 report of another device": "msg.seconds = {'device FP': {1: 1e5}}",
}
"""Issue 67's lies of a device that holds the run's secret: Python run on device 0's message (``msg``) before it
leaves (an :class:`Activation` for E1–E5 and E7, a :class:`ModelUpload` for E6 and E8, the rank's :class:`Report` of its
measured seconds for R1)."""


def lying_device(tmp_path: Path, lie: str, argv: list[str], timeout: float = 240, code: str | None = None,
                 message: str | None = None) -> subprocess.CompletedProcess:
    """``adaptplan train ARGV`` whose device 0 sends, from round 2 on, the message :data:`LIES` ``[lie]`` (or
    ``code``) makes of its honest one (a ``sitecustomize`` module on ``PYTHONPATH`` wraps ``Device.forward`` or
    ``Device.upload`` in every rank but 0 and 1, the servers). ``message``: "forward", "upload" or "report" (default:
    from the lie's name, R… a report, E6 and E8 an upload)."""
    code = LIES[lie] if code is None else code
    message = message or ("report" if lie.startswith("R") else "upload" if lie.startswith(("E6", "E8")) else "forward")
    method = message
    hook = tmp_path / "lying_device"
    hook.mkdir(exist_ok=True)
    if message == "report":                       # the rank's own message: every one device 0's rank sends
        (hook / "sitecustomize.py").write_text(textwrap.dedent(f"""\
            import os
            if os.environ.get("RANK") == "2":
                from trainers.distributed.control import Report
                from trainers.distributed.transport import FrameChannel
                _honest = FrameChannel.send
                def lying(self, msg, *args, **kwargs):
                    if isinstance(msg, Report):
                        {code}
                    return _honest(self, msg, *args, **kwargs)
                FrameChannel.send = lying
            """))
    else:
        (hook / "sitecustomize.py").write_text(textwrap.dedent(f"""\
        import os
        if os.environ.get("RANK") not in (None, "0", "1"):
            import torch
            from trainers.roles.core import Device
            _honest = Device.{method}
            def lying(self, round_index, *args, **kwargs):
                msg = _honest(self, round_index, *args, **kwargs)
                if self.index == 0 and round_index >= 2:
                    {code}
                return msg
            Device.{method} = lying
        """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "adaptplan.cli", "train", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=Path(__file__).resolve().parents[1], env=env)

