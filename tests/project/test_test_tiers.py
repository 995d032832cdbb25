"""tests/conftest.py's tiers: what the quick tier leaves out (``slow``) and what pytest-xdist keeps in one worker
(``PROCESS_GROUP``: the tests that start rank processes or a broker, so that two of them never share the cores)."""

from __future__ import annotations

import pytest

from tests import conftest


class Item:
    """What ``pytest_collection_modifyitems`` reads and writes of a collected test: its node id and its markers."""

    def __init__(self, nodeid: str, module: object = None) -> None:
        self.nodeid = nodeid
        self.module = module                    # the test file's module: its test functions by name
        self.markers: list[pytest.Mark] = []

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.markers.append(marker.mark)

    def marked(self) -> dict[str, tuple]:
        return {m.name: m.args for m in self.markers}


def test_multi_process_files_are_slow_and_in_one_group_and_slow_single_tests_only_slow() -> None:
    rank_test = Item("tests/trainers/distributed/test_mqtt.py::test_every_algorithm_over_mqtt_has_the_simulations_losses[sl]")
    slow_alone = Item("tests/profilers/test_small_image_models.py::"
                      "test_profile_cli_refuses_a_vit_size_with_exit_2_and_no_traceback")
    quick = Item("tests/profilers/test_small_image_models.py::test_something_quick")
    conftest.pytest_collection_modifyitems(None, [rank_test, slow_alone, quick])
    assert rank_test.marked() == {"slow": (), "xdist_group": (conftest.PROCESS_GROUP,)}
    assert slow_alone.marked() == {"slow": ()}
    assert quick.marked() == {}


def test_a_listed_slow_test_that_no_longer_exists_is_an_error() -> None:
    from types import SimpleNamespace

    path = "tests/profilers/test_small_image_models.py"
    listed = next(p for p in conftest.SLOW_TESTS if p.startswith(path + "::")).split("::")[1]
    renamed = SimpleNamespace(test_renamed=None)                        # the file no longer defines the listed test
    for module in (None, renamed):
        with pytest.raises(pytest.UsageError, match="lists slow tests that do not exist"):
            conftest.pytest_collection_modifyitems(None, [Item(f"{path}::test_renamed", module)])
    # one other test of the file selected alone (pytest FILE::TEST): the listed one exists, unselected, no error
    present = SimpleNamespace(test_renamed=None, **{listed: None})
    conftest.pytest_collection_modifyitems(None, [Item(f"{path}::test_renamed", present)])
