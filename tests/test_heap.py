"""Sampling reuses freed heap blocks (grpo/system/heap_settings.py) and gives back the training process's release after."""

import threading

import pytest
import torch

import grpo.system.heap_settings as heap
from grpo.sampling.rollout import generate


class FakeLibc:
    """Records mallopt and malloc_trim calls instead of changing the process's allocator."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append(("mallopt", param, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("malloc_trim", pad))
        return 1


@pytest.fixture
def libc(monkeypatch):
    fake = FakeLibc()
    monkeypatch.setattr(heap, "_libc", lambda: fake)
    monkeypatch.setitem(heap._released, "mib", 0)
    monkeypatch.setitem(heap._released, "depth", 0)
    return fake


KEEP = [("mallopt", heap.M_MMAP_THRESHOLD, 32 << 20), ("mallopt", heap.M_TOP_PAD, 64 << 20)]
RESTORE = [("mallopt", heap.M_MMAP_THRESHOLD, 1 << 20), ("mallopt", heap.M_TOP_PAD, 128 << 10), ("malloc_trim", 0)]


def test_the_scope_keeps_freed_blocks_inside_and_restores_the_release_after(libc):
    heap.release_freed_memory(1)
    assert libc.calls == [("mallopt", heap.M_MMAP_THRESHOLD, 1 << 20)]
    libc.calls.clear()
    with heap.reuse_freed_memory():
        assert libc.calls == KEEP
        with heap.reuse_freed_memory():  # nested: the outer scope alone sets and restores
            pass
        assert libc.calls == KEEP
    assert libc.calls == KEEP + RESTORE
    libc.calls.clear()
    with pytest.raises(RuntimeError), heap.reuse_freed_memory():  # restored on an error too
        raise RuntimeError
    assert libc.calls == KEEP + RESTORE


def test_the_scope_changes_nothing_without_a_release_or_off_the_main_thread(libc):
    with heap.reuse_freed_memory():  # heap_release_mb = 0: glibc's own thresholds already reuse blocks
        pass
    heap.release_freed_memory(0)
    assert libc.calls == []
    heap.release_freed_memory(2)
    libc.calls.clear()

    def sample() -> None:  # the --async-lag sampling thread runs beside the update
        with heap.reuse_freed_memory():
            pass

    thread = threading.Thread(target=sample)
    thread.start(), thread.join()
    assert libc.calls == []


def _prompts(tokenizer):
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)["input_ids"]
            for q in ("1+2?", "What is 30+4?")]


def test_a_turn_is_sampled_inside_the_scope(libc, tiny_model, tokenizer):
    heap.release_freed_memory(1)
    libc.calls.clear()
    generate(tiny_model, tokenizer, _prompts(tokenizer), group_size=2, max_new_tokens=4,
             generator=torch.Generator().manual_seed(0))
    assert libc.calls == KEEP + RESTORE


def test_the_scope_samples_the_same_tokens_and_logprobs_bit_for_bit(monkeypatch, tiny_model, tokenizer):
    # _released recorded by monkeypatch before anything sets it, and glibc's threshold put back after, so
    # the 1 MiB release does not leak into the rest of the session
    before = heap._released["mib"]
    monkeypatch.setitem(heap._released, "depth", 0)
    monkeypatch.setitem(heap._released, "mib", before)
    heap.release_freed_memory(1)  # what a training process sets (heap_release_mb = 1), with glibc's real allocator
    out = {}
    try:
        for mib in (0, 1, 0, 1):  # 0: the scope is off, every freed block of 1 MiB and more goes back at once
            heap._released["mib"] = mib
            streams = torch.tensor([[11, 12], [13, 14], [15, 16], [17, 18]])
            r = generate(tiny_model, tokenizer, _prompts(tokenizer), group_size=2, max_new_tokens=16,
                         streams=streams, stop_token_ids=[])
            if mib in out:
                assert torch.equal(r.completion_ids, out[mib].completion_ids)
            out[mib] = r
    finally:
        libc = heap._libc()
        if libc is not None:  # glibc's threshold as it was: the session's release, else glibc's 128 KiB start
            libc.mallopt(heap.M_MMAP_THRESHOLD, (before << 20) if before else 128 << 10)
    assert torch.equal(out[0].completion_ids, out[1].completion_ids)
    assert torch.equal(out[0].logprobs, out[1].logprobs)
