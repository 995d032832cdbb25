"""Symbolic tracing with torch.fx, with errors that name the module/op that could not be traced."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import fx, nn

from adaptplan.errors import InputError


class _NamingTracer(fx.Tracer):
    """An ``fx.Tracer`` that remembers which submodule it is inside, so a failure can name it."""

    def __init__(self) -> None:
        super().__init__()
        self.where: list[str] = []
        self.failed_in: str | None = None

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        """torch.nn's modules, and subclasses of its pooling layers (a model's own pooling, e.g.
        ``trainers.inputs.pooling.MaxPool2d``, runs as written, device checks included, and stays one node)."""
        return super().is_leaf_module(m, module_qualified_name) or isinstance(m, nn.modules.pooling._MaxPoolNd)

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        name = self.path_of_module(m)
        self.where.append(f"{name} ({type(m).__name__})")
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_in is None:  # innermost module: the first to see the exception
                self.failed_in = self.where[-1]
            raise
        finally:
            self.where.pop()


def trace(model: nn.Module) -> fx.GraphModule:
    """Trace ``model`` into an ``fx.GraphModule`` (parameters and submodules are shared, not copied).

    Raises:
        InputError: naming the innermost module being traced when fx failed (data-dependent
            control flow, unsupported op...) and suggesting the ``nn.Sequential`` fallback.
    """
    tracer = _NamingTracer()
    try:
        graph = tracer.trace(model)
    except Exception as exc:  # fx raises TraceError, TypeError, RuntimeError... depending on the op
        where = tracer.failed_in or f"the top-level forward of {type(model).__name__}"
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(
            f"torch.fx cannot trace the model: failed inside {where}: {type(exc).__name__}: {first_line}. "
            "Fix: remove data-dependent control flow from that module, or pass an nn.Sequential whose "
            "children are the blocks (no tracing is needed then)",
            field="model",
        ) from None
    name = type(model).__name__
    return fx.GraphModule(tracer.root, graph, name)


def example_batch(input_shape: tuple[int, ...], batch_size: int = 1, seed: int = 0) -> torch.Tensor:
    """A reproducible random input of shape ``(batch_size, *input_shape)`` (float32, N(0, 1))."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((batch_size, *input_shape), generator=generator)
