"""A run as a file: the TOML that ``adaptplan train --config FILE`` reads and every run folder holds as
``config.toml`` (docs/formats.md "Run files").

One key per ``adaptplan train`` option, named by its flag without the dashes (``batch-size = 16``,
``no-progress = true``, ``cuts = [2, 2, 2]``, ``runtime = "mqtt"``; an algorithm's options by theirs,
``cycle-base = "psl"``); ``_`` may stand for ``-``. The options without a flag (Python-only) are written under
their flat key when they differ from their default. :func:`run_file_text` writes the resolved configuration of
a run — every option, the algorithm's defaults filled in — so that training from it reproduces the run bit for
bit; where to write it (``--out``, ``--resume``, ``--overwrite``) is left to the one who runs it. Torch-free.
"""

from __future__ import annotations

from typing import Any

from adaptplan.fileio import toml_value
from trainers.algorithms import ALGORITHM_OPTIONS
from trainers.config.fields import described
from trainers.config.train_config import DEFAULTS, PARTS, TrainConfig

FILE_NAME = "config.toml"
"""The run file in every run folder."""
NOT_WRITTEN = ("out", "resume", "overwrite", "distributed", "transport")
"""Flat keys a run file leaves out: where a run writes is its runner's choice; ``runtime`` stands for the last two."""


def run_file_entries(config: TrainConfig) -> dict[str, Any]:
    """Key (a flag without its dashes, or a Python-only option's flat key) → value, in the options' order."""
    out: dict[str, Any] = {"algorithm": config.algorithm}
    runtime = "simulator" if not config.runtime.distributed else ("mqtt" if config.runtime.transport == "mqtt" else "torch")
    for cls in PARTS.values():
        for d in described(cls):
            value = config.value(d.key)
            if d.key in NOT_WRITTEN or value is None:
                continue
            if d.flag is None:                   # Python-only: written only where it matters
                if value != DEFAULTS[d.key]:
                    out[d.key] = value
                continue
            out[d.flag.removeprefix("--")] = (not value) if d.meta.negated else value
    if runtime != "simulator":
        out["runtime"] = runtime
    for option in ALGORITHM_OPTIONS:
        if option.name in config.extra:
            out[option.flag.removeprefix("--")] = config.extra[option.name]
    return out


def run_file_text(config: TrainConfig) -> str:
    """The run file of ``config`` (module docstring)."""
    lines = ["# adaptplan train --config config.toml --out NEW-FOLDER reproduces this run (docs/formats.md \"Run files\")"]
    lines += [f"{key} = {toml_value(value)}" for key, value in run_file_entries(config).items()]
    return "\n".join(lines) + "\n"
