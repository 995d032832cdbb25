"""The one exception type for user mistakes.

Every bad input (unreadable file, unknown key, non-positive rate, unreachable target ε, unknown
algorithm...) raises :class:`InputError` with a message that names the field and the fix. The CLI
turns it into one line on stderr and exit code 2; library users can catch it as a ``ValueError``.
"""

from __future__ import annotations


class InputError(ValueError):
    """A user-facing input problem; ``field`` names the offending field (e.g. ``devices[3].up_bps``),
    ``message`` is the text without the field prefix."""

    def __init__(self, message: str, field: str | None = None) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class InfeasibleError(InputError):
    """The target ε cannot be reached (docs/model.md §8 A7); the message says which constraint and the fix."""
