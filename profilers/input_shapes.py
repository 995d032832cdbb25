"""What a per-sample input shape looks like, read without torch (the CLI checks ``--input`` before torch loads)."""

from __future__ import annotations


def channels_last_hint(shape: tuple[int, ...]) -> str | None:
    """A fix for a per-sample shape given channels-last (H×W×C), or None when it does not look like one."""
    if len(shape) == 3 and shape[-1] in (1, 3, 4) and shape[0] not in (1, 3, 4):
        return (f"{'x'.join(map(str, shape))} looks channels-last; the input is channels × height × width, "
                f"e.g. {'x'.join(map(str, (shape[2], shape[0], shape[1])))}")
    return None
