"""The command line's shape: `grpo train --help` groups its options by part of the run."""

from __future__ import annotations

from grpo.cli.parser import SECTIONS, build_parser, flag
from grpo.config import option_fields

PARTS = ["model", "data", "rewards", "sampling", "objective", "teacher", "schedule", "evaluation", "alarms", "engine",
         "processes", "output"]


def _train_parser():
    return next(p for p in build_parser()._subparsers._group_actions[0].choices.values() if p.prog.endswith("train"))


def test_train_help_shows_every_option_in_exactly_one_section():
    train = _train_parser()
    groups = {group.title: {action.dest for action in group._group_actions} for group in train._action_groups}
    assert [title for title in groups if title in SECTIONS] == list(SECTIONS) == PARTS
    names = [f.name for f in option_fields()]
    assert sorted(name for members in SECTIONS.values() for name in members) == sorted(names)  # once each
    for name in names:
        assert [part for part in PARTS if name in groups[part]] == [part for part in PARTS if name in SECTIONS[part]]
        assert not any(name in members for title, members in groups.items() if title not in PARTS), name
    shown = train.format_help()
    assert [shown.index(f"\n{part}:\n") for part in PARTS] == sorted(shown.index(f"\n{part}:\n") for part in PARTS)
    at = lambda option: shown.index(f"  {flag(option)} ")  # noqa: E731  its help entry, not the usage line
    assert shown.index("\nsampling:\n") < at("temperature") < shown.index("\nobjective:\n") < at("clip_low")


def test_set_by_user_is_not_an_option():
    train = _train_parser()
    assert "set_by_user" not in {action.dest for action in train._actions}
    assert "--set-by-user" not in train.format_help() and "--set-by-user" not in train._option_string_actions
    assert "given" not in {action.dest for action in train._actions}  # the record of what was given, not an option


def test_the_subcommands_that_take_some_options_group_them_too():
    data = next(p for p in build_parser()._subparsers._group_actions[0].choices.values() if p.prog.endswith(" data"))
    titles = [group.title for group in data._action_groups]
    assert "data" in titles and "objective" not in titles  # only the sections it has options of


def test_the_end_line_says_no_model_was_saved_under_no_save_model():
    from pathlib import Path

    from grpo.cli.train import end_lines

    summary = {"steps": 2, "heldout_accuracy_start": 0.1, "heldout_accuracy_end": 0.2, "wall_seconds": 3.0}
    assert end_lines(summary, Path("runs/x"))[0].endswith("; model: runs/x/model")
    saved_none = end_lines(summary, Path("runs/x"), saved=False)[0]
    assert saved_none.endswith("; no model saved (--no-save-model)") and "runs/x/model" not in saved_none


def test_grpo_train_says_no_model_was_saved_under_no_save_model(tmp_path, monkeypatch, capsys):
    """cmd_train tells end_lines whether the run wrote its model: through the command line, with a stand-in
    for the run (nothing loads, nothing trains)."""
    import types
    from pathlib import Path

    from grpo.cli import main

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    summary = {"steps": 1, "heldout_accuracy_start": 0.0, "heldout_accuracy_end": 0.5, "wall_seconds": 1.0}

    class Trainer:
        def __init__(self, run, **kwargs):
            pass

        def train(self, run_dir, resume=False):
            return summary

        def close(self):
            pass

    world = types.SimpleNamespace(is_main=True, size=1, close=lambda: None, broadcast_object=lambda value: value)
    monkeypatch.setattr("grpo.run.build.check_before_loading", lambda run, *args, **kwargs: run)
    monkeypatch.setattr("grpo.system.distributed.init_world", lambda *args, **kwargs: world)
    monkeypatch.setattr("grpo.run.process_setup.setup_process", lambda config: None)
    monkeypatch.setattr("grpo.run.trainer.GRPOTrainer", Trainer)
    for extra, end in (["--no-save-model"], "; no model saved (--no-save-model)"), ([], f"; model: {tmp_path / 'a'}/model"):
        run_dir = tmp_path / ("b" if extra else "a")
        assert main(["train", "--steps", "1", "--output", str(run_dir), *extra]) == 0
        assert capsys.readouterr().out.strip().splitlines()[-1].endswith(end)
