"""Completions end on every end-of-turn id a model declares, and on stop strings that span several BPE tokens."""

from types import SimpleNamespace

import pytest
import torch
from conftest import CHAT_TEMPLATE, make_model

from grpo.sampling.decode_loop import _ends_with_stop
from grpo.sampling.rollout import end_of_turn_ids, generate

CORPUS = ["<think>two and two</think><answer>4</answer>", "the answer is 42</answer>\n\nDone.",
          "<answer>7</answer> and then more text"] * 20


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A byte-level BPE tokenizer trained on a few lines, so words and tags are several characters a token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>",
                                   bos_token="<|im_start|>", additional_special_tokens=specials)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def test_end_of_turn_ids_join_the_tokenizer_eos_and_the_generation_config():
    tok = SimpleNamespace(eos_token_id=151645)
    qwen = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[151645, 151643]))
    assert end_of_turn_ids(qwen, tok) == [151643, 151645]
    gemma = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=106))
    assert end_of_turn_ids(gemma, SimpleNamespace(eos_token_id=1)) == [1, 106]
    assert end_of_turn_ids(SimpleNamespace(), tok) == [151645]


def _prompts(tokenizer, questions):
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)["input_ids"]
            for q in questions]


def test_a_second_declared_eos_ends_completions(tiny_model, tokenizer):
    end = tokenizer.convert_tokens_to_ids("~")  # a turn end the tokenizer itself does not know
    head_bias = torch.zeros(len(tokenizer))
    head_bias[end] = 100.0
    tiny_model.lm_head.bias = torch.nn.Parameter(head_bias)  # the sampler's head adds it (hooks are bypassed)
    prompts = _prompts(tokenizer, ["a", "bb"])
    runs_on = generate(tiny_model, tokenizer, prompts, group_size=2, max_new_tokens=5)
    assert runs_on.lengths.tolist() == [5] * 4 and runs_on.truncated.all()  # only the tokenizer's EOS: no stop
    tiny_model.generation_config.eos_token_id = [tokenizer.eos_token_id, end]
    stops = generate(tiny_model, tokenizer, prompts, group_size=2, max_new_tokens=5)
    assert stops.lengths.tolist() == [1] * 4 and not stops.truncated.any()


def test_a_stop_string_split_over_bpe_tokens_is_caught_at_its_last_token(bpe_tokenizer):
    ids = bpe_tokenizer("the answer is 42</answer>\n\nDone.")["input_ids"]
    pieces = [bpe_tokenizer.decode(ids[:k]) for k in range(1, len(ids) + 1)]
    for stop in ("</answer>", "42</answer>\n\n", "answer is"):
        first = next(k for k, text in enumerate(pieces) if stop in text)  # the token that completes it
        spanned = first - next(k for k, text in enumerate(pieces) if stop[:2] in text)
        assert spanned >= 1, f"{stop!r} should span several tokens of this tokenizer"
        hits = [bool(_ends_with_stop(bpe_tokenizer, torch.tensor([ids[: k + 1]]), (stop,))[0])
                for k in range(len(ids))]
        assert hits.index(True) == first
        assert not any(hits[first + 1 :])  # only the token that completes it, not the ones after


def test_generation_stops_on_a_multi_token_stop_string(bpe_tokenizer):
    model = make_model(len(bpe_tokenizer), seed=3)
    prompts = _prompts(bpe_tokenizer, ["What is 2+2?", "Say <answer>"])
    free = generate(model, bpe_tokenizer, prompts, group_size=1, max_new_tokens=10, temperature=0.0)
    row = free.completion_ids[0, : int(free.lengths[0])].tolist()
    assert len(row) >= 4
    stop = bpe_tokenizer.decode(row[1:3])  # the text of two tokens the free run produced
    cut = generate(model, bpe_tokenizer, prompts, group_size=1, max_new_tokens=10, temperature=0.0,
                   stop_strings=(stop,))
    for i in range(len(prompts)):
        tokens = free.completion_ids[i, : int(free.lengths[i])].tolist()
        ends = [k + 1 for k in range(len(tokens)) if stop in bpe_tokenizer.decode(tokens[: k + 1])]
        expected = ends[0] if ends else len(tokens)
        assert int(cut.lengths[i]) == expected
        assert bool(cut.truncated[i]) == (not ends and expected == 10)
    assert int(cut.lengths[0]) <= 3
