"""The output layer runs in fp32 in the sampler and the trainer, whatever the autocast dtype.

Under bf16 autocast (the CUDA path) a bf16 head rounds the hidden state it
reads to 8 bits of mantissa, so hidden states that differ in their last fp32
bits, as the decode step's kernels and the training pass's do on a GPU, give
log-probs that differ by far more than fp32 rounding: the sampler/trainer
ratio GRPO's importance weights and clipping act on.
"""

import torch
from conftest import make_model, make_tokenizer

from grpo.learning.logprobs import rollout_logprobs
from grpo.sampling.forward import head_logits
from grpo.sampling.rollout import generate

FP32_TOLERANCE = 1e-5  # |log pi_trainer - log pi_sampler| per token: torch.testing's fp32 atol
KERNEL_NOISE = 1e-6  # relative: how far a GPU's decode and prefill kernels leave the hidden states apart


def _kernel_noise(module, inputs, hidden):
    """Perturb the final hidden states of passes over more than one token (the prompts and the training
    pass) by a relative KERNEL_NOISE; the decode step (one token) keeps its own. On this CPU the passes
    agree bit for bit in fp32 (or to rounding where the decode runs on reordered weights, grpo/sampling/packed_linear.py),
    so the difference a GPU's kernels make is added by hand."""
    if hidden.shape[1] == 1:
        return hidden
    noise = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(hidden.shape[1]))
    return hidden * (1 + KERNEL_NOISE * noise)


def _decoder_outside_autocast(decoder: torch.nn.Module) -> None:
    """Run the decoder (everything before the output layer) in fp32 whatever the autocast: its decode
    step and its multi-token passes then differ by _kernel_noise alone. A CPU without native bf16 (AVX2
    only) computes a bf16 one-token product and a many-token one by different kernels, which leaves the
    hidden states further apart than a GPU's and would hide what the head's precision does."""
    forward = decoder.forward

    def fp32_forward(*args, **kwargs):
        with torch.autocast("cpu", enabled=False):
            return forward(*args, **kwargs)

    decoder.forward = fp32_forward


def test_sampler_and_trainer_agree_to_fp32_rounding_under_bf16_autocast():
    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), seed=3, hidden=64)
    model.get_decoder().norm.register_forward_hook(_kernel_noise)
    _decoder_outside_autocast(model.get_decoder())  # the head alone sees the autocast
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)["input_ids"]
               for q in ["1+2?", "What is 30+4?", "hi"]]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rollout = generate(model, tokenizer, prompts, group_size=4, max_new_tokens=16, temperature=0.7,
                           generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            trainer, _ = rollout_logprobs(model, rollout, tokenizer.pad_token_id, temperature=0.7)
    assert rollout.mask.sum() > 100
    gap = ((trainer - rollout.logprobs) * rollout.mask).abs()  # (N, T)
    # fp32 head: ~1e-6; with the sampler's head_logits computing in bf16 under the autocast the gap was
    # 3.5e-3 (its logits rounded to 8 bits of mantissa)
    assert gap.max() <= FP32_TOLERANCE, f"max |log pi_trainer - log pi_sampler| = {gap.max():.2e}"


def test_head_logits_are_fp32_whatever_the_autocast_and_the_weights_dtype():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, 8, generator=gen)
    head = torch.nn.Linear(8, 11, bias=False)
    expected = hidden @ head.weight.T
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = head_logits(hidden, head)
        assert head(hidden).dtype == torch.bfloat16  # what the module itself would give
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected)
    head.to(torch.bfloat16)  # FSDP's mixed precision gathers bf16 weights: cast up, not the hidden state down
    torch.testing.assert_close(head_logits(hidden, head), hidden @ head.weight.float().T)
