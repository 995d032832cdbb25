"""The README read as tests read it: one ``## `` section's text, and its ```bash blocks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_section(heading: str) -> str:
    """The text of the README's ``## HEADING...`` section, up to the next ``## `` heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.split(f"\n## {heading}", 1)[1].split("\n## ", 1)[0]


def bash_blocks(section: str) -> list[str]:
    """The ```bash code blocks of ``section``, stripped."""
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]
