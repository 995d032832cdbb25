"""Model resolution for the CLI and ``profile_model``: a torchvision classification model name
(built with ``weights=None``), or ``package.module:factory`` for user code, imported from the
working directory (appended to ``sys.path``) or ``PYTHONPATH``.

:func:`check_model_spec` validates a name without building the model (cheap enough for config
validation); :func:`resolve_model` builds it; :func:`check_model_output` runs one forward pass and
checks the output's shape and values. All raise :class:`InputError` naming ``field``; an exception
raised by the user's own code (on import, in the factory, in ``forward``) becomes one message naming
the model and the exception, chained (``raise ... from``) so that ``adaptplan --debug`` shows its
traceback.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any, Callable

from torch import nn

from adaptplan.errors import InputError
from profilers.model_names import check_model_name


def check_model_spec(spec: str, field: str = "MODEL", extra_names: tuple[str, ...] = ()) -> Callable[..., nn.Module]:
    """Validate ``spec`` (a torchvision name or ``package.module:factory``) and return its factory.

    ``extra_names`` (e.g. a caller's built-in models) are listed in the error message as valid too.

    Raises:
        InputError: naming ``field``: unknown name (listing valid ones, :func:`profilers.model_names.check_model_name`),
            unimportable module or missing factory.
    """
    if ":" in spec:
        return _factory(spec, field)
    check_model_name(spec, field, extra_names)
    import torchvision

    return lambda num_classes, **size: torchvision.models.get_model(spec, weights=None, num_classes=num_classes, **size)


def size_arguments(spec: str, input_shape: tuple[int, ...] | None, field: str = "--input") -> dict[str, Any]:
    """The keyword that builds torchvision model ``spec`` for images of ``input_shape`` (C, H, W):
    ``image_size=H`` for the Vision Transformers (``vit_b_16``, ``vit_l_32``...: their position
    embedding is sized for one square image side, a multiple of the patch size in the name); ``{}``
    for every other model (convolutional networks take any size; user factories size themselves).

    Raises:
        InputError: naming ``field``: a ViT given a non-square image or a side that is not a
            multiple of its patch size.
    """
    if input_shape is None or len(input_shape) != 3 or not spec.startswith("vit_"):
        return {}
    _, height, width = input_shape
    patch = int(spec.rsplit("_", 1)[1])
    if height != width or height % patch:
        side = (height // patch or 1) * patch
        raise InputError(f"{spec} needs square images whose side is a multiple of its patch size {patch}; got "
                         f"{height}x{width}. Fix: resize the images, e.g. --input {input_shape[0]}x{side}x{side}",
                         field=field)
    return {"image_size": height}


def resolve_model(spec: str, num_classes: int = 10, field: str = "MODEL",
                  input_shape: tuple[int, ...] | None = None) -> nn.Module:
    """Build the model named ``spec`` with ``num_classes`` outputs and random weights.

    ``spec`` is a torchvision name (``vgg16``, ``resnet18``, ``mobilenet_v2``...) or
    ``package.module:factory``; the factory is called with ``num_classes=`` when it accepts it.
    ``input_shape`` (C, H, W per sample), when given, sizes the models built for one image size
    (:func:`size_arguments`: a ViT at 64×64 gets ``image_size=64``).

    Raises:
        InputError: naming ``field``: unknown name (listing valid ones), unimportable module,
            missing factory, or a factory that does not return an ``nn.Module``; naming ``--input``:
            a size the model cannot be built for.
    """
    if num_classes < 1:
        raise InputError(f"must be ≥ 1, got {num_classes}", field="--num-classes")
    factory = check_model_spec(spec, field)
    size = size_arguments(spec, input_shape) if ":" not in spec else {}
    try:
        model = factory(num_classes=num_classes, **size)
    except InputError:
        raise
    except (Exception, SystemExit) as exc:     # a factory that calls sys.exit() is a failed build, said as one
        raise InputError(f"building model {spec!r} failed: {describe(exc)}", field=field) from exc
    if not isinstance(model, nn.Module):
        raise InputError(f"{spec} returned {type(model).__name__}, not a torch.nn.Module", field=field)
    return model


def describe(exc: BaseException) -> str:
    """``"ValueError: bad width"`` — an exception as one short line for a message."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def check_model_output(model: nn.Module, spec: str, input_shape: tuple[int, ...], num_classes: int,
                       field: str = "MODEL") -> None:
    """Run ``model`` on a batch of 2 random samples of ``input_shape`` (values per sample) and check
    that it returns a finite float tensor of shape (2, ``num_classes``).

    Raises:
        InputError: naming ``field`` and the model: ``forward`` raised (the exception named and
            chained), the output is not a tensor, has the wrong shape (e.g. a model built for another
            number of classes) or holds NaN/inf.
    """
    import torch

    generator = torch.Generator().manual_seed(0)
    batch = torch.randn((2, *input_shape), generator=generator)
    try:
        with torch.no_grad():
            output: Any = model(batch)
    except Exception as exc:
        from profilers.chain import shape_failure
        from profilers.input_shapes import channels_last_hint

        if channels_last_hint(tuple(input_shape)):
            raise InputError(f"model {spec!r}: {shape_failure(batch, exc)}", field=field) from exc
        raise InputError(f"model {spec!r} failed on an input of shape {'x'.join(map(str, input_shape))}: "
                         f"{describe(exc)}", field=field) from exc
    if not isinstance(output, torch.Tensor):
        raise InputError(f"model {spec!r} returned {type(output).__name__}, not a tensor of class scores", field=field)
    if tuple(output.shape) != (2, num_classes):
        raise InputError(f"model {spec!r} returned shape {tuple(output.shape)} for a batch of 2; expected "
                         f"(2, {num_classes}): one score per class (--num-classes {num_classes})", field=field)
    if not output.is_floating_point() or not bool(torch.isfinite(output).all()):
        raise InputError(f"model {spec!r} returned {'non-float' if not output.is_floating_point() else 'NaN or inf'} "
                         f"scores for random input", field=field)


FACTORY_SIGNATURE = ("a model factory is called as factory(num_classes=M) when it has a num_classes parameter, "
                     "else as factory(), and returns a fresh torch.nn.Module for the data set's per-sample input "
                     "(C, H, W) with M outputs")
"""What ``package.module:factory`` receives (docs/api.md "The model factory"): ``num_classes`` M only, by keyword; no
input shape, no width (``model_width`` sizes the built-ins only)."""


def _factory(spec: str, field: str) -> Callable[..., nn.Module]:
    """The user factory of ``package.module:factory``, wrapped to take ``num_classes=`` always.

    The factory (a function or an ``nn.Module`` class) is imported from the working directory or ``PYTHONPATH``
    and called as :data:`FACTORY_SIGNATURE` says: ``factory(num_classes=M)`` when it declares ``num_classes``
    (M = the data set's classes), else ``factory()``; every other parameter must have a default.

    Raises:
        InputError: naming ``field``: malformed spec, unimportable module (or one that raised on import),
            no such callable, a built-in function, or a factory with a required parameter other than
            ``num_classes`` (checked here, before anything is built).
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InputError(f"{spec!r} must look like package.module:factory", field=field)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:  # the user's own module, run from its folder
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"cannot import module {module_name!r} (looked in the working directory {cwd} and on "
                         f"PYTHONPATH): {exc}. Fix: run from the folder that holds it, or add that folder to "
                         "PYTHONPATH", field=field) from None
    except (Exception, SystemExit) as exc:   # the user's module raised (or exited) while being imported
        raise InputError(f"importing module {module_name!r} of model {spec!r} failed: {describe(exc)}", field=field) from exc
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise InputError(f"module {module_name!r} has no callable {attr!r}", field=field)
    if inspect.isbuiltin(factory):   # sys:exit, os:abort... are not model factories (and may end the process)
        raise InputError(f"{spec!r} is a built-in function, not a model factory: name a Python function or class "
                         "that returns an nn.Module", field=field)
    accepts = _takes_num_classes(factory, spec, field)
    return lambda num_classes: factory(num_classes=num_classes) if accepts else factory()


def _takes_num_classes(factory: Callable[..., Any], spec: str, field: str) -> bool:
    """Whether ``factory`` declares ``num_classes`` (to be passed by keyword); InputError naming ``field`` when it
    has a parameter the caller cannot fill (:data:`FACTORY_SIGNATURE`). A signature Python cannot read is taken
    as ``factory()``."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    fillable = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    required = [name for name, p in parameters.items() if p.default is inspect.Parameter.empty
                and p.kind not in variadic and not (name == "num_classes" and p.kind in fillable)]
    if required:
        raise InputError(f"{spec}({', '.join(parameters)}) needs {', '.join(required)}, which nothing passes: "
                         f"{FACTORY_SIGNATURE}. Fix: give {', '.join(required)} a default value", field=field)
    return "num_classes" in parameters and parameters["num_classes"].kind in fillable
