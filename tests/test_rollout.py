"""The sampler draws from the model's own distribution, and the shared-prefix pass is exact."""

import pytest
import torch

from grpo.learning.logprobs import length_buckets, rollout_logprobs, token_logprobs
from grpo.sampling.forward import common_prefix_length
from grpo.sampling.next_token import filter_logits
from grpo.sampling.rollout import Rollout, generate


def _prompts(tokenizer, questions):
    return [tokenizer.apply_chat_template([{"role": "system", "content": "Be brief and exact."},
                                            {"role": "user", "content": q}],
                                           add_generation_prompt=True)["input_ids"]
            for q in questions]


def _full_forward_logprobs(model, prompt, completion):
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(completion)]
    return torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)


def test_sampling_logprobs_match_a_plain_forward_pass(tiny_model, tokenizer):
    prompts = _prompts(tokenizer, ["1+2?", "What is 30+4?", "hi"])  # uneven lengths
    gen = torch.Generator().manual_seed(0)
    r = generate(tiny_model, tokenizer, prompts, group_size=4, max_new_tokens=12, generator=gen)
    assert r.completion_ids.shape[0] == 12 and r.mask.shape == r.logprobs.shape
    for i in range(12):
        n = int(r.lengths[i])
        expected = _full_forward_logprobs(tiny_model, prompts[i // 4], r.completion_ids[i, :n].tolist())
        torch.testing.assert_close(r.logprobs[i, :n], expected, atol=1e-5, rtol=1e-5)
        assert torch.all(r.logprobs[i, n:] == 0)


def test_stop_token_ends_a_completion_and_marks_it(tiny_model, tokenizer):
    prompts = _prompts(tokenizer, ["a", "bb"])
    eos = tokenizer.eos_token_id
    head_bias = torch.zeros(len(tokenizer))
    head_bias[eos] = 100.0  # make the end token all but certain
    tiny_model.lm_head.bias = torch.nn.Parameter(head_bias)  # the sampler's head adds it (hooks are bypassed)
    r = generate(tiny_model, tokenizer, prompts, group_size=3, max_new_tokens=5)
    assert r.lengths.tolist() == [1] * 6
    assert not r.truncated.any()
    assert r.texts == [""] * 6


def test_greedy_is_deterministic(tiny_model, tokenizer):
    prompts = _prompts(tokenizer, ["x", "yz"])
    a = generate(tiny_model, tokenizer, prompts, group_size=2, max_new_tokens=6, temperature=0.0)
    b = generate(tiny_model, tokenizer, prompts, group_size=2, max_new_tokens=6, temperature=0.0)
    assert a.texts == b.texts and a.texts[0] == a.texts[1]


@pytest.mark.parametrize("questions", [["1+2?", "What is 30+4?", "hi"], ["same", "same"], ["q"]])
def test_shared_prefix_pass_equals_full_pass_with_gradients(tiny_model, tokenizer, questions):
    prompts = _prompts(tokenizer, questions)
    gen = torch.Generator().manual_seed(1)
    r = generate(tiny_model, tokenizer, prompts, group_size=3, max_new_tokens=7, generator=gen)
    grads = []
    values = []
    for share in (True, False):
        tiny_model.zero_grad()
        logp, _ = rollout_logprobs(tiny_model, r, tokenizer.pad_token_id, share_prefix=share)
        (logp * r.mask).sum().backward()
        values.append(logp * r.mask)
        grads.append([p.grad.clone() for p in tiny_model.parameters()])
    torch.testing.assert_close(values[0], values[1], atol=1e-5, rtol=1e-5)
    for a, b in zip(*grads, strict=False):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(values[0], r.logprobs, atol=1e-5, rtol=1e-5)


def test_chunked_logprobs_equal_unchunked(tiny_model, tokenizer):
    prompts = _prompts(tokenizer, ["abc", "de"])
    r = generate(tiny_model, tokenizer, prompts, group_size=4, max_new_tokens=9,
                 generator=torch.Generator().manual_seed(3))
    whole, ent = rollout_logprobs(tiny_model, r, tokenizer.pad_token_id, with_entropy=True)
    chunked, ent2 = rollout_logprobs(tiny_model, r, tokenizer.pad_token_id, with_entropy=True, chunk_tokens=5)
    torch.testing.assert_close(whole, chunked)
    torch.testing.assert_close(ent, ent2)
    assert torch.all(ent >= 0)


@pytest.mark.unit  # a pure function: make mutants runs it
def test_common_prefix_and_filters():
    assert common_prefix_length([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == 2
    assert common_prefix_length([[1, 2], [1, 2]]) == 1  # each prompt keeps a token of its own
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, False, True, True]]
    # softmax = [0.644, 0.237, 0.087, 0.032]; top_p 0.7 keeps the first two (0.644 < 0.7)
    assert torch.isinf(filter_logits(logits, top_p=0.7)).tolist() == [[False, False, True, True]]


def test_stop_strings_end_a_completion_at_the_token_that_completes_them(tiny_model, tokenizer):
    # greedy, so that each row's tokens do not depend on which other rows are still decoding
    prompts = _prompts(tokenizer, ["ab", "c", "hello", "x"])
    free = generate(tiny_model, tokenizer, prompts, group_size=1, max_new_tokens=12, temperature=0.0)
    text = next(t for t in free.texts if len(t) >= 4)
    stop = text[2:4]  # a string the free run produced after its first tokens
    cut = generate(tiny_model, tokenizer, prompts, group_size=1, max_new_tokens=12, temperature=0.0,
                   stop_strings=(stop,))
    for full, short, n in zip(free.texts, cut.texts, cut.lengths.tolist(), strict=True):
        expected = full[: full.index(stop) + len(stop)] if stop in full else full
        assert short == expected
        if stop in full:
            assert n == len(short)  # one token per character with this tokenizer


@pytest.mark.unit  # a pure function: make mutants runs it
def test_sampling_follows_the_softmax_of_logits_over_temperature():
    from grpo.sampling.next_token import sample_next

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0]])
    gen = torch.Generator().manual_seed(0)
    for temperature in (1.0, 0.5):
        counts = torch.zeros(5)
        for _ in range(100):
            token, logp = sample_next(logits.expand(200, 5), temperature=temperature, generator=gen)
            counts += torch.bincount(token, minlength=5)
        expected = (logits / temperature).softmax(dim=-1)[0]
        torch.testing.assert_close(counts / counts.sum(), expected, atol=0.01, rtol=0)  # 20k draws
        torch.testing.assert_close(logp, expected.log()[token], atol=1e-6, rtol=0)


@pytest.mark.unit  # a pure function: make mutants runs it
def test_a_uniform_of_zero_never_draws_a_masked_token():
    # top-k/top-p leave the first tokens with probability 0, so the CDF starts [0, 0, ...]; a uniform
    # of exactly 0 (one in 2^24 per token) must still land on the first token that has mass.
    from grpo.sampling.next_token import inverse_cdf, sample_next

    probs = torch.tensor([[0.0, 0.0, 0.3, 0.0, 0.7], [0.0, 0.5, 0.0, 0.5, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]])
    token = inverse_cdf(probs, torch.zeros(3))
    assert token.tolist() == [2, 1, 0]
    assert (probs.gather(1, token.unsqueeze(1)) > 0).all()
    # the same through the sampler: top-k = 1 leaves only the largest logit (the last) any mass
    token, _ = sample_next(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), temperature=1.0, top_k=1, uniforms=torch.zeros(1))
    assert token.tolist() == [3]


@pytest.mark.unit  # a pure function: make mutants runs it
def test_the_draw_is_unchanged_for_positive_uniforms():
    # Against the plain search (searchsorted with right=False, the draw before the u = 0 fix): for
    # u > 0 they must pick the same token, on CDFs with masked entries, and never a masked one.
    from grpo.sampling.next_token import inverse_cdf

    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(4096, 50, generator=gen) ** 4
    probs = probs.masked_fill(torch.rand(4096, 50, generator=gen) < 0.5, 0.0)  # masked tokens
    probs[:, 7] += 0.01  # every row keeps some mass
    probs = probs / probs.sum(dim=1, keepdim=True)
    u = torch.rand(4096, generator=gen).clamp(min=2.0**-24)  # (0, 1): what stream_uniforms gives besides 0
    u[:8] = torch.tensor([2.0**-24, 1 - 2.0**-24, 0.5, 0.25, 0.125, 2.0**-23, 1 - 2.0**-23, 0.75])
    cdf = probs.cumsum(dim=-1)
    before = torch.searchsorted(cdf, (u.unsqueeze(1) * cdf[:, -1:])).squeeze(1).clamp(max=49)
    token = inverse_cdf(probs, u)
    assert torch.equal(token, before)
    assert (probs.gather(1, token.unsqueeze(1)) > 0).all()


@pytest.mark.unit  # a pure function: make mutants runs it
def test_length_buckets_trade_padding_against_calls():
    # rows of lengths 10, 2, 10, 2: two groups run 2*10 + 2*2 = 24 tokens, one group runs 4*10 = 40
    assert length_buckets([10, 2, 10, 2], overhead_tokens=0) == [[0, 2], [1, 3]]
    assert length_buckets([10, 2, 10, 2], overhead_tokens=100) == [[0, 2, 1, 3]]  # 140 beats 224
    assert length_buckets([3, 0, 1], overhead_tokens=0) == [[0], [2]]  # empty rows run nothing


def test_bucketed_pass_over_uneven_lengths_equals_full_pass(tiny_model, tokenizer):
    prompts = _prompts(tokenizer, ["1+2?", "What is 30+4?"])
    r = generate(tiny_model, tokenizer, prompts, group_size=4, max_new_tokens=12, temperature=1.0,
                 generator=torch.Generator().manual_seed(5))
    # cut the completions to very different lengths, so that several length buckets are run
    cut = torch.tensor([12, 1, 7, 12, 2, 3, 11, 1]).clamp(max=r.lengths)
    mask = (torch.arange(r.mask.shape[1]) < cut.unsqueeze(1)).float()
    r = Rollout(r.prompt_ids, r.completion_ids, mask, r.logprobs * mask, r.truncated, r.texts, r.group_size)
    assert len(length_buckets(cut.tolist())) > 1
    values, grads = [], []
    for share in (True, False):
        tiny_model.zero_grad()
        logp, ent = rollout_logprobs(tiny_model, r, tokenizer.pad_token_id, share_prefix=share, with_entropy=True)
        (logp * torch.linspace(0.5, 1.5, logp.numel()).view_as(logp)).sum().backward()
        values.append((logp, ent))
        grads.append([p.grad.clone() for p in tiny_model.parameters()])
    torch.testing.assert_close(values[0][0], values[1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(values[0][1], values[1][1], atol=1e-5, rtol=1e-5)
    assert torch.all(values[0][0][mask == 0] == 0) and torch.all(values[0][1][mask == 0] == 0)
    torch.testing.assert_close(values[0][0], r.logprobs, atol=1e-5, rtol=1e-5)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.unit
@pytest.mark.parametrize(("temperature", "chunk"), [(1.0, 256), (0.7, 3), (1.3, 1)])
def test_fused_token_logprobs_match_log_softmax_with_gradients(temperature, chunk):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 6, generator=gen, requires_grad=True)
    head = torch.nn.Linear(6, 11, bias=False)
    targets = torch.randint(0, 11, (10,), generator=gen)
    weights = torch.rand(10, generator=gen)  # an uneven upstream gradient
    logp, entropy = token_logprobs(hidden, head, targets, temperature=temperature, chunk_tokens=chunk,
                                   with_entropy=True)
    (logp * weights).sum().backward()
    got = (hidden.grad.clone(), head.weight.grad.clone())
    hidden.grad, head.weight.grad = None, None
    log_probs = torch.log_softmax(head(hidden) / temperature, dim=-1)
    expected = log_probs.gather(1, targets.unsqueeze(1)).squeeze(1)
    (expected * weights).sum().backward()
    torch.testing.assert_close(logp, expected)
    torch.testing.assert_close(entropy, -(log_probs.exp() * log_probs).sum(dim=-1))
    torch.testing.assert_close(got[0], hidden.grad)
    torch.testing.assert_close(got[1], head.weight.grad)
    assert not entropy.requires_grad


@pytest.mark.unit
def test_fused_token_logprobs_under_bf16_autocast_keep_dtypes_and_values():
    # the CUDA path runs under bf16 autocast; the CPU's autocast exercises the same dtype handling
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(9, 8, generator=gen, requires_grad=True)
    head = torch.nn.Linear(8, 13, bias=False)
    targets = torch.randint(0, 13, (9,), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _ = token_logprobs(hidden, head, targets, temperature=0.8, chunk_tokens=4)
    assert logp.dtype == torch.float32
    logp.sum().backward()
    assert hidden.grad.dtype == torch.float32 and head.weight.grad.dtype == torch.float32
    got = (logp.detach(), hidden.grad.clone(), head.weight.grad.clone())
    hidden.grad, head.weight.grad = None, None
    expected = torch.log_softmax(head(hidden) / 0.8, dim=-1).gather(1, targets.unsqueeze(1)).squeeze(1)
    expected.sum().backward()
    # the head and its gradients are computed in fp32 whatever the autocast: fp32 tolerances
    torch.testing.assert_close(got[0], expected.detach())
    torch.testing.assert_close(got[1], hidden.grad)
    torch.testing.assert_close(got[2], head.weight.grad)


def test_grouped_kv_attention_keeps_only_the_grouped_keys_for_backward(tiny_model, tokenizer, monkeypatch):
    # What grouped_kv_attention (grpo/sampling/forward.py) is for: without TRANSFORMERS_SDPA_FORCE_GQA, transformers
    # repeats each key/value head for its query heads before SDPA whenever there is a mask (always here), and
    # autograd keeps those copies; with it SDPA gets the 2 key/value heads and enable_gqa. The tiny model has
    # 4 query heads over 2 key/value heads, so a repeated copy is twice the size of the keys it repeats and
    # the pass saves, per SDPA call, K and V of half its repeated size less: 2 * numel(repeated K) / 2 floats.
    import torch.nn.functional as F

    prompts = _prompts(tokenizer, ["1+2?", "What is 30+4?"])
    r = generate(tiny_model, tokenizer, prompts, group_size=3, max_new_tokens=8,
                 generator=torch.Generator().manual_seed(2))
    sdpa, calls = F.scaled_dot_product_attention, []

    def spy(query, key, value, *args, **kwargs):
        calls.append((key.shape[1], key.numel(), bool(kwargs.get("enable_gqa"))))
        return sdpa(query, key, value, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    results = []
    for forced in ("0", None):  # "0": transformers repeats the key/value heads; None: our context decides
        if forced is None:
            monkeypatch.delenv("TRANSFORMERS_SDPA_FORCE_GQA", raising=False)
        else:
            monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", forced)
        calls.clear()
        storages = {}  # what autograd keeps for backward, each storage once (held, so no address is reused)

        def pack(t, storages=storages):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage()
            return t

        tiny_model.zero_grad()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logp, _ = rollout_logprobs(tiny_model, r, tokenizer.pad_token_id)
        logp.sum().backward()
        results.append((logp.detach(), [p.grad.clone() for p in tiny_model.parameters()],
                        sum(s.nbytes() for s in storages.values()),
                        list(calls)))
    assert "TRANSFORMERS_SDPA_FORCE_GQA" not in __import__("os").environ  # restored
    (_, _, repeated_bytes, repeated), (_, _, grouped_bytes, grouped) = results
    # a pass without a mask (one row) has SDPA group the heads either way; the others repeat them
    copies = [numel for heads, numel, gqa in repeated if heads == 4 and not gqa]
    assert copies
    assert len(grouped) == len(repeated) and all(heads == 2 and gqa for heads, _, gqa in grouped)
    assert repeated_bytes - grouped_bytes == sum(2 * numel // 2 * 4 for numel in copies)  # float32
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-6, rtol=1e-6)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_rows_without_tokens_cost_nothing_and_score_zero(tiny_model, tokenizer):
    prompts = _prompts(tokenizer, ["ab", "c"])
    r = generate(tiny_model, tokenizer, prompts, group_size=2, max_new_tokens=4,
                 generator=torch.Generator().manual_seed(4))
    for keep in ([1.0, 0.0, 1.0, 0.0], [0.0] * 4):
        mask = r.mask * torch.tensor(keep).unsqueeze(1)
        empty = Rollout(r.prompt_ids, r.completion_ids, mask, r.logprobs * mask, r.truncated, r.texts, 2)
        logp, _ = rollout_logprobs(tiny_model, empty, tokenizer.pad_token_id)
        assert logp.shape == r.mask.shape and torch.all(logp[mask == 0] == 0)
        torch.testing.assert_close(logp[mask == 1], r.logprobs[mask == 1], atol=1e-5, rtol=1e-5)


@pytest.mark.unit  # a pure function: make mutants runs it
def test_the_recorded_log_prob_is_that_of_the_truncated_distribution_the_token_was_drawn_from():
    # logits / T = [2, 1, 0, -1] at T = 0.5: softmax = [0.644, 0.237, 0.087, 0.032]; top_k = 2 keeps the
    # first two, renormalised: [0.731, 0.269] = softmax([2, 1]); top_p = 0.7 keeps the same two
    from grpo.sampling.next_token import sample_next

    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5]]).expand(400, 4)
    kept = torch.tensor([2.0, 1.0]).log_softmax(dim=-1)  # log [0.731, 0.269]
    gen = torch.Generator().manual_seed(0)
    for options in ({"top_k": 2}, {"top_p": 0.7}, {"top_k": 3, "top_p": 0.7}):
        token, logp = sample_next(logits, temperature=0.5, generator=gen, **options)
        assert set(token.tolist()) == {0, 1}
        torch.testing.assert_close(logp, kept[token], atol=1e-6, rtol=0)
    # without truncation: the untruncated softmax(logits / T), as before
    token, logp = sample_next(logits, temperature=0.5, generator=gen)
    torch.testing.assert_close(logp, torch.tensor([2.0, 1.0, 0.0, -1.0]).log_softmax(dim=-1)[token])


def _worker_module():
    """grpo/vllm_side/grpo_vllm_worker.py, which runs under vLLM's Python and imports nothing of grpo."""
    import importlib.util
    from pathlib import Path

    import grpo

    path = Path(grpo.__file__).parent / "vllm_side" / "grpo_vllm_worker.py"
    spec = importlib.util.spec_from_file_location("grpo_vllm_worker", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.unit
def test_the_worker_asks_vllm_for_the_truncated_distributions_log_probs():
    # vLLM's processed_logprobs are after temperature, top-k and top-p: the definition sample_next records
    worker = _worker_module()
    settings = {"model": "m", "dtype": "float32", "seed": 0, "memory": 0.5, "max_model_len": 64, "lora_rank": 0}
    assert worker.engine_options(settings)["logprobs_mode"] == "processed_logprobs"
    request = {"prompt": [1, 2], "temperature": 0.7, "top_p": 0.9, "top_k": 5, "max_tokens": 8, "seed": 3,
               "stop": [], "stop_token_ids": [2]}
    options = worker.sampling_options(request)
    assert (options["temperature"], options["top_p"], options["top_k"], options["logprobs"]) == (0.7, 0.9, 5, 0)
    assert worker.sampling_options({**request, "top_k": 0})["top_k"] == -1  # vLLM's "no top-k"


PINNED = {  # the tiny model's completions for streams (7, 1, 0, row), as sampled before the per-token work of issue 35
    "plain": [[88, 43, 9, 30, 6, 86, 76, 32, 36, 41], [4, 100, 12, 41, 44, 72, 80, 7, 72, 84],
              [60, 93, 52, 27, 12, 100, 96, 60, 75, 71], [14, 25, 99, 91, 73, 10, 10, 94, 10, 12],
              [76, 97, 86, 44, 40, 66, 15, 95, 49, 76], [92, 78, 44, 86, 37, 5, 60, 16, 41, 101]],
    "truncated": [[97, 65, 8, 11, 8, 83, 81, 26, 51, 21], [12, 100, 12, 26, 60, 60, 60, 12, 60, 60],
                  [65, 97, 68, 39, 5, 88, 88, 50, 70, 57], [15, 17, 102, 98, 82, 12, 10, 98, 10, 9],
                  [82, 98, 98, 50, 27, 79, 22, 91, 45, 68], [98, 83, 31, 83, 15, 13, 67, 8, 34, 97]],
}


@pytest.mark.parametrize("case,options", [("plain", {}), ("truncated", {"top_k": 20, "top_p": 0.9, "temperature": 0.7})])
def test_a_fixed_stream_samples_the_pinned_completions(tiny_model, tokenizer, case, options):
    """Making a token cheaper must not change which token is drawn: a run's numbers stay those of its seed."""
    from grpo.sampling.random_streams import stream_keys

    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)["input_ids"]
               for q in ("1+2?", "What is 30+4?")]
    r = generate(tiny_model, tokenizer, prompts, group_size=3, max_new_tokens=10,
                 streams=stream_keys(7, 1, 0, torch.arange(6)), **options)
    assert r.completion_ids.tolist() == PINNED[case]
