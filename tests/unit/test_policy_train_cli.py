"""`ragpilot router train` refuses bad input before any data is read: exit 2 naming the flag,
nothing written (the training itself: tests/test_policy_train.py)."""

from __future__ import annotations

import pytest

from serving.cli import main


@pytest.mark.parametrize(("argv", "flag"), [
    (["--add-config", "no-equals-sign"], "--add-config"),
    (["--add-config", "x=/nonexistent/best_config.yaml"], "--add-config"),
    (["--max-train", "1"], "--max-train"),
    (["--seed", "-1"], "--seed"),
])
def test_bad_input_exits_2_naming_the_flag(argv, flag, tmp_path, capsys):
    assert main(["router", "train", "--out", str(tmp_path), *argv]) == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "policy.json").exists()  # nothing half-written


@pytest.mark.parametrize(("yamls", "says"), [
    ({"static-default": "rag: {k: 7}\n"}, "'static-default' is already an arm's name"),
    ({"x": "rag: {k: 7}\n", "y": "rag: {k: 7}\n"}, "same config as arm 'x'"),
    ({"mine": "rag: {variant: bm25, k: 3}\n"}, "same config as arm 'bm25-k3'"),
])
def test_an_added_arm_that_clashes_is_refused_naming_what_it_clashes_with(yamls, says,
                                                                            tmp_path, capsys):
    argv = []
    for name, text in yamls.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        argv += ["--add-config", f"{name}={tmp_path / name}.yaml"]
    out = tmp_path / "run"
    assert main(["router", "train", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert "--add-config" in err and says in err
    assert not out.exists()  # refused before the run directory is made


@pytest.mark.parametrize("below", ["", "sub"])
def test_an_out_that_cannot_be_a_directory_exits_2(below, tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory\n")
    out = tmp_path / "file" / below
    assert main(["router", "train", "--out", str(out)]) == 2  # no traceback
    assert "error: --out: cannot create directory" in capsys.readouterr().err
    assert (tmp_path / "file").read_text() == "not a directory\n"


def test_max_train_on_data_without_a_train_split_is_refused(tmp_path, capsys):
    # the synthetic world has valid/test only: the cap would be silently ignored
    assert main(["router", "train", "--out", str(tmp_path), "--max-train", "5"]) == 2
    assert "--max-train: synthetic has no train split" in capsys.readouterr().err
    assert not (tmp_path / "policy.json").exists()


@pytest.mark.parametrize(("argv", "flag", "says"), [
    (["--learner", "ppo", "--ppo-seeds", "0"], "--ppo-seeds", "must be 1..5"),
    (["--learner", "ppo", "--ppo-seeds", "6"], "--ppo-seeds", "must be 1..5"),
    (["--learner", "ppo", "--ppo-iters", "0"], "--ppo-iters", "must be >= 1"),
    (["--learner", "ppo", "--equal-cost"], "--equal-cost", "always holds"),
    (["--learner", "ppo", "--ppo-config", "/nonexistent/ppo.yaml"], "--ppo-config",
     "does not exist"),
    (["--ppo-seeds", "2"], "--ppo-seeds", "applies to --learner ppo only"),
    (["--ppo-iters", "2"], "--ppo-iters", "applies to --learner ppo only"),
])
def test_bad_ppo_learner_input_exits_2_naming_the_flag(argv, flag, says, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["router", "train", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert f"error: {flag}: " in err and says in err
    assert not out.exists()  # refused before the run directory is made


def test_a_bad_ppo_config_names_its_key_and_line(tmp_path, capsys):
    bad = tmp_path / "ppo.yaml"
    bad.write_text("ppo_policy:\n  train:\n    iters: 3\n    lr: fast\n")
    out = tmp_path / "run"
    assert main(["router", "train", "--learner", "ppo", "--ppo-config", str(bad),
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "ppo_policy.train.lr" in err and f"{bad}:4" in err
    assert not out.exists()


def test_resume_applies_to_the_ppo_learner_only(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["router", "train", "--out", str(out), "--resume"]) == 2
    assert "error: --resume: applies to --learner ppo only" in capsys.readouterr().err
    assert not out.exists()


def test_policy_train_is_the_deprecated_spelling_of_router_train(tmp_path, capsys):
    """The old spelling reaches the same command (the same refusal of a bad flag) and says
    once, on stderr, what replaced it; the new spelling says nothing of the kind."""
    assert main(["policy", "train", "--out", str(tmp_path), "--seed", "-1"]) == 2
    err = capsys.readouterr().err.splitlines()
    notes = [line for line in err if line.startswith("deprecated:")]
    assert len(notes) == 1 and "ragpilot router train" in notes[0]
    assert any(line.startswith("error: --seed:") for line in err)
    assert main(["router", "train", "--out", str(tmp_path), "--seed", "-1"]) == 2
    assert "deprecated" not in capsys.readouterr().err
