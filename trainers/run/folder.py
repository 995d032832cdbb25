"""A run folder (``--out``) that is checked before training and owned by one run at a time.

* The folder must be creatable and writable — checked before the first round, not after the last.
* The folder must be new, empty or an adaptplan run folder: one that holds a file only adaptplan writes
  (:data:`SIGNATURES`: a ``checkpoint.pt``, ``history.json`` or ``config.toml`` that begins as adaptplan's do). Any
  other folder (``--out /``, ``/etc``, a project's own folder) is refused before anything is written, so
  ``overwrite`` only ever removes the files of an adaptplan run.
* A folder that already holds a run (``history.json`` or ``checkpoint.pt``) is continued only with
  ``resume`` and replaced only with ``overwrite`` (its run files are then removed first).
* While a run writes to it, the folder is locked (``fcntl.flock`` on ``.adaptplan.lock``, removed when the run
  ends); a second run on the same folder is refused with the first one's process id. Temporary files a killed run left
  behind (``.checkpoint.pt.*.tmp`` and the like, :func:`adaptplan.fileio.atomic_write`) are removed once
  the lock is held.
* :class:`StopRequest` turns SIGINT/SIGTERM into a request honoured at the end of the round, so the
  run can save its checkpoint and history and exit with a message; a second signal stops at once.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from pathlib import Path
from types import FrameType

from adaptplan.errors import InputError

RUN_FILES = ("history.json", "history.csv", "checkpoint.pt", "accuracy.png", "config.toml")
TRACKING_FOLDER = "tensorboard"
"""The event files' folder (trainers/run/tracking.py), removed with the run files by --overwrite."""
LOCK_NAME = ".adaptplan.lock"
SIGNATURES = {"checkpoint.pt": b"adaptplan-checkpoint ", "history.json": b'{\n  "meta": {',
              "config.toml": b"# adaptplan train --config "}
"""How each file that only an adaptplan run writes begins (trainers/run/checkpoint.py's header, history.json's
first key as :func:`trainers.run.history.history_text` writes it, the run file's first line)."""
BOOKKEEPING = (LOCK_NAME, ".adaptplan-write-test")
"""Names a run leaves only while it runs (and a killed one behind): no sign that a folder is somebody else's."""


class RunFolder:
    """Context manager preparing and locking ``path`` (module docstring)."""

    def __init__(self, path: str | os.PathLike, resume: bool = False, overwrite: bool = False) -> None:
        self.path = Path(path)
        self.resume, self.overwrite = resume, overwrite
        self._fd: int | None = None

    def check(self) -> None:
        """What can be told without touching the folder: a file where it or a parent should be, or a run already
        there that neither --resume nor --overwrite asked for (the CLI asks before torch loads; :meth:`__enter__`
        asks again, holding the lock)."""
        self._check_is_folder()
        self._check_empty_or_run()
        self._check_no_other_run()

    def _check_empty_or_run(self) -> None:
        """Refuse an existing folder that holds anything but is no adaptplan run folder (module docstring)."""
        if not self.path.is_dir() or is_run_folder(self.path):
            return
        try:
            foreign = sorted(e.name for e in os.scandir(self.path)
                             if e.name not in BOOKKEEPING and not (e.name.startswith(".") and e.name.endswith(".tmp")))
        except OSError as exc:
            raise InputError(f"cannot read {str(self.path)!r}: {exc.strerror or exc}", field="--out") from None
        if foreign:
            shown = ", ".join(repr(name) for name in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise InputError(f"{str(self.path)!r} holds files that are not an adaptplan run's ({shown}): name a new or "
                             "empty folder, or the folder of an earlier adaptplan train run", field="--out")

    def _check_is_folder(self) -> None:
        path = self.path
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            raise InputError(f"{str(path)!r} must be a folder ({str(blocker)!r} is a file)", field="--out")

    def _check_no_other_run(self) -> None:
        existing = [name for name in ("history.json", "checkpoint.pt") if (self.path / name).exists()]
        if existing and not self.resume and not self.overwrite:
            raise InputError(f"{str(self.path)!r} already holds a run ({', '.join(existing)}); pass --resume to "
                             "continue it or --overwrite to replace it", field="--out")

    def __enter__(self) -> "RunFolder":
        path = self.path
        self._check_is_folder()
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / ".adaptplan-write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise InputError(f"cannot write into {str(path)!r}: {exc.strerror or exc}", field="--out") from None
        self._lock()
        self._remove_stale_temporaries()
        try:
            self._check_empty_or_run()
            self._check_no_other_run()
        except InputError:
            self.release()
            raise
        if self.overwrite and not self.resume:
            for name in RUN_FILES:
                try:
                    (path / name).unlink()
                except FileNotFoundError:
                    pass
            shutil.rmtree(path / TRACKING_FOLDER, ignore_errors=True)
        return self

    def _remove_stale_temporaries(self) -> None:
        """Delete the temporary files of an interrupted atomic write of a run file (no writer is left: the lock
        is ours)."""
        for name in RUN_FILES:
            for stale in self.path.glob(f".{name}.*.tmp"):
                try:
                    stale.unlink()
                except OSError:
                    pass

    def _lock(self) -> None:
        """Hold ``.adaptplan.lock``: the lock file is removed when the run ends (:meth:`release`), so a lock taken on
        a file that its owner has just removed is let go and taken again on the file now at that name."""
        import fcntl

        lock = self.path / LOCK_NAME
        while True:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise InputError(f"cannot lock {str(self.path)!r}: {exc.strerror or exc}", field="--out") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                owner = os.read(fd, 32).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise InputError(f"{str(self.path)!r} is in use by another adaptplan run (process {owner}); wait for it "
                                 "or choose another --out", field="--out") from None
            if _same_file(fd, lock):
                break
            os.close(fd)                 # removed by the run that held it, between our open and our lock
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        except OSError as exc:   # a full disk (ENOSPC) or quota: the lock's owner cannot be recorded
            os.close(fd)
            raise InputError(f"cannot write into {str(self.path)!r}: {exc.strerror or exc}", field="--out") from None
        self._fd = fd

    def release(self) -> None:
        """Remove the lock file (still holding it, so no other run holds it then) and let it go: a finished run
        leaves no ``.adaptplan.lock`` behind."""
        if self._fd is not None:
            import fcntl

            try:
                (self.path / LOCK_NAME).unlink()
            except OSError:
                pass                     # removed by hand, or a read-only folder: the lock is let go all the same
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __exit__(self, *exc: object) -> None:
        self.release()


def is_run_folder(path: Path) -> bool:
    """Whether ``path`` holds a file that only an adaptplan run writes (:data:`SIGNATURES`, read from its head)."""
    for name, head in SIGNATURES.items():
        if not (path / name).is_file():          # not a FIFO or device, whose read could block or never end
            continue
        try:
            with open(path / name, "rb") as fh:
                if fh.read(len(head)) == head:
                    return True
        except OSError:
            continue
    return False


def _same_file(fd: int, path: Path) -> bool:
    """Whether the open ``fd`` is the file now at ``path`` (not one removed from there since it was opened)."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


class Interrupted(Exception):
    """The run stopped at a round boundary on a signal; ``round`` is the last completed round; ``resume`` the
    command that continues it from ``saved`` (:func:`trainers.config.train_config.resume_command`)."""

    def __init__(self, signum: int, round_index: int, saved: str | None, resume: str = "") -> None:
        self.signum, self.round, self.saved, self.resume = signum, round_index, saved, resume
        name = signal.Signals(signum).name
        where = f"; checkpoint and history saved in {saved!r} — continue with: {resume}" if saved else ""
        super().__init__(f"interrupted by {name} after round {round_index}{where}")

    def __reduce__(self) -> tuple[type, tuple[int, int, str | None, str]]:
        """Pickled with its own arguments: a bench's worker process sends it to the bench as its run's result, and
        an exception rebuilt from its message alone (``Exception.__reduce__``) failed to unpickle there."""
        return type(self), (self.signum, self.round, self.saved, self.resume)


class StopRequest:
    """While active, the first SIGINT/SIGTERM sets ``signum`` (the loop stops at the end of the
    round); a second one raises KeyboardInterrupt at once. Inactive outside the main thread."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous = {}
