"""The architectures GRPO users train, as tiny random-weight models built from their transformers configs
(no download; 2 layers, hidden 64): the engine samples from each, the training pass's log-probs equal the
model's own forward, one optimiser step changes the weights, and the saved model loads back the same.

Each model is made to exercise what sets it apart: Gemma 3's and Mistral's sliding-window layers get a
window of 6 tokens (prompts are ~40), Gemma 2's logit soft-cap is 1.5 and Granite's logits are divided
by 4, with an output layer large enough that both change the log-probs by far more than the tolerance.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from conftest import make_tokenizer

from grpo.learning.logprobs import rollout_logprobs, token_logprobs
from grpo.models import save_model
from grpo.sampling.forward import LogitTransform
from grpo.sampling.prompts import encode_prompts
from grpo.sampling.rollout import generate

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
WINDOW = dict(sliding_window=6)
ARCHITECTURES = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "gemma3": ("Gemma3TextConfig", {"head_dim": 16, **WINDOW, "tie_word_embeddings": False,
                                    "layer_types": ["sliding_attention", "full_attention"]}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "final_logit_softcapping": 1.5, **WINDOW}),
    "granite": ("GraniteConfig", {"logits_scaling": 4.0, "embedding_multiplier": 2.0, "residual_multiplier": 0.5,
                                  "attention_multiplier": 0.25}),
    "phi3": ("Phi3Config", {}),
    "mistral": ("MistralConfig", {"head_dim": 16, **WINDOW}),
    "olmo2": ("Olmo2Config", {}),
    "qwen3_moe": ("Qwen3MoeConfig", {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                                     "moe_intermediate_size": 32, "decoder_sparse_step": 1}),
}
ATOL = 5e-5  # fp32: the fast paths reorder sums (shared prefix, cache, chunked head); seen up to ~5e-6
QUESTIONS = ["What is 2 + 3?", "Name a prime above 10.", "Spell cat backwards, please."]


def tiny(name: str, vocab: int) -> torch.nn.Module:
    kind, extra = ARCHITECTURES[name]
    config = getattr(transformers, kind)(vocab_size=vocab, **{**COMMON, **extra})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():  # logits of a few units, so that a soft-cap or a scaling shows
        model.get_output_embeddings().weight.normal_(0.0, 0.3)
    return model.eval()


def plain_logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """The reference: log-softmax of model(input_ids).logits on one unpadded sequence, at its completion."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (T, V)
    return logits.log_softmax(-1).gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    """Prompts of different lengths sharing a system prompt (the shared-prefix path, left padding)."""
    msgs = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": q}] for q in QUESTIONS]
    return encode_prompts(tokenizer, msgs)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_architecture(name, tokenizer, prompts, tmp_path):
    model = tiny(name, len(tokenizer))
    r = generate(model, tokenizer, prompts, group_size=2, max_new_tokens=10, temperature=1.0,
                 generator=torch.Generator().manual_seed(0), stop_token_ids=[])
    assert r.completion_ids.shape == (6, 10)  # no stop token: every row runs to the limit
    with torch.no_grad():
        trained, _ = rollout_logprobs(model, r, tokenizer.pad_token_id)
        reference = torch.stack([plain_logprobs(model, prompts[i // 2], r.completion_ids[i].tolist())
                                 for i in range(6)])
    torch.testing.assert_close(r.logprobs, reference, atol=ATOL, rtol=0)  # the engine's sampling head
    torch.testing.assert_close(trained, reference, atol=ATOL, rtol=0)  # the training pass

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    logp, _ = rollout_logprobs(model, r, tokenizer.pad_token_id)
    (-(logp * r.mask).sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    optimizer.step()
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert "lm_head.weight" in changed or "model.embed_tokens.weight" in changed
    assert any(".layers.0." in n for n in changed)  # the gradient reached the first block

    save_model(model, tokenizer, tmp_path / "model")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32).eval()
    ids = torch.tensor([prompts[0]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6, rtol=0)


@pytest.mark.parametrize("transform", [LogitTransform(scale=0.25), LogitTransform(softcap=1.5),
                                       LogitTransform(scale=2.0, softcap=3.0)])
def test_the_fused_head_differentiates_the_soft_cap_and_scaling(transform):
    """token_logprobs' hand-written backward (fp32) against autograd through log_softmax(f(h W^T) / T) in fp64."""
    torch.manual_seed(0)
    hidden = torch.randn(7, 16, requires_grad=True)
    head = torch.nn.Linear(16, 50, bias=False)
    with torch.no_grad():
        head.weight.normal_(0.0, 1.0)  # logits of several units: the cap bends them
    targets = torch.randint(0, 50, (7,))
    weights = torch.randn(7)
    fused, _ = token_logprobs(hidden, head, targets, temperature=0.7, chunk_tokens=3, transform=transform)
    grads = torch.autograd.grad((fused * weights).sum(), [hidden, head.weight])
    h64, w64 = hidden.detach().double().requires_grad_(), head.weight.detach().double().requires_grad_()
    plain = (transform(h64 @ w64.T) / 0.7).log_softmax(-1).gather(1, targets.unsqueeze(1)).squeeze(1)
    expected = torch.autograd.grad((plain * weights.double()).sum(), [h64, w64])
    torch.testing.assert_close(fused, plain.float(), atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama", "gemma3", "qwen3_moe"])
def test_gradient_checkpointing_gives_the_same_gradients_and_keeps_less(name, tokenizer, prompts):
    """--gradient-checkpointing (grpo/learning/logprobs.py checkpointed_layers) on the training pass with the shared
    prompt prefix and the prompt's KV cache under the completions (sliding-window layers in gemma3, experts
    in qwen3_moe): the same log-probs and gradients as without, and fewer bytes kept for backward."""
    from torch.autograd.graph import saved_tensors_hooks

    model = tiny(name, len(tokenizer)).train()
    r = generate(model, tokenizer, prompts, group_size=2, max_new_tokens=10, temperature=1.0,
                 generator=torch.Generator().manual_seed(0), stop_token_ids=[])
    results = []
    for checkpointing in (False, True):
        model.zero_grad(set_to_none=True)
        kept = []

        def keep(t, kept=kept):
            kept.append(t.numel() * t.element_size())
            return t

        with saved_tensors_hooks(keep, lambda t: t):
            logp, _ = rollout_logprobs(model, r, tokenizer.pad_token_id, checkpoint_layers=checkpointing)
        (-(logp * r.mask * torch.linspace(0.5, 1.5, logp.numel()).view_as(logp)).sum()).backward()
        results.append((logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                         if p.grad is not None}, sum(kept)))
        assert "forward" not in vars(model.get_decoder().layers[0])  # the layers are themselves again
    (logp_a, grads_a, kept_a), (logp_b, grads_b, kept_b) = results
    torch.testing.assert_close(logp_b, logp_a, atol=1e-6, rtol=0)
    assert grads_a.keys() == grads_b.keys() and any(".layers.0." in n for n in grads_a)
    for n in grads_a:  # recomputed in the same order on the CPU: equal to float rounding
        torch.testing.assert_close(grads_b[n], grads_a[n], atol=1e-6, rtol=1e-5, msg=n)
    assert kept_b < 0.5 * kept_a, (kept_b, kept_a)
