"""Model names checked without torch (profilers/model_names.py; issue 37 item 4)."""

from __future__ import annotations

import pytest

from adaptplan.errors import InputError
from profilers.model_names import TORCHVISION_CLASSIFIERS, check_model_name, installed_torchvision_names


def test_the_list_is_the_pinned_torchvisions() -> None:
    """The constant is torchvision's list for the version constraints.txt pins (a new torchvision: update it)."""
    from importlib.metadata import version
    from pathlib import Path

    import profilers.model_names as names

    pins = (Path(__file__).resolve().parents[2] / "constraints.txt").read_text()
    assert f"torchvision=={names.LISTED_VERSION}\n" in pins
    if version("torchvision").split("+")[0] == names.LISTED_VERSION:
        assert list(TORCHVISION_CLASSIFIERS) == installed_torchvision_names(imported=True)


def test_an_unknown_name_is_refused_without_importing_torch() -> None:
    """Issue 65 item 5: `adaptplan train --model nonsense` took 36 s to be refused (torchvision imported for the
    suggestions); at the pinned torchvision the list answers, in a fresh interpreter that never loads torch."""
    import subprocess
    import sys

    code = ("import sys\nfrom adaptplan.errors import InputError\nfrom profilers.model_names import check_model_name\n"
            "try:\n    check_model_name('nonsense', '--model')\nexcept InputError as e:\n    print(e)\n"
            "print('torch' in sys.modules, 'torchvision' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "unknown model 'nonsense'" in out and out.strip().endswith("False False"), out


def test_a_name_is_taken_or_refused_with_the_nearest_names(monkeypatch) -> None:
    for name in ("resnet18", "vit_b_16", "cnn", "my.module:factory"):
        check_model_name(name, "--model", extra_names=("cnn",))
    with pytest.raises(InputError, match=r"--model: unknown model 'resnet19' \(similar: resnet18, .*\)\. Valid: one of "
                                         r"cnn, resnet18-cifar, a torchvision"):
        check_model_name("resnet19", "--model", extra_names=("cnn", "resnet18-cifar"))
    with pytest.raises(InputError, match=r"unknown model 'resnet18_cifar' \(similar: resnet18-cifar, "):
        check_model_name("resnet18_cifar", "--model", extra_names=("cnn", "resnet18-cifar"))    # a built-in suggested
    import profilers.model_names as names

    monkeypatch.setattr(names, "installed_torchvision_names", lambda: None)      # torch not importable
    with pytest.raises(InputError, match=r"unknown model 'resnet19'.*\(80 in all\)"):
        check_model_name("resnet19", "--model")


def test_another_torchvision_release_is_asked_for_its_own_list(monkeypatch) -> None:
    """The shipped list answers only for the release it lists; another release's models come from torchvision itself
    (a newer one may add models), and without torchvision installed there is no list to answer with."""
    import importlib.metadata
    import sys
    from types import SimpleNamespace

    import profilers.model_names as names

    assert installed_torchvision_names() == list(TORCHVISION_CLASSIFIERS)      # the pinned release: the list itself
    fake = SimpleNamespace(models=SimpleNamespace(list_models=lambda module: ["zeta_net", "alpha_net"]))
    monkeypatch.setitem(sys.modules, "torchvision", fake)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "9.0.0+cpu")
    assert names.installed_torchvision_names() == ["alpha_net", "zeta_net"]
    check_model_name("zeta_net", "--model")                                     # a newer release's model is taken

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert names.installed_torchvision_names() is None
