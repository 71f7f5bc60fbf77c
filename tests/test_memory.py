"""The memory model (grpo/run/memory.py) by hand on a tiny shape; the check before the weights load adapts in
its order, leaves what the user set alone, and refuses in one line with no run folder."""

from __future__ import annotations

import dataclasses

import pytest

from grpo.config import ConfigError, TrainConfig
from grpo.run.memory import (
    CHECKPOINT_SURPLUS_LAYER_INPUTS,
    CPU_BASELINE,
    LOGIT_CHUNK_COPIES,
    LOGIT_CHUNK_TOKENS,
    SAMPLING_LOGIT_COPIES,
    TOKENIZER_BYTES_PER_TOKEN,
    checkpoint_surplus_per_token,
    micro_batch_tokens,
    predict,
)
from grpo.run.memory_check import adapt_to_memory, measured_completion, trainer_prediction
from grpo.run.memory_shapes import Device, ModelShape, RunShape

# L 2, H 8, I 16, 2 heads and 1 KV head of 4 dims, V 10, tied embeddings
TINY = ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=10, tied=True)
# what a CPU process holds before its weights: the interpreter and libraries, and the tokenizer of V = 10
BASE = CPU_BASELINE + TOKENIZER_BYTES_PER_TOKEN * 10
RUN = RunShape(group_size=4, prompts_per_step=2, max_new_tokens=3, prompt_tokens=5, micro_batch_tokens=100,
               eval_batch_size=1, eval_rows=1, reward_workers=0)


def test_parameters_kv_cache_lora_and_activations_by_hand():
    # embeddings 10 x 8 = 80; a layer: q, o 2 x 8 x 8 = 128, k, v 2 x 8 x 4 = 64, MLP 3 x 8 x 16 = 384,
    # norms 16: 592; two layers 1184; final norm 8: 80 + 1184 + 8 = 1272
    assert TINY.layer_params == 592
    assert TINY.params == 1272
    assert dataclasses.replace(TINY, tied=False).params == 1272 + 80
    # keys and values: 2 x 2 layers x 1 head x 4 dims x 4 bytes = 64 bytes a token
    assert TINY.kv_bytes_per_token(4) == 64
    # LoRA r = 2: q, o 2 x (8 + 8), k, v 2 x (8 + 4), gate, up, down 3 x (8 + 16): 128 per rank and layer
    assert TINY.lora_params(2) == 2 * 2 * 128
    # 4 H + 2 (q + 2 kv) + 3 q + 4 I = 32 + 32 + 24 + 64
    assert TINY.activation_floats_per_token() == 152


def test_the_micro_batch_packs_whole_groups_or_splits_one_by_rows():
    # a group: 5 prompt tokens once + 4 rows x 3 = 17; both groups fit in 100 tokens: 34 tokens, 8 rows
    assert micro_batch_tokens(RUN, groups=2) == (34, 8)
    # 10 tokens: one group does not fit; (10 - 5) // 3 = 1 row a part: 5 + 3 = 8 tokens
    assert micro_batch_tokens(dataclasses.replace(RUN, micro_batch_tokens=10), groups=2) == (8, 1)


def test_predicted_terms_by_hand_on_the_cpu():
    pred = predict(TINY, RUN, Device("cpu"))
    p = 1272
    # update: 34 tokens x 2 layers x 152 floats x 4 bytes = 41344; prompt cache repeated: 8 rows x 5 x 64 = 2560
    # one micro-batch: its gradients (4 P = 5088) come as its activations (43904) go, adding nothing but
    # the output layer's (tied: the embeddings', 4 x V 10 x H 8 = 320), which backward makes first
    update = {"baseline": CPU_BASELINE, "tokenizer": TOKENIZER_BYTES_PER_TOKEN * 10, "weights": 4 * p,
              "optimizer": 8 * p, "gradients": 320,
              "activations": 41344 + 2560, "logits_chunk": LOGIT_CHUNK_COPIES * LOGIT_CHUNK_TOKENS * 10 * 4}
    assert pred.phase == "the update" and pred.terms == update
    assert pred.peak == sum(update.values())
    # 20 tokens: a group (17) a micro-batch, two of them: the first's gradients stay while the second runs
    two = predict(TINY, dataclasses.replace(RUN, micro_batch_tokens=20), Device("cpu"))
    assert two.phases["the update"] == sum({**update, "gradients": 4 * p, "activations": 17 * 2 * 152 * 4 + 4 * 5 * 64}.values())
    # sampling: 8 rows x (5 + 3) tokens x 64 bytes; logits 3 x 8 rows x 10 x 4 bytes; AdamW's state from step 2
    sampling = BASE + 12 * p + 8 * 8 * 64 + SAMPLING_LOGIT_COPIES * 8 * 10 * 4
    assert pred.phases["sampling"] == sampling
    # gradient checkpointing: each layer's input 34 x 2 x 8 x 4 = 2176, the KV cache as the layers extend it
    # 8 rows x (5 + 3) x 64 = 4096, the prompt's cache repeated twice 2 x 2560 = 5120, in backward the re-run
    # layer's set and its gradients 2 x 34 x 152 x 4 = 41344, and the surplus per completion token (8 x 3),
    # 1.81 x L 2 x H 8 x 4 bytes = 115; backward adds the gradients whole
    ckpt = predict(TINY, dataclasses.replace(RUN, gradient_checkpointing=True), Device("cpu"))
    kept = 2176 + 4096 + 5120 + 41344 + 115 * 24
    assert ckpt.terms["activations"] == kept
    assert ckpt.phases["the update"] - pred.phases["the update"] == (kept + 4 * p) - (43904 + 320)


def test_reference_lora_async_and_fsdp_terms():
    p, lora = 1272, 512
    assert predict(TINY, dataclasses.replace(RUN, beta=0.04), Device("cpu")).terms["reference"] == 4 * p
    low = predict(TINY, dataclasses.replace(RUN, beta=0.04, lora_rank=2, micro_batch_tokens=20), Device("cpu")).terms
    # LoRA: the base is the reference; gradients and moments of the adapter only; weights base + adapter
    assert "reference" not in low and low["optimizer"] == 8 * lora and low["gradients"] == 4 * lora
    assert low["weights"] == 4 * (p + lora)
    lag = predict(TINY, dataclasses.replace(RUN, async_lag=1), Device("cpu")).terms
    assert lag["async_copy"] == 4 * p + 4 * p  # the sampler's model and one snapshot of the trained weights
    # FSDP over 2: a half of weights, moments and gradients each, and one gathered layer of weights
    two = predict(TINY, dataclasses.replace(RUN, fsdp=True), Device("cpu", world=2))
    assert two.per_process and two.terms["weights"] == 4 * p // 2 + 4 * 592 and two.terms["optimizer"] == 4 * p


def test_cuda_counts_bf16_activations_autocast_copies_and_the_reserve():
    pred = predict(TINY, RUN, Device("cuda"))
    assert "baseline" not in pred.terms or pred.terms["baseline"] == 0
    assert pred.terms["activations"] == (41344 + 2560) // 2
    assert pred.terms["autocast_weights"] == 2 * 2 * 592
    assert pred.reserved > pred.peak


# a model whose activations dominate: each halving of micro_batch_tokens shrinks the update a lot
WIDE = ModelShape(layers=24, hidden=1024, intermediate=4096, heads=16, kv_heads=4, head_dim=64, vocab=32000,
                  tied=True)


def _config(**kw: object) -> TrainConfig:
    return TrainConfig(max_new_tokens=64, group_size=8, prompts_per_step=8, eval_batch_size=64, steps=20, **kw)


def _need(config: TrainConfig) -> int:
    return predict(WIDE, RunShape.from_config(config, 40), Device("cpu")).needed


def test_adapting_lowers_micro_batch_tokens_first_and_says_so():
    config = _config()
    available = _need(dataclasses.replace(config, micro_batch_tokens=2048)) + 1
    said: list[str] = []
    changes, pred = adapt_to_memory(WIDE, config, 40, Device("cpu", available=available),
                                    {"micro_batch_tokens", "gradient_checkpointing", "eval_batch_size"}, said.append)
    assert changes == {"micro_batch_tokens": 2048}
    assert pred.needed <= available
    assert said == [f"memory: micro_batch_tokens 4096 -> 2048 (predicted need {pred.needed / 2**30:.2f} GiB, "
                    f"{available / 2**30:.2f} GiB available)"]


def test_sampling_decodes_the_largest_round():
    # rounds of up to 32 prompts x G = 8: 256 rows decode at once, four times the default rounds of B = 8
    config = TrainConfig(max_new_tokens=1024, group_size=8, prompts_per_step=8, eval_batch_size=8, steps=20,
                         lora_rank=8, micro_batch_tokens=2048)
    assert RunShape.from_config(config, 40).round_prompts == 8
    wide, default = (predict(WIDE, RunShape.from_config(dataclasses.replace(config, round_prompts=n), 40),
                             Device("cpu")) for n in (32, 0))
    assert wide.phase == "sampling"
    cache = lambda rows: rows * (40 + 1024) * WIDE.kv_bytes_per_token(4)  # noqa: E731
    assert wide.phases["sampling"] - default.phases["sampling"] == (
        cache(256) - cache(64) + SAMPLING_LOGIT_COPIES * 192 * WIDE.vocab * 4)
    # under torchrun each process decodes its share, the first ones a group more: 10 prompts on 4 processes, 3
    three = predict(WIDE, RunShape.from_config(dataclasses.replace(config, round_prompts=10), 40),
                    Device("cpu", world=4))
    one = predict(WIDE, RunShape.from_config(dataclasses.replace(config, round_prompts=8), 40), Device("cpu", world=4))
    assert three.phases["sampling"] - one.phases["sampling"] == (
        cache(24) - cache(16) + SAMPLING_LOGIT_COPIES * 8 * WIDE.vocab * 4)


def test_adapting_leaves_what_the_user_set_and_turns_to_checkpointing():
    config = _config()
    available = _need(dataclasses.replace(config, gradient_checkpointing=True)) + 1
    # the user set micro_batch_tokens: it stays; gradient checkpointing comes next in the order
    changes, _ = adapt_to_memory(WIDE, config, 40, Device("cpu", available=available),
                                 {"gradient_checkpointing", "eval_batch_size"}, lambda line: None)
    assert changes == {"gradient_checkpointing": True}


def test_a_run_that_cannot_fit_is_refused_naming_the_largest_term():
    config = _config()
    with pytest.raises(ConfigError, match=r"^not enough memory: the run needs about .* the largest term is "
                                          r"optimizer \(.*\): shrink it with --lora-rank"):
        adapt_to_memory(WIDE, config, 40, Device("cpu", available=2**30), {"micro_batch_tokens"}, print)


def test_grpo_train_refuses_a_run_that_cannot_fit_in_one_line_without_a_run_folder(tmp_path, capsys):
    from grpo.cli import main

    out = tmp_path / "run"
    code = main(["train", "--group-size", "256", "--prompts-per-step", "64", "--max-new-tokens", "4096",
                 "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("grpo train: error: not enough memory:"), err
    assert "the largest term is kv_cache" in err[0] and "--max-new-tokens" in err[0]
    assert not out.exists()


def test_the_model_against_published_figures():
    # vLLM's paper (Kwon et al. 2023, arXiv:2309.06180, section 3): OPT-13B's KV cache is 800 KB a token,
    # 2 x 5120 x 40 layers x 2 bytes, and up to 1.6 GB for one request of 2048 tokens
    opt13b = ModelShape(layers=40, hidden=5120, intermediate=20480, heads=40, kv_heads=40, head_dim=128,
                        vocab=50272, tied=True)
    assert opt13b.kv_bytes_per_token(2) == 2 * 5120 * 40 * 2 == 800 * 1024
    assert 1.5e9 < opt13b.kv_bytes_per_token(2) * 2048 < 1.7e9
    # ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054, section 3.1): mixed-precision Adam keeps 16 bytes a
    # parameter, at least 24 GB for GPT-2's 1.5B; here fp32 weights 4 + gradients 4 + moments 8 = 16 bytes
    gpt2 = ModelShape(layers=48, hidden=1600, intermediate=6400, heads=25, kv_heads=25, head_dim=64,
                      vocab=50257, tied=True)
    run = RunShape(group_size=32, prompts_per_step=1, max_new_tokens=1024, prompt_tokens=0,
                   micro_batch_tokens=32 * 1024, gradient_checkpointing=True, eval_rows=0, reward_workers=0,
                   save_model=False)
    terms = predict(gpt2, run, Device("cuda")).terms
    halves = predict(gpt2, dataclasses.replace(run, micro_batch_tokens=16 * 1024), Device("cuda")).terms
    states = terms["weights"] + halves["gradients"] + terms["optimizer"]  # two micro-batches: gradients whole
    assert states == 16 * gpt2.params  # 16 x 1.5e9 = 24 GB (this shape counts a gated MLP: 2.0B parameters)
    # ... and (section 3.2) its activations at sequence 1K and batch 32 take about 8 GB with checkpointing
    # that keeps each layer's input. This model predicts 30.3 GB, nearly four times that (docs/memory.md):
    # each layer's input 32K x 48 x 1600 x 2 bytes, the KV cache the layers extend 32K x 307,200 (2 x 48 x
    # 25 x 64 x 2), the re-run layer's set and its gradients 2 x 32K x 46,400 x 2, and the surplus measured
    # on SmolLM2 per completion token, 1.81 x 48 x 1600 x 2 = 278,016 bytes, over 32K tokens
    assert gpt2.activation_floats_per_token() == 46400 and gpt2.kv_bytes_per_token(2) == 307200
    assert checkpoint_surplus_per_token(gpt2, 2) == 278016
    activations = 5_033_164_800 + 10_066_329_600 + 6_081_740_800 + 9_110_028_288
    assert predict(gpt2, run, Device("cuda")).terms["activations"] == activations == 30_291_263_488


def test_an_adapter_folder_as_model_is_predicted_as_the_adapter_it_trains(tmp_path):
    # an adapter folder leaves --lora-rank at 0: counted as a full fine-tune, the optimizer's 8 P and the
    # reference's 4 P under --beta would refuse runs that fit
    import json

    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 16, "base_model_name_or_path": "x"}))
    as_folder = _config(model=str(folder), beta=0.04)
    as_rank = _config(lora_rank=16, beta=0.04)
    assert RunShape.from_config(as_folder, 40).lora_rank == 16
    one, two = (predict(WIDE, RunShape.from_config(c, 40), Device("cpu")) for c in (as_folder, as_rank))
    assert one.terms == two.terms and "reference" not in one.terms


def test_evaluation_is_counted_under_the_vllm_engine():
    # greedy evaluation decodes on the trainer's own policy whatever engine samples
    config = dataclasses.replace(_config(engine="vllm", eval_size=4096), eval_batch_size=4096)
    pred = predict(WIDE, RunShape.from_config(config, 40), Device("cpu"))
    assert "evaluation" in pred.phases and pred.phase == "evaluation"


def test_adapting_undoes_changes_that_do_not_help_the_peak():
    # evaluation is the peak: halving eval_batch_size fits; a smaller micro-batch and checkpointing are undone
    config = dataclasses.replace(_config(eval_size=4096), eval_batch_size=4096)
    available = _need(dataclasses.replace(config, eval_batch_size=1024)) + 1
    changes, pred = adapt_to_memory(WIDE, config, 40, Device("cpu", available=available),
                                    {"micro_batch_tokens", "gradient_checkpointing", "eval_batch_size"}, print)
    assert list(changes) == ["eval_batch_size"] and changes["eval_batch_size"] < 4096 and pred.needed <= available


def test_the_preflight_timing_runs_one_micro_batch_so_its_gradients_replace_activations():
    # pre-flight times the first micro-batch of its 2 groups only (grpo/run/preflight.py update_seconds), its
    # gradients set to None before: at 20 tokens a micro-batch the step's update keeps the first
    # micro-batch's gradients (4 P) while the second runs, the timing only the output layer's (4 V H = 320)
    p = 1272
    run = dataclasses.replace(RUN, micro_batch_tokens=20, preflight_rows=8)
    pred = predict(TINY, run, Device("cpu"))
    activations = 17 * 2 * 152 * 4 + 4 * 5 * 64  # one group: 17 tokens, its 4 rows' prompt cache
    logits = LOGIT_CHUNK_COPIES * LOGIT_CHUNK_TOKENS * 10 * 4
    assert pred.phases["the pre-flight's timed update"] == BASE + 4 * p + 320 + activations + logits
    assert pred.phases["the update"] == BASE + 12 * p + 4 * p + activations + logits


def test_measured_completion_lengths_shrink_sampling_and_the_update_but_not_evaluation():
    # completions of at most 1 token instead of the limit's 3: sampling's cache 8 rows x (5 + 1) x 64
    # bytes; a group costs 5 + 4 x 1 = 9 tokens, both in one micro-batch: 18 tokens, their 8 rows' prompt
    # cache; greedy evaluation is not what pre-flight sampled: at the limit, 1 row x (5 + 3) x 64
    p = 1272
    short = predict(TINY, dataclasses.replace(RUN, completion_tokens=1), Device("cpu"))
    logits = LOGIT_CHUNK_COPIES * LOGIT_CHUNK_TOKENS * 10 * 4
    assert short.completion == 1
    assert short.phases["sampling"] == BASE + 12 * p + 8 * 6 * 64 + SAMPLING_LOGIT_COPIES * 8 * 10 * 4
    assert short.phases["the update"] == BASE + 12 * p + 320 + 18 * 2 * 152 * 4 + 8 * 5 * 64 + logits
    assert short.phases["evaluation"] == BASE + 12 * p + 1 * 8 * 64 + SAMPLING_LOGIT_COPIES * 1 * 10 * 4
    # a measured length above the limit is the limit
    assert dataclasses.replace(RUN, completion_tokens=9).completion == 3


def test_measured_lengths_count_only_where_sound():
    assert measured_completion([4, 9, 7], [False] * 3, multi_turn=False) == 9
    assert measured_completion([4, 64, 7], [False, True, False], multi_turn=False) == 0  # one cut: the limit
    assert measured_completion([4, 9, 7], [False] * 3, multi_turn=True) == 0  # tool replies in completions
    assert measured_completion([], [], multi_turn=False) == 0


def _trainer(config: TrainConfig) -> object:
    from types import SimpleNamespace

    import torch

    wide = {"num_hidden_layers": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16,
            "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000, "tie_word_embeddings": True}
    generation = SimpleNamespace(model=SimpleNamespace(config=wide), device=torch.device("cpu"),
                                 world=SimpleNamespace(size=1), toolbox=None, agent=None)
    return SimpleNamespace(config=config, train_prompts=[[1] * 40], generation=generation)


def test_the_prediction_beside_the_first_step_uses_preflight_lengths_and_keeps_the_worst_case():
    trainer = _trainer(_config())  # a 64-token limit
    worst, _ = trainer_prediction(trainer)
    short, _ = trainer_prediction(trainer, [10] * 64, [False] * 64)
    assert worst.worst == 0 and worst.completion == 64
    assert short.completion == 10 and short.worst == worst.peak and short.peak < worst.peak
    assert short.to_dict(None)["worst_case_peak_bytes"] == worst.peak
    assert "the longest 10 tokens" in short.describe()
    cut, _ = trainer_prediction(trainer, [10] * 63 + [64], [False] * 63 + [True])
    assert cut.peak == worst.peak and cut.worst == 0


def test_preflights_memory_line_warns_when_a_process_needs_more_than_its_share(monkeypatch):
    """Under torchrun, 2 processes on this host: each one's predicted peak against its half of what is free
    plus what it holds already (its weights loaded before the check; MemAvailable no longer counts them).
    Over that, the line warns and names the largest term's option, as the check before loading refuses."""
    from types import SimpleNamespace

    import grpo.run.memory_check as mc
    from grpo.run.memory_check import memory_line
    from grpo.run.memory_shapes import GIB

    trainer = _trainer(_config())
    trainer.generation.world = SimpleNamespace(size=2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(mc, "resident", lambda: GIB)
    monkeypatch.setattr(mc, "mem_available", lambda: 0)
    peak = trainer_prediction(trainer)[0].peak
    assert peak > GIB
    monkeypatch.setattr(mc, "mem_available", lambda: 2 * (peak - GIB))  # room for both processes to grow
    pred, available = trainer_prediction(trainer)
    assert pred.per_process and available == peak and "warning" not in memory_line(pred, available)
    monkeypatch.setattr(mc, "mem_available", lambda: 2 * (peak - GIB) - GIB)  # half a GiB short for each
    pred, available = trainer_prediction(trainer)
    line = memory_line(pred, available)
    assert line.startswith("memory: each process's predicted peak") and available == peak - GIB // 2
    assert "; warning: over what is available by 0.50 GiB, so the run may be killed for memory" in line
    assert "shrink it with" in line
    trainer.generation.world = SimpleNamespace(size=4)  # two hosts of 2: the share is this host's half
    assert trainer_prediction(trainer)[1] == peak - GIB // 2


def test_the_weight_push_buffer_counts_against_host_memory_only():
    # vLLM's push buffer (full fine-tuning) lies in /dev/shm: beside a CPU process's peak it counts, beside a
    # CUDA process's reserve (GPU memory) it does not
    from grpo.run.memory_check import memory_line

    run = dataclasses.replace(RUN, engine="vllm", vllm_bucket_mb=1.0, preflight_rows=0)
    for kind in ("cpu", "cuda"):
        pred = predict(TINY, run, Device(kind, total=2**30))
        assert {**pred.others, **pred.host}["push_buffer"] == 2**20  # on a GPU run, among the host terms
        own = max(pred.peak, pred.reserved)
        assert "warning" not in memory_line(pred, own + 2**20)
        assert ("warning" in memory_line(pred, own)) == (kind == "cpu")


def test_the_output_layers_gradient_is_made_while_every_activation_is_alive():
    # backward starts at the output layer: its gradient (4 V H) exists beside all of one micro-batch's
    # activations; the layers' gradients come as those go. A vocabulary of 10,000 (Gemma-like, V H is
    # most of P): 4 x 10000 x 8 = 320000 bytes, more than 4 P - activations; under LoRA the head is frozen
    big = dataclasses.replace(TINY, vocab=10_000)
    assert predict(big, RUN, Device("cpu")).terms["gradients"] == 4 * 10_000 * 8
    assert predict(big, dataclasses.replace(RUN, lora_rank=2), Device("cpu")).terms["gradients"] == 0
    # and the tokenizer's resident size follows the vocabulary (1.8 KB a token)
    assert predict(big, RUN, Device("cpu")).terms["tokenizer"] == 10_000 * TOKENIZER_BYTES_PER_TOKEN


def test_gemma_blocks_keep_four_norms_and_query_key_norms():
    # Gemma 3 270M's config: a Gemma block norms before and after attention and the MLP (4 norms, each
    # keeping its input and output: 8 H) and each head's queries and keys (q and k before the norm:
    # 2 (q + kv)); q = 4 x 256 = 1024, kv = 256: 8 x 640 + 2 (1024 + 512) + 3 x 1024 + 4 x 2048 + 2 x 1280
    gemma = ModelShape.from_config({"model_type": "gemma3_text", "num_hidden_layers": 18, "hidden_size": 640,
                                    "intermediate_size": 2048, "num_attention_heads": 4, "num_key_value_heads": 1,
                                    "head_dim": 256, "vocab_size": 262144})
    assert gemma.norms == 4 and gemma.qk_norm
    assert gemma.activation_floats_per_token() == 5120 + 3072 + 3072 + 8192 + 2560
    llama = ModelShape.from_config({"model_type": "llama", "num_hidden_layers": 18, "hidden_size": 640,
                                    "intermediate_size": 2048, "num_attention_heads": 4, "num_key_value_heads": 1,
                                    "head_dim": 256, "vocab_size": 262144})
    assert llama.activation_floats_per_token() == 2560 + 3072 + 3072 + 8192


def test_checkpointing_counts_what_its_backward_holds_and_adds_the_gradients_whole():
    # WIDE, 1024 tokens of one group (8 rows of 128, no prompt): each layer's input 1024 x 24 x 1024 x 4,
    # the KV cache as the layers extend it 8 x 128 x 49152 (2 x 24 x 4 x 64 x 4 bytes a token), in backward
    # the re-run layer's set and its gradients 2 x 1024 x 26624 x 4, and the measured surplus per completion
    # token; not the half of the activations without it that the constant fitted at 1128 tokens kept
    run = RunShape(group_size=8, prompts_per_step=1, max_new_tokens=128, prompt_tokens=0, micro_batch_tokens=1024,
                   eval_rows=0, reward_workers=0, save_model=False, steps=1)
    assert WIDE.activation_floats_per_token() == 26624 and WIDE.kv_bytes_per_token(4) == 49152
    plain = predict(WIDE, run, Device("cpu")).terms
    ckpt = predict(WIDE, dataclasses.replace(run, gradient_checkpointing=True), Device("cpu")).terms
    assert plain["activations"] == 24 * 1024 * 26624 * 4
    # surplus: 1.81 x 24 x 1024 x 4 = 177,930 bytes a completion token
    assert ckpt["activations"] == 100_663_296 + 50_331_648 + 218_103_808 + 177_930 * 8 * 128
    assert ckpt["gradients"] == 4 * WIDE.params  # one micro-batch: backward frees little to make room


def test_checkpointing_surplus_bounds_every_probe():
    # bench/memory_probe.py's backward over the counted terms (docs/memory.md), GiB, by completion tokens:
    # 8, 16, 24 groups of 8 x 12; 6 groups of 8 x 64; 3 groups of 8 x 128. It over-counts by at most 0.11 GiB.
    # SmolLM2-135M in fp32: 1.81 x 30 x 576 x 4 = 125,107 bytes a completion token (the 125,000 fitted)
    smollm2 = ModelShape(layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3, head_dim=64, vocab=49152,
                         tied=True)
    per_token = checkpoint_surplus_per_token(smollm2, 4)
    assert per_token == int(CHECKPOINT_SURPLUS_LAYER_INPUTS * 30 * 576 * 4) == 125107
    for surplus, completion_tokens in ((0.04, 768), (0.07, 1536), (0.21, 2304), (0.31, 3072), (0.35, 3072)):
        assert surplus * 2**30 <= per_token * completion_tokens < (surplus + 0.15) * 2**30


def test_several_processes_sum_their_gradients_through_flat_copies():
    # without FSDP each process keeps its gradients (4 P = 5088), their flat copy for the all-reduce and,
    # on a CPU, gloo's working buffer: 3 x 5088 beside weights and AdamW's moments (12 P)
    p = 1272
    pred = predict(TINY, RUN, Device("cpu", world=2))
    assert pred.phases["the gradient sync"] == BASE + 12 * p + 3 * 4 * p
    assert "the gradient sync" not in predict(TINY, dataclasses.replace(RUN, fsdp=True), Device("cpu", world=2)).phases
    assert "the gradient sync" not in predict(TINY, RUN, Device("cpu")).phases


def test_gpu_page_figures_are_what_the_model_predicts():
    # docs/gpu.md's two Qwen2.5-1.5B commands (a 60-token prompt, 100 steps, 256 new tokens, CUDA): its
    # allocated / reserved peaks and the LoRA update alone, recomputed so the page cannot go stale
    from pathlib import Path

    page = " ".join((Path(__file__).resolve().parents[1] / "docs" / "gpu.md").read_text(encoding="utf-8").split())
    qwen = ModelShape.from_config({"num_hidden_layers": 28, "hidden_size": 1536, "intermediate_size": 8960,
                                   "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
                                   "tie_word_embeddings": True, "model_type": "qwen2"})

    def pred(checkpointing: bool, **kw: object):
        config = TrainConfig(max_new_tokens=256, steps=100, gradient_checkpointing=checkpointing, **kw)
        return predict(qwen, RunShape.from_config(config, 60), Device("cuda"))

    def gb(n: int) -> str:
        return f"{n / 1e9:.1f}"

    full, plain = pred(True, lr=1e-6), pred(False, lr=1e-6)
    lora, lora_plain = pred(True, lr=1e-5, lora_rank=16), pred(False, lr=1e-5, lora_rank=16)
    assert f"full fine-tuning {gb(full.peak)} / {gb(full.reserved)} GB, in the update" in page
    assert f"({gb(plain.peak)} / {gb(plain.reserved)} GB without `--gradient-checkpointing`)" in page
    assert f"LoRA {gb(lora.peak)} / {gb(lora.reserved)} GB, when the merged model is written" in page
    assert (f"(the update alone {gb(lora.phases['the update'])} GB, {gb(lora_plain.phases['the update'])} GB "
            f"without checkpointing)") in page
    assert f"{full.terms['activations'] / 1e9:.2f} GB;" in page  # the checkpointed activations' sum
    assert f"with {gb(sum(lora.host.values()))} GB of host memory beside it" in page


def test_the_measured_peak_is_said_kept_in_preflight_json_and_returned(tmp_path, capsys, monkeypatch):
    import json

    from grpo.run import memory_check

    monkeypatch.setattr(memory_check, "measured_peak", lambda device_type: 3 * 2**30)
    (tmp_path / "preflight.json").write_text(json.dumps({"pass_rate": 0.5, "memory": {}}))
    predicted = {"predicted_peak_bytes": 2**31}
    memory = memory_check.say_measured_memory(predicted, 1, "cpu", tmp_path, main=True)
    assert memory == {"predicted_peak_bytes": 2**31, "measured_after_first_step_bytes": 3 * 2**30}
    assert predicted == {"predicted_peak_bytes": 2**31}  # a new dict: the prediction given is not changed
    assert capsys.readouterr().out.startswith("memory: after step 1, peak resident 3.0")
    assert json.loads((tmp_path / "preflight.json").read_text()) == {"pass_rate": 0.5, "memory": memory}
    # another process says nothing and keeps its prediction; no check ran: nothing either
    assert memory_check.say_measured_memory(predicted, 1, "cpu", None, main=False) is predicted
    assert memory_check.say_measured_memory(None, 1, "cpu", tmp_path, main=True) is None
    assert capsys.readouterr().out == ""
