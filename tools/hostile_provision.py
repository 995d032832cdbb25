#!/usr/bin/env python3
"""Hostile ``adaptplan provision`` (issue 67 item 5): each of its options given each hostile value (numbers at and
past their ends, text, empty, shell syntax, a path outside the folder, a newline, 10,000 characters), and hostile
training options after ``--``, in this process as a user would.

Each case ends as one of: clean (exit 2, one line naming the option, nothing written), accepted and sound (exit 0;
every file written private to its owner, nothing written outside --out, and each kit's run.sh — run with a Python
stand-in that records its arguments — passes exactly the options given and sources a rank.env whose values are
the ones given, with no command of the value run), unsound (accepted, but one of those fails), internal (a
traceback or an escaping exception). Prints the counts and each case that is not clean or sound.

    python tools/hostile_provision.py
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adaptplan.cli import main as cli  # noqa: E402

PWNED = "hostile-provision-ran"
SHELL = [f"$(touch {PWNED})", f"`touch {PWNED}`", f"x; touch {PWNED}", f"x\ntouch {PWNED}", "'\"", "a b"]
TEXT = ["", "x", "-1", "0", "1.5", "1e30", "9" * 400, "nan", "inf", "x" * 10_000, "../../outside", "/", "é☃"]
OPTIONS = {"--broker": ["127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1", ":1883", "[::1]:1883",
                        "host name:1883"],
           "--devices": ["1", "2", "100000"], "--ranks": ["1", "2", "3", "100"], "--run": ["a/b", "+", "#", "$SYS"],
           "--days": ["0", "36500", "100000"]}
OUT = ["/", "", ".", "x" * 300, "/proc/x", "/dev/null", "a\nb", f"$(touch {PWNED})"]
VALID = {"--broker": "127.0.0.1:8883", "--devices": "2"}
TRAINING = [["--rounds", v] for v in ["0", "-1", "x", "9" * 400]] + [["--model", v] for v in SHELL] + \
           [["--data-dir", v] for v in SHELL] + [["--ranks", "9"], ["--runtime", "gloo"], ["--out", "/"]]
STAND_IN = "#!/bin/sh\nprintf '%s\\0' \"$@\" > argv.bin\n"


def provision(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli(["provision", *argv]) or 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception as exc:  # noqa: BLE001 - what this harness counts
            return -1, f"{type(exc).__name__}: {exc}"[:120]
    return code, err.getvalue()


def sound(out: Path, given: dict[str, str], training: list[str], cwd: Path) -> str:
    """'' when the deployment written in ``out`` is sound, else why not."""
    for path in out.rglob("*"):
        if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            return f"{path} is readable by others"
    if out != cwd and set(p.name for p in cwd.iterdir()) != {out.name}:
        return f"wrote beside --out: {sorted(p.name for p in cwd.iterdir())}"
    for kit in sorted((out / "kits").iterdir()):
        stand_in = kit / "python-stand-in"
        stand_in.write_text(STAND_IN)
        stand_in.chmod(0o700)
        subprocess.run(["sh", str(kit / "run.sh")], env=dict(os.environ, ADAPTPLAN_PYTHON=str(stand_in)),
                       cwd=cwd, timeout=30, capture_output=True)
        argv = (kit / "argv.bin").read_bytes().decode().split("\0")[:-1]
        if argv[:2] != ["-m", "adaptplan.distributed"] or argv[2:][-len(training) or len(argv):] != training \
                and training:
            return f"{kit.name}/run.sh passed {argv[2:]}"
        env = subprocess.run(["sh", "-c", "set -a; . ./rank.env; set +a; env -0"], cwd=kit, capture_output=True,
                             timeout=30).stdout.decode().split("\0")
        values = dict(line.split("=", 1) for line in env if "=" in line)
        if "--broker" in given and values.get("ADAPTPLAN_MQTT_BROKER") != given["--broker"].replace("[", "").replace(
                "]", ""):                                  # [::1]:1883 is written ::1:1883 (split at the last colon)
            return f"{kit.name}/rank.env gives the broker as {values.get('ADAPTPLAN_MQTT_BROKER')!r}"
        if "--run" in given and values.get("ADAPTPLAN_MQTT_RUN") != given["--run"]:
            return f"{kit.name}/rank.env gives the run as {values.get('ADAPTPLAN_MQTT_RUN')!r}"
        if any(p.name == PWNED for p in [*kit.iterdir(), *cwd.iterdir()]):
            return f"{kit.name}: a value ran as a command"
    return ""


def written(cwd: Path, out: str) -> bool:
    try:
        return any(cwd.iterdir()) or (out not in ("/", ".", "", "/dev/null") and (cwd / out).exists())
    except OSError:
        return False


def cases() -> list[tuple[str, dict[str, str], list[str]]]:
    out = []
    for option, own in OPTIONS.items():
        for value in [*own, *TEXT, *SHELL]:
            out.append((f"{option} {value[:24]!r}", {**VALID, option: value}, []))
    for value in OUT:
        out.append((f"--out {value[:24]!r}", {**VALID, "--out": value}, []))
    for training in TRAINING:
        out.append((f"-- {' '.join(training)[:30]!r}", dict(VALID), training))
    return out


def main() -> None:
    counts: collections.Counter = collections.Counter()
    notes = []
    for name, given, training in cases():
        with tempfile.TemporaryDirectory(prefix="hostile-provision-") as folder:
            cwd = Path(folder)
            out = given.get("--out", "kit")
            argv = [x for k, v in {**given, "--out": out}.items() for x in (k, v)] + (["--", *training] if training
                                                                                    else [])
            before = os.getcwd()
            os.chdir(cwd)
            try:
                code, err = provision(argv)
                if code == 0:
                    why = sound(cwd / out, given, training, cwd) if (cwd / out).is_dir() else "no folder written"
                    result = "sound" if not why else "unsound"
                elif code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1 \
                        and not written(cwd, out):
                    result, why = "clean", ""
                else:
                    result, why = "internal", err.strip().splitlines()[-1] if err.strip() else f"exit {code}"
            finally:
                os.chdir(before)
        counts[result] += 1
        if result not in ("clean", "sound"):
            notes.append(f"{name}: {result}: {why}")
    print(f"cases {sum(counts.values())}, clean {counts['clean']}, accepted and sound {counts['sound']}, "
          f"unsound {counts['unsound']}, internal {counts['internal']}")
    for note in notes:
        print("  " + note)
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
