"""Shared fixtures: a tiny random Llama with a character-level chat tokenizer."""

from __future__ import annotations

import os
import string

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two pytest workers on a small machine: one thread each (and in the processes they
    # start), since torch's threads waiting on each other on oversubscribed cores slow a run many times over
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<|im_start|>", "<|im_end|>"]
    chars = list(string.printable)
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>", bos_token="<|im_start|>",
        additional_special_tokens=specials,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_model(vocab_size: int, seed: int = 0, layers: int = 2, hidden: int = 32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=True, pad_token_id=0, eos_token_id=2, bos_token_id=1,
    )
    return LlamaForCausalLM(config).float()


@pytest.fixture
def tokenizer():
    return make_tokenizer()


@pytest.fixture
def tiny_model(tokenizer):
    return make_model(len(tokenizer))


@pytest.fixture(scope="module")
def tiny_model_folder(tmp_path_factory):
    """The tiny model and its tokenizer saved as a model folder, for commands that load a model by name."""
    place = tmp_path_factory.mktemp("model")
    tokenizer = make_tokenizer()
    make_model(len(tokenizer), seed=5).save_pretrained(place)
    tokenizer.save_pretrained(place)
    return place


# ---- test layers: every test belongs to one (its file's, unless it is marked with another), and
# ``slow`` (the real embedded model) is counted beside them; the run ends with how many ran in each

LAYERS = ("unit", "equivalence", "model", "vllm", "attack", "docs", "combos", "faults")
FILE_LAYERS = {
    "equivalence": ("test_distributed", "test_checkpoint", "test_kill", "test_fp32_head", "test_streams",
                    "test_packed"),
    "model": ("test_trainer", "test_preflight", "test_filter_groups", "test_agent_training", "test_run_metrics",
              "test_episodes", "test_evaluate", "test_rollout", "test_reward_training", "test_gpu_check",
              "test_coming_from_trl", "test_embedded", "test_agent_embedded", "test_example",
              "test_architectures", "test_model_folders", "test_prompts", "test_errored_rows", "test_token_budget",
              "test_adapter_runs", "test_report_browser",
              "test_objectives_training"),
    "vllm": ("test_vllm_engine", "test_vllm_sleep", "test_vllm_acceptance"),
    "attack": ("test_sandbox", "test_code_audit"),
    "docs": ("test_docs",),
    "combos": ("test_combinations",),
    "faults": ("test_faults", "test_faults_checkpoint"),
}  # any other file: unit


_COUNTED: dict[str, tuple[str, ...]] = {}  # test id -> the layers it counts in: its own, and slow if marked


def pytest_collection_modifyitems(config, items):
    for item in items:
        layer = next((name for name in LAYERS if item.get_closest_marker(name)), None)
        if layer is None:
            module = item.path.stem
            layer = next((name for name, files in FILE_LAYERS.items() if module in files), "unit")
            item.add_marker(getattr(pytest.mark, layer))
        counted = (layer, "slow") if item.get_closest_marker("slow") else (layer,)
        _COUNTED[item.nodeid] = counted
        # carried on the test's reports, so that a controller that did not collect (pytest -n) still counts
        item.user_properties.append(("layers", counted))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # counted by the markers given at collection, not by the report's keywords, which also hold the names of
    # the folders above the test (a checkout in a folder named "docs" would count every test as docs)
    counts = {layer: {} for layer in (*LAYERS, "slow")}
    for outcome in ("passed", "failed", "skipped", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            if getattr(report, "when", "call") != "call" and outcome in ("passed", "failed"):
                continue
            carried = dict(getattr(report, "user_properties", ()) or ()).get("layers")
            for layer in carried or _COUNTED.get(getattr(report, "nodeid", ""), ()):
                counts[layer][outcome] = counts[layer].get(outcome, 0) + 1
    parts = [f"{layer} {counts[layer].get('passed', 0)}"
             + "".join(f" ({n} {outcome})" for outcome, n in counts[layer].items() if outcome != "passed")
             for layer in counts]
    terminalreporter.write_line("tests passed per layer: " + ", ".join(parts))
