"""`ragpilot policy train` refuses bad input before any data is read: exit 2 naming the flag,
nothing written (the training itself: tests/test_policy_train.py)."""

from __future__ import annotations

import pytest

from serving.cli import main


@pytest.mark.parametrize(("argv", "flag"), [
    (["--add-config", "no-equals-sign"], "--add-config"),
    (["--add-config", "x=/nonexistent/best_config.yaml"], "--add-config"),
    (["--max-train", "1"], "--max-train"),
])
def test_bad_input_exits_2_naming_the_flag(argv, flag, tmp_path, capsys):
    assert main(["policy", "train", "--out", str(tmp_path), *argv]) == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "policy.json").exists()  # nothing half-written
