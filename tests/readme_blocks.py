"""The README and docs/usage.md read as tests read them: one ``## `` section's text, and its ```bash blocks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_section(heading: str, document: str = "README.md") -> str:
    """The text of the ``## HEADING...`` section of ``document`` (the README, or a page of docs/), up to the next
    ``## `` heading."""
    text = (ROOT / document).read_text(encoding="utf-8")
    return text.split(f"\n## {heading}", 1)[1].split("\n## ", 1)[0]


def bash_blocks(section: str) -> list[str]:
    """The ```bash code blocks of ``section``, stripped."""
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def python_snippets(document: str = "README.md") -> list[str]:
    """Every ```python code block of ``document``, as written."""
    return re.findall(r"```python\n(.*?)```", (ROOT / document).read_text(encoding="utf-8"), flags=re.S)
