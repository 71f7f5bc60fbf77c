"""A tiny-model run logs every metric the report and the alarms read, and `grpo report` renders it."""

import json

from test_trainer import _trainer

from grpo.observe.metrics import MetricsLogger, repeated_ngram_frac
from grpo.observe.report import write_report

STEP_KEYS = {
    "reward_mean", "reward_std", "reward/count_a", "reward/count_a_std", "accuracy", "adv_mean", "adv_std",
    "adv_nonzero_frac", "zero_var_frac", "kl", "clip_frac_low", "clip_frac_high", "entropy",
    "completion_len", "completion_len_max", "truncated_frac", "repeat_ngram_frac", "tokens_per_second",
    "time_generate", "time_reward", "time_update", "time_step", "lr", "grad_norm",
    "alarm/stall", "alarm/entropy_collapse",
}


def test_a_run_logs_step_eval_and_alarm_metrics_and_reports(tiny_model, tokenizer, tmp_path, capsys):
    trainer = _trainer(tiny_model, tokenizer, steps=2, eval_every=1, eval_samples=2, eval_k=(1, 2),
                       log_every=1, sample_every=1)
    summary = trainer.train(tmp_path / "run")
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 2]
    assert STEP_KEYS <= set(records[1])
    assert {"heldout_accuracy", "heldout_pass@1", "heldout_pass@2", "heldout_maj@2"} <= set(records[0])
    assert "heldout_pass@2" in records[1]  # eval_every = 1 (the last step is left to the final evaluation)
    assert set(summary["heldout_end"]) == {"heldout_accuracy", "heldout_pass@1", "heldout_pass@2",
                                           "heldout_maj@1", "heldout_maj@2"}
    out = capsys.readouterr().out
    assert "step 1/2  reward" in out and "step 0 held-out: greedy pass@1" in out
    # each completion with its group (4 prompts of 4), its tokens and whether the 6-token limit cut it
    samples = [json.loads(x) for x in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    for step in (1, 2):
        ours = [s for s in samples if s["step"] == step]
        assert [s["group"] for s in ours] == [g for g in range(4) for _ in range(4)]
        assert all(len({s["prompt"] for s in ours if s["group"] == g}) == 1 for g in range(4))
    assert all(0 < s["length"] <= 6 and isinstance(s["cut"], bool) for s in samples)
    assert all(s["length"] == 6 for s in samples if s["cut"]) and any(s["cut"] for s in samples)
    png, page = write_report([tmp_path / "run"])
    assert "finished: 2 steps" in page.read_text()


def test_repeated_ngram_fraction_by_hand():
    import torch

    # "a b a b a b" has 4-grams (abab, baba, abab): one repeat of three; the second row is too short
    ids = torch.tensor([[1, 2, 1, 2, 1, 2], [3, 4, 5, 0, 0, 0]])
    mask = torch.tensor([[1.0] * 6, [1.0] * 3 + [0.0] * 3])
    assert repeated_ngram_frac(ids, mask, n=4) == 1 / 3
    assert repeated_ngram_frac(ids, mask, n=2) == (3 + 0) / (5 + 2)  # ab ba ab ba ab: 3 repeats


def test_wandb_sink_when_installed(tmp_path, monkeypatch):
    import sys
    import types

    logged = []
    fake = types.SimpleNamespace(
        init=lambda **kw: types.SimpleNamespace(log=lambda d, step: logged.append((step, d)), finish=lambda: None)
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    logger = MetricsLogger(tmp_path, tensorboard=False, wandb=True)
    logger.log(3, {"reward_mean": 0.5, "entropy": float("nan")})
    logger.close()
    assert logged == [(3, {"reward_mean": 0.5})]
