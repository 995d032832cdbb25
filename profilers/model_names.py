"""Which model names exist, without importing torch (the CLI checks ``--model`` before the libraries load).

:data:`TORCHVISION_CLASSIFIERS` is torchvision's list of classification models (``torchvision.models.list_models``)
for the pinned torchvision (constraints.txt; tests/profilers/test_model_names.py compares the two). A name it does
not hold is looked up in the installed torchvision, so a newer one's models are taken too; without torch
importable, such a name is refused from this list alone.
"""

from __future__ import annotations

import difflib

from adaptplan.errors import InputError

TORCHVISION_CLASSIFIERS = (
    "alexnet", "convnext_base", "convnext_large", "convnext_small", "convnext_tiny", "densenet121", "densenet161",
    "densenet169", "densenet201", "efficientnet_b0", "efficientnet_b1", "efficientnet_b2", "efficientnet_b3",
    "efficientnet_b4", "efficientnet_b5", "efficientnet_b6", "efficientnet_b7", "efficientnet_v2_l",
    "efficientnet_v2_m", "efficientnet_v2_s", "googlenet", "inception_v3", "maxvit_t", "mnasnet0_5", "mnasnet0_75",
    "mnasnet1_0", "mnasnet1_3", "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small", "regnet_x_16gf",
    "regnet_x_1_6gf", "regnet_x_32gf", "regnet_x_3_2gf", "regnet_x_400mf", "regnet_x_800mf", "regnet_x_8gf",
    "regnet_y_128gf", "regnet_y_16gf", "regnet_y_1_6gf", "regnet_y_32gf", "regnet_y_3_2gf", "regnet_y_400mf",
    "regnet_y_800mf", "regnet_y_8gf", "resnet101", "resnet152", "resnet18", "resnet34", "resnet50",
    "resnext101_32x8d", "resnext101_64x4d", "resnext50_32x4d", "shufflenet_v2_x0_5", "shufflenet_v2_x1_0",
    "shufflenet_v2_x1_5", "shufflenet_v2_x2_0", "squeezenet1_0", "squeezenet1_1", "swin_b", "swin_s", "swin_t",
    "swin_v2_b", "swin_v2_s", "swin_v2_t", "vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19",
    "vgg19_bn", "vit_b_16", "vit_b_32", "vit_h_14", "vit_l_16", "vit_l_32", "wide_resnet101_2", "wide_resnet50_2",
)
EXAMPLE_NAMES = ("vgg11", "vgg16", "resnet18", "resnet50", "mobilenet_v2", "alexnet")


LISTED_VERSION = "0.29.1"
"""The torchvision release :data:`TORCHVISION_CLASSIFIERS` is the list of (constraints.txt's pin)."""


def installed_torchvision_names(imported: bool = False) -> list[str] | None:
    """The installed torchvision's classification models, or None when torch cannot be imported. Where the installed
    release is :data:`LISTED_VERSION`, :data:`TORCHVISION_CLASSIFIERS` answers without importing torchvision (an
    unknown ``--model`` was refused after 7-36 s of importing torch and torchvision); ``imported`` asks torchvision
    itself (the test that the list is the pinned release's)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("torchvision").split("+")[0]
    except PackageNotFoundError:
        return None
    if installed == LISTED_VERSION and not imported:
        return list(TORCHVISION_CLASSIFIERS)
    try:
        import torchvision
    except ImportError:
        return None
    return sorted(torchvision.models.list_models(module=torchvision.models))


def check_model_name(spec: str, field: str = "MODEL", extra_names: tuple[str, ...] = ()) -> None:
    """An InputError naming ``field`` (and valid names) unless ``spec`` is one of ``extra_names`` (a caller's
    built-ins), a torchvision classification model, or has the form ``package.module:factory`` (imported and
    checked when the model is built)."""
    if ":" in spec or spec in extra_names or spec in TORCHVISION_CLASSIFIERS:
        return
    names = installed_torchvision_names() or list(TORCHVISION_CLASSIFIERS)
    if spec in names:
        return
    examples = ", ".join(n for n in EXAMPLE_NAMES if n in names)
    close = difflib.get_close_matches(spec.lower(), [*extra_names, *names], n=5, cutoff=0.6)
    hint = f" (similar: {', '.join(close)})" if close else ""
    builtin = f"one of {', '.join(extra_names)}, " if extra_names else ""
    raise InputError(f"unknown model {spec!r}{hint}. Valid: {builtin}a torchvision classification model such as "
                     f"{examples} ({len(names)} in all), or package.module:factory", field=field)
