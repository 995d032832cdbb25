#!/usr/bin/env python3
"""Hostile run files (issue 67 item 5): a checkpoint, a history, a run file and a device-data folder, each written
by a real run, then edited value by value (every key path of the file, each replaced by each of the hostile values
or deleted; a tensor also by one of another shape, another dtype, NaN and empty) and whole (empty, truncated,
foreign bytes, nested 10⁵ deep), and given to the commands that read it, in this process, as a user would:

* checkpoint.pt → ``train --resume`` (with a valid checksum: the edits reach the field checks);
* history.json → ``plot``, ``plan --pilots`` and ``train --resume`` (which reads only its run id: the history
  it continues is the checkpoint's, written anew);
* config.toml → ``train --config``;
* a ``split-data`` folder → ``train --device-data`` (manifest edits; member edits with the manifest's SHA-256
  recomputed, so that they reach the member checks).

Each case ends as one of: clean (exit 2, one error line, no traceback), accepted (exit 0), internal (exit 1, a
traceback or an escaping exception) or hang (no answer in ``--timeout`` s). Prints the counts per file and the
kinds of internal error; ``--accepted`` lists which edits were accepted (to be judged: a harmless value such as a
wall-clock time of 0 is accepted by design).

    python tools/hostile_files.py [checkpoint|history|run-file|device-folder ...] [--accepted] [--timeout S]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import io
import json
import math
import shutil
import signal
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from hostile_edits import DELETE, at, edited, paths  # noqa: E402

from adaptplan.cli import main as cli  # noqa: E402
from adaptplan.fileio import toml_value  # noqa: E402
from trainers.run.checkpoint import CHECKPOINT_NAME, decode, encode  # noqa: E402

HOSTILE: list[Any] = [DELETE, True, -1, 0, 10 ** 30, 10 ** 400, "x", [], {}, math.nan, math.inf, 1.5, [1, 2],
                      {"value": {}}]
BASE_FLAGS = ["--dataset", "synthetic", "--devices", "2", "--rounds", "4", "--eval-every", "1", "--interval", "1",
              "--no-progress", "--quiet"]


class Hang(BaseException):
    """The harness's time-out, raised into the command: a BaseException, so that the CLI's own handler of internal
    errors (``except Exception``) does not report it as one."""


def tensor_values(t: torch.Tensor) -> list[Any]:
    """A tensor's hostile replacements: another shape, another dtype, NaN, empty, 0-d."""
    flat = t.reshape(-1)
    out: list[Any] = [torch.cat([flat, flat[:1]]) if flat.numel() else torch.zeros(3), torch.zeros(0), torch.tensor(7)]
    if t.is_floating_point():
        out += [t.double(), torch.full_like(t, math.nan), torch.full_like(t, 1e38)]
    else:
        out += [t.float(), torch.full_like(t, -1)]
    return out


def deep(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


def command(argv: list[str], timeout: float) -> tuple[str, str]:
    """(outcome, the last error line) of ``adaptplan argv`` in this process."""
    err = io.StringIO()

    def alarm(*_):
        raise Hang

    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(int(timeout))
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = cli(argv)
    except Hang:
        return "hang", " ".join(argv)[:80]
    except BaseException as exc:  # noqa: BLE001 - what this harness counts
        return "internal", f"{type(exc).__name__}: {str(exc)[:80]}"
    finally:
        signal.alarm(0)
    text = err.getvalue()
    lines = [line for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if rc == 0:
        return "accepted", ""
    if rc == 2 and "Traceback" not in text and "internal error" not in text:
        return "clean", last
    return "internal", last[:160]


class Harness:
    def __init__(self, work: Path, timeout: float) -> None:
        self.work = work
        self.timeout = timeout
        self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.internal: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.accepted: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.base = work / "base"
        assert cli(["train", *BASE_FLAGS, "--checkpoint-every", "1", "--out", str(self.base)]) == 0
        self.data = work / "data"
        assert cli(["split-data", "--dataset", "synthetic", "--devices", "2", "--out", str(self.data)]) == 0

    def case(self, target: str, label: str, prepare: Callable[[Path], list[list[str]]]) -> None:
        """Copy the base run to a fresh folder, let ``prepare`` edit it and name the commands to run; count."""
        folder = self.work / "case"
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(self.base, folder / "run")
        shutil.copytree(self.data, folder / "data")
        for argv in prepare(folder):
            outcome, line = command(argv, self.timeout)
            self.counts[target]["cases"] += 1
            self.counts[target][outcome] += 1
            if outcome in ("internal", "hang"):
                self.internal[target][f"{argv[0]} {label}: {line}"] += 1
            elif outcome == "accepted":
                self.accepted[target][f"{argv[0]}: {label}"] += 1

    # ---- the files ----------------------------------------------------------------------------------------
    def checkpoint(self) -> None:
        state = decode((self.base / CHECKPOINT_NAME).read_bytes(), "base")
        resume = ["train", "--resume", "--rounds", "5", "--no-progress", "--quiet", "--out"]

        def write(state_or_bytes: Any) -> Callable[[Path], list[list[str]]]:
            def prepare(folder: Path) -> list[list[str]]:
                data = state_or_bytes if isinstance(state_or_bytes, bytes) else encode(state_or_bytes)
                (folder / "run" / CHECKPOINT_NAME).write_bytes(data)
                return [resume + [str(folder / "run")]]
            return prepare

        whole = encode(state)
        for label, data in [("empty", b""), ("truncated", whole[: len(whole) // 2]), ("foreign", b"\x80" * 4096),
                            ("deep", _deep_checkpoint(state)), ("not a dict", encode([1, 2]))]:
            self.case("checkpoint", label, write(data))
        for path in paths(state, every_item=False):
            original = at(state, path)
            values = HOSTILE + (tensor_values(original) if torch.is_tensor(original) else [])
            for value in values:
                self.case("checkpoint", f"{_show(path)} = {_value(value)}", write(edited(state, path, value)))

    def history(self) -> None:
        doc = json.loads((self.base / "history.json").read_text())
        consumers = lambda folder: [  # noqa: E731 (the resume last: it writes history.json anew from its checkpoint)
            ["plot", str(folder / "run"), "-o", str(folder / "plot.png")],
            ["plan", "--pilots", str(folder / "run"), "--target-accuracy", "0.05"],
            ["train", "--resume", "--rounds", "5", "--no-progress", "--quiet", "--out", str(folder / "run")]]

        def write(text: str) -> Callable[[Path], list[list[str]]]:
            def prepare(folder: Path) -> list[list[str]]:
                (folder / "run" / "history.json").write_text(text)
                return consumers(folder)
            return prepare

        for label, text in [("empty", ""), ("truncated", json.dumps(doc)[:200]), ("foreign", "\x00" * 100),
                            ("deep", "[" * 100_000 + "]" * 100_000), ("a list", "[1, 2]")]:
            self.case("history", label, write(text))
        for path in paths(doc, every_item=False):
            for value in HOSTILE:
                new = edited(doc, path, value)
                self.case("history", f"{_show(path)} = {_value(value)}", write(json.dumps(new)))

    def run_file(self) -> None:
        import tomllib

        text = (self.base / "config.toml").read_text()
        doc = tomllib.loads(text)

        def write(body: str, *flags: str) -> Callable[[Path], list[list[str]]]:
            def prepare(folder: Path) -> list[list[str]]:
                (folder / "run.toml").write_text(body)
                return [["train", "--config", str(folder / "run.toml"), "--out", str(folder / "new"), *flags]]
            return prepare

        # an empty run file is valid: the default run, here with BASE_FLAGS (the whole default run outlasts --timeout)
        self.case("run-file", "empty", write("", *BASE_FLAGS))
        for label, body in [("foreign", "\x80\x81"), ("deep", "a = " + "[" * 100_000 + "]" * 100_000),
                            ("truncated", text[: len(text) // 2] + '"')]:
            self.case("run-file", label, write(body))
        for key in doc:
            for value in HOSTILE:
                new = {k: v for k, v in doc.items() if not (k == key and value is DELETE)}
                if value is not DELETE:
                    new[key] = value
                self.case("run-file", f"{key} = {_value(value)}", write(_toml(new)))

    def device_folder(self) -> None:
        manifest = json.loads((self.data / "manifest.json").read_text())
        train = lambda folder: [["train", "--device-data", str(folder / "data"), "--devices", "2",  # noqa: E731
                                 "--rounds", "1", "--no-progress", "--quiet", "--out", str(folder / "new")]]

        def write_manifest(doc: Any) -> Callable[[Path], list[list[str]]]:
            def prepare(folder: Path) -> list[list[str]]:
                (folder / "data" / "manifest.json").write_text(json.dumps(doc))
                return train(folder)
            return prepare

        for path in paths(manifest, every_item=False):
            for value in HOSTILE:
                self.case("device-folder", f"manifest {_show(path)} = {_value(value)}",
                          write_manifest(edited(manifest, path, value)))
        with np.load(self.data / "device-0.npz") as arrays:
            x, y = arrays["x"], arrays["y"]
        members: list[tuple[str, dict[str, np.ndarray] | bytes]] = [
            ("x of another shape", {"x": x.reshape(len(x), -1), "y": y}),
            ("x with one row less", {"x": x[:-1], "y": y}),
            ("x float64", {"x": x.astype(np.float64), "y": y}),
            ("x object", {"x": x.astype(object), "y": y}),
            ("x NaN", {"x": np.full_like(x, np.nan, dtype=np.float32) if x.dtype.kind == "f" else x, "y": y}),
            ("y out of range", {"x": x, "y": np.full_like(y, 10 ** 6)}),
            ("y negative", {"x": x, "y": np.full_like(y, -1)}),
            ("y float", {"x": x, "y": y.astype(np.float32)}),
            ("y 2-D", {"x": x, "y": y.reshape(-1, 1)}),
            ("no y", {"x": x}),
            ("extra member", {"x": x, "y": y, "z": y}),
            ("x a bomb", _bomb(x, y)),
            ("empty file", b""),
            ("truncated", (self.data / "device-0.npz").read_bytes()[:1000]),
        ]
        for label, content in members:
            for name in ("device-0.npz", "test.npz"):
                def prepare(folder: Path, content=content, name=name) -> list[list[str]]:
                    data = content if isinstance(content, bytes) else _npz(content)
                    (folder / "data" / name).write_bytes(data)
                    doc = json.loads((folder / "data" / "manifest.json").read_text())
                    digest = hashlib.sha256(data).hexdigest()
                    if name == "test.npz":
                        doc["test_sha256"] = digest
                    else:
                        doc["devices"][0]["sha256"] = digest
                    (folder / "data" / "manifest.json").write_text(json.dumps(doc))
                    return train(folder)
                self.case("device-folder", f"{name}: {label}", prepare)


def _deep_checkpoint(state: dict[str, Any]) -> bytes:
    """``state`` with its engine a list nested 5,000 deep (written with a raised recursion limit, as a crafted
    file could be)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(50_000)
    try:
        return encode({**state, "engine": deep(5_000)})
    finally:
        sys.setrecursionlimit(limit)


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _bomb(x: np.ndarray, y: np.ndarray) -> bytes:
    """An npz whose x member declares the right header but inflates to 1 GiB of zeros."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("x.npy", "w", force_zip64=True) as fh:
            header = io.BytesIO()
            np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                          "shape": (2 ** 28,)})
            fh.write(header.getvalue())
            chunk = b"\0" * 2 ** 24
            for _ in range(64):
                fh.write(chunk)
        y_bytes = io.BytesIO()
        np.save(y_bytes, y)
        z.writestr("y.npy", y_bytes.getvalue())
    return buffer.getvalue()


def _toml(doc: dict[str, Any]) -> str:
    lines = []
    for key, value in doc.items():
        lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    """adaptplan.fileio.toml_value, and a table (a hostile value) inline."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return toml_value(value)


def _show(path: tuple) -> str:
    return ".".join(str(k) for k in path)[:70]


def _value(value: Any) -> str:
    if value is DELETE:
        return "delete"
    if torch.is_tensor(value):
        return f"tensor{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return repr(value)[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    targets = ("checkpoint", "history", "run-file", "device-folder")
    parser.add_argument("targets", nargs="*", choices=targets, default=list(targets))
    parser.add_argument("--accepted", action="store_true")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="hostile-files-") as tmp:
        harness = Harness(Path(tmp), args.timeout)
        for target in args.targets:
            getattr(harness, target.replace("-", "_"))()
            c = harness.counts[target]
            print(f"{target}: cases {c['cases']}, clean {c['clean']}, accepted {c['accepted']}, internal "
                  f"{c['internal']}, hang {c['hang']}", flush=True)
            for kind, n in harness.internal[target].most_common():
                print(f"  {n:5d}  {kind}", flush=True)
            if args.accepted:
                for kind, n in sorted(harness.accepted[target].items()):
                    print(f"  accepted {kind} ({n})", flush=True)


if __name__ == "__main__":
    main()
