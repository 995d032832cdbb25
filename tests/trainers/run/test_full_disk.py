"""A full disk during a command names the path it could not write (issue 25): the run folder when its
lock cannot be written, the file the standard output is redirected to, and — on a real full file
system where this machine can mount one — every write of a training run."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from adaptplan.cli import main
from adaptplan.errors import InputError
from trainers.run import folder as run_folder
from trainers.run.folder import RunFolder

NO_SPACE = OSError(errno.ENOSPC, "No space left on device")


def test_a_run_folder_whose_lock_cannot_be_written_is_named(tmp_path, monkeypatch) -> None:
    def full(fd, data):
        raise NO_SPACE

    monkeypatch.setattr(run_folder.os, "write", full)
    with pytest.raises(InputError) as info:
        with RunFolder(tmp_path / "run"):
            pass
    monkeypatch.undo()
    assert info.value.field == "--out"
    assert str(info.value).endswith(f"cannot write into {str(tmp_path / 'run')!r}: No space left on device")
    with RunFolder(tmp_path / "run"):      # the descriptor was closed and nothing is left locked
        pass


@pytest.mark.parametrize("error, named", [(OSError(errno.ENOSPC, "No space left on device"), True),
                                          (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
                                          (OSError(errno.EACCES, "Permission denied"), False)])
def test_a_full_disk_under_a_redirected_standard_output_names_the_file(tmp_path, monkeypatch, capsys, error,
                                                                       named) -> None:
    from adaptplan.cli.commands import plan

    def fail(args):
        raise error

    monkeypatch.setattr(plan, "run", fail)
    with open(tmp_path / "out.txt", "w") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main(["plan"]) == 2
    err = capsys.readouterr().err
    if named:
        assert err == (f"adaptplan plan: error: cannot write the standard output ({str(tmp_path / 'out.txt')!r}): "
                       f"{error.strerror}\n")
    else:   # not a full disk: not blamed on the standard output
        assert err == f"adaptplan plan: error: cannot use: {error.strerror}\n"


def test_a_full_disk_with_output_to_a_terminal_or_pipe_is_not_blamed_on_it(monkeypatch, capsys) -> None:
    from adaptplan.cli.commands import plan

    def fail(args):
        raise NO_SPACE

    monkeypatch.setattr(plan, "run", fail)
    assert main(["plan"]) == 2          # pytest's captured standard output is no regular file
    assert capsys.readouterr().err == "adaptplan plan: error: cannot use: No space left on device\n"


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs filled to the last byte (needs root and mount rights: skipped elsewhere)."""
    mount = tmp_path / "full"
    mount.mkdir()
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                                                       capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small file system here")
    try:
        with open(mount / "filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_training_into_a_full_disk_names_the_run_folder_and_stdout_file(full_disk) -> None:
    command = [sys.executable, "-m", "adaptplan.cli", "train", "--dataset", "synthetic", "--model", "mlp",
               "--devices", "2", "--cuts", "1", "--rounds", "2", "--no-progress", "--threads", "1"]
    folder = full_disk / "run"
    result = subprocess.run([*command, "--out", str(folder)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (f"adaptplan train: error: --out: cannot write into {str(folder)!r}: "
                                              "No space left on device")
    with open(full_disk / "log.txt", "w") as stdout:
        result = subprocess.run(command, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (f"adaptplan train: error: cannot write the standard output "
                                              f"({str(full_disk / 'log.txt')!r}): No space left on device")
    assert "Exception ignored" not in result.stderr
