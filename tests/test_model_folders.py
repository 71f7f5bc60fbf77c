"""Model folders grpo train refuses before loading weights, and a PEFT adapter folder as --model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_model, make_tokenizer

from grpo.models import ModelError, add_lora, check_model, load_policy


@pytest.mark.parametrize(("model_type", "message"), [
    ("t5", "is a 't5' model, not a causal language model transformers can load"),
    ("phi", "(phi) has an output layer with a bias"),
])
def test_an_unsupported_architecture_is_one_line_before_loading(tmp_path, model_type, message):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))  # no weights at all
    with pytest.raises(ModelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_model(str(tmp_path))


@pytest.fixture
def adapter_dir(tmp_path):
    """A LoRA adapter folder (as peft saves one) on a tiny base model folder."""
    from transformers import AutoModelForCausalLM

    tokenizer = make_tokenizer()
    make_model(len(tokenizer)).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    lora = add_lora(AutoModelForCausalLM.from_pretrained(tmp_path / "base"), rank=4)
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    lora.save_pretrained(tmp_path / "adapter")
    return tmp_path / "adapter", lora


def test_an_adapter_folder_loads_its_base_and_trains_the_adapter(adapter_dir):
    folder, lora = adapter_dir
    policy = load_policy(str(folder))
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(policy.model(input_ids=ids).logits, lora(input_ids=ids).logits)
    with pytest.raises(ModelError, match="is a LoRA adapter already"):
        add_lora(policy.model, 4)


def test_grpo_train_continues_an_adapter(adapter_dir, tmp_path):
    from safetensors.torch import load_file

    from grpo.cli import main

    folder, _ = adapter_dir
    run = tmp_path / "run"
    reward = f"{Path(__file__).parent / 'distributed_worker.py'}:first_char"  # varies on a random model
    assert main(["train", "--model", str(folder), "--task", "add", "--rewards", reward, "--steps", "2",
                 "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "4", "--eval-size", "4",
                 "--preflight", "off", "--lr", "1e-2", "--output", str(run), "--no-progress",
                 "--reward-workers", "0", "--device", "cpu"]) == 0
    before = load_file(folder / "adapter_model.safetensors")
    after = load_file(run / "model" / "adapter" / "adapter_model.safetensors")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the adapter trained on
    assert (run / "model" / "config.json").is_file()  # the merged model too


def test_an_adapter_without_its_base_is_one_line(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gone")}))
    with pytest.raises(ModelError, match="model path not found"):
        check_model(str(tmp_path))
