"""Planner-side behaviour found untested by a fresh mutation sample (docs/mutation.md): the command
line's interrupt line, what ``system -o`` says it wrote."""

from __future__ import annotations

import json

from adaptplan.cli import main
from adaptplan.commands import system as system_command


def test_an_interrupted_command_says_so_in_one_line_and_exits_130(monkeypatch, capsys) -> None:
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(system_command, "run", interrupted)
    assert main(["system", "--devices", "2"]) == 130
    captured = capsys.readouterr()
    assert captured.err == "adaptplan system: interrupted\n" and captured.out == ""


def test_system_to_a_file_names_the_file_and_the_devices(tmp_path, capsys) -> None:
    target = tmp_path / "s.json"
    assert main(["system", "--devices", "3", "--seed", "4", "-o", str(target)]) == 0
    captured = capsys.readouterr()
    assert captured.err == f"wrote {target} (3 devices)\n" and captured.out == ""
    assert len(json.loads(target.read_text())["devices"]) == 3
