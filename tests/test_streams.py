"""Random streams keyed by what is sampled (grpo/sampling/random_streams.py) and generation that uses them."""

from __future__ import annotations

import torch

from grpo.sampling.random_streams import _mix, _mul32, stream_keys, stream_uniforms
from grpo.sampling.rollout import generate


def test_mul32_is_the_product_modulo_2_to_the_32():
    x = torch.tensor([0, 1, 0xFFFF, 0x10000, 0xDEADBEEF, 0xFFFFFFFF])
    for c in (0x7FEB352D, 0x846CA68B):
        assert _mul32(x, c).tolist() == [(int(v) * c) % 2**32 for v in x]


def test_mix_matches_lowbias32():
    def lowbias32(x: int) -> int:  # the reference, in Python integers
        x ^= x >> 16
        x = (x * 0x7FEB352D) % 2**32
        x ^= x >> 15
        x = (x * 0x846CA68B) % 2**32
        return x ^ (x >> 16)

    values = [0, 1, 2, 12345, 0x80000000, 0xFFFFFFFF]
    assert _mix(torch.tensor(values)).tolist() == [lowbias32(v) for v in values]


def test_a_stream_is_its_key_alone():
    rows = torch.arange(1000)
    keys = stream_keys(7, 3, 0, rows)  # (n, 2)
    assert torch.equal(keys[500:501], stream_keys(7, 3, 0, rows[500:501]))  # not the batch around it
    assert len({tuple(k) for k in keys.tolist()}) == 1000
    for other in (stream_keys(8, 3, 0, rows), stream_keys(7, 4, 0, rows), stream_keys(7, 3, 1, rows)):
        assert not (other == keys).all(dim=1).any()  # another seed, step or round: other streams
    u = torch.stack([stream_uniforms(keys, t) for t in range(50)])  # (50, 1000)
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.std()) - 12**-0.5) < 0.01
    assert abs(float(torch.corrcoef(u[:2])[0, 1])) < 0.1  # successive positions
    assert abs(float(torch.corrcoef(u[:, :2].T)[0, 1])) < 0.4  # neighbouring rows (50 draws each)


def test_generation_with_streams_does_not_depend_on_the_batch(tiny_model, tokenizer):
    prompts = [tokenizer.encode("say a 1"), tokenizer.encode("say a 12"), tokenizer.encode("hi")]
    keys = stream_keys(1, 1, 0, torch.arange(3 * 4))
    together = generate(tiny_model, tokenizer, prompts, group_size=4, max_new_tokens=8, streams=keys)
    alone = generate(tiny_model, tokenizer, prompts[1:2], group_size=4, max_new_tokens=8, streams=keys[4:8])
    assert together.texts[4:8] == alone.texts
    assert len(set(together.texts[4:8])) > 1  # the group's completions differ from each other
    again = generate(tiny_model, tokenizer, prompts, group_size=4, max_new_tokens=8, streams=keys)
    assert torch.equal(again.completion_ids, together.completion_ids)
