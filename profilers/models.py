"""Model resolution for the CLI and ``profile_model``: a torchvision classification model name
(built with ``weights=None``), or ``package.module:factory`` for user code."""

from __future__ import annotations

import importlib
import inspect

from torch import nn

from adaptplan.errors import InputError


def torchvision_names() -> list[str]:
    """Names of torchvision's classification models (``torchvision.models.list_models``)."""
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def resolve_model(spec: str, num_classes: int = 10) -> nn.Module:
    """Build the model named ``spec`` with ``num_classes`` outputs and random weights.

    ``spec`` is a torchvision name (``vgg16``, ``resnet18``, ``mobilenet_v2``...) or
    ``package.module:factory``; the factory is called with ``num_classes=`` when it accepts it.

    Raises:
        InputError: unknown name (listing valid ones), unimportable module, missing factory,
            or a factory that does not return an ``nn.Module``.
    """
    if num_classes < 1:
        raise InputError(f"must be ≥ 1, got {num_classes}", field="--num-classes")
    if ":" in spec:
        return _from_factory(spec, num_classes)
    import torchvision

    names = torchvision_names()
    if spec not in names:
        examples = ", ".join(n for n in ("vgg11", "vgg16", "resnet18", "resnet50", "mobilenet_v2", "alexnet") if n in names)
        close = [n for n in names if spec.lower()[:3] and n.startswith(spec.lower()[:3])][:8]
        hint = f" (similar: {', '.join(close)})" if close else ""
        raise InputError(
            f"unknown model {spec!r}{hint}. Valid: a torchvision classification model such as {examples} "
            f"({len(names)} in all), or package.module:factory",
            field="MODEL",
        )
    return torchvision.models.get_model(spec, weights=None, num_classes=num_classes)


def _from_factory(spec: str, num_classes: int) -> nn.Module:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InputError(f"{spec!r} must look like package.module:factory", field="MODEL")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"cannot import module {module_name!r}: {exc}. Fix: check the name and PYTHONPATH", field="MODEL") from None
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise InputError(f"module {module_name!r} has no callable {attr!r}", field="MODEL")
    try:
        accepts = "num_classes" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        accepts = False
    model = factory(num_classes=num_classes) if accepts else factory()
    if not isinstance(model, nn.Module):
        raise InputError(f"{spec} returned {type(model).__name__}, not a torch.nn.Module", field="MODEL")
    return model
