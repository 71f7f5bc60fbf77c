"""A run too short for the no_signal alarm still ends saying it trained on next to nothing: the line
`grpo train` prints at its end, read from its stdout."""

from __future__ import annotations

import json

from conftest import make_model, make_tokenizer

from grpo.cli import main


def test_a_run_too_short_for_the_no_signal_alarm_ends_saying_it_trained_on_nothing(tmp_path, capsys):
    # 4 steps with no group varying (a reward that never pays): no_signal needs 5 in a row; the end says so
    # in one line, and not again where the alarm fired (--no-signal-steps 3); --threads 1: nothing measured, so
    # no line of options that repeat the run (grpo/run/repeat.py)
    tokenizer = make_tokenizer()
    model = tmp_path / "tiny"
    make_model(len(tokenizer), seed=3).save_pretrained(model)
    tokenizer.save_pretrained(model)
    reward = tmp_path / "never.py"
    reward.write_text("def never(completion, example):\n    return 0.0\n")
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"say a {i}", "answer": "a"}) + "\n" for i in range(40)))

    def ends(name: str, *extra: str) -> tuple[list[str], list[str]]:
        capsys.readouterr()
        assert main(["train", "--model", str(model), "--data", str(data), "--rewards", f"{reward}:never",
                     "--steps", "4", "--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", "6",
                     "--eval-size", "8", "--preflight", "off", "--no-filter-groups", "--device", "cpu",
                     "--no-progress", "--no-save-model", "--reward-workers", "0", "--threads", "1", "--output", str(tmp_path / name),
                     *extra]) == 0
        out = capsys.readouterr().out.splitlines()
        start = next(i for i, line in enumerate(out) if line.startswith("held-out accuracy"))
        return out[:start], out[start:]  # what the run said, then its end

    during, said = ends("short")
    assert not any("no signal" in line for line in during) and len(said) == 2, said
    assert said[0].startswith("held-out accuracy 0.0% -> 0.0% over 4 steps")
    assert said[1].startswith("little signal: none of the 4 steps") and "docs/alarms.md" in said[1]
    during, said = ends("fired", "--no-signal-steps", "3", "--no-early-stop")
    assert any(line.startswith("warning (step 3): no signal:") for line in during), during
    assert len(said) == 1 and said[0].startswith("held-out accuracy"), said
