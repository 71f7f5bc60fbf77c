"""Sampling on reordered weights (grpo/sampling/packed_linear.py): the same products to fp32 rounding, only while it is safe."""

import threading

import pytest
import torch
from conftest import make_model, make_tokenizer

import grpo.sampling.packed_linear as packed
from grpo.learning.logprobs import rollout_logprobs
from grpo.run.memory import predict
from grpo.run.memory_shapes import Device, ModelShape, RunShape
from grpo.sampling.forward import head_logits
from grpo.sampling.packed_linear import packed_linears, reordered
from grpo.sampling.rollout import generate

needs_onednn = pytest.mark.skipif(not packed.onednn_here(), reason="reordered weights need an x86 CPU with oneDNN")


@pytest.fixture(autouse=True)
def two_threads():
    """The tests run on one thread (conftest.py); sampling reorders its weights on more than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)

FP32_TOLERANCE = 1e-5


def _prompts(tokenizer):
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)["input_ids"]
            for q in ["1+2?", "What is 30+4?", "hi"]]


@needs_onednn
def test_inside_the_scope_every_linear_runs_on_a_reordered_copy_with_the_same_values():
    layer = torch.nn.Linear(64, 96)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
    with torch.no_grad(), packed_linears(layer):
        assert reordered(layer.weight) is not None
        assert "forward" in layer.__dict__
        inside = layer(x)
    torch.testing.assert_close(inside, expected, rtol=FP32_TOLERANCE, atol=FP32_TOLERANCE)
    assert reordered(layer.weight) is None and "forward" not in layer.__dict__ and not packed._packed


@needs_onednn
def test_a_changed_weight_a_recorded_gradient_and_autocast_fall_back_to_f_linear():
    layer = torch.nn.Linear(8, 8)
    with packed_linears(layer):
        assert reordered(layer.weight) is None  # gradients on: the training pass keeps F.linear
        with torch.no_grad():
            assert reordered(layer.weight) is not None
            with torch.autocast("cpu", dtype=torch.bfloat16):
                assert reordered(layer.weight) is None
                assert layer(torch.randn(2, 8)).dtype == torch.bfloat16
            layer.weight.add_(1.0)  # an optimiser step inside the scope: the copy is stale
            assert reordered(layer.weight) is None
            torch.testing.assert_close(layer(torch.eye(8)), layer.weight.T + layer.bias)


@needs_onednn
def test_the_scope_is_undone_on_an_error_and_does_nothing_off_the_main_thread():
    layer = torch.nn.Linear(8, 8)
    with pytest.raises(RuntimeError), packed_linears(layer):
        raise RuntimeError("sampling failed")
    assert "forward" not in layer.__dict__ and not packed._packed
    seen = []

    def elsewhere():
        with torch.no_grad(), packed_linears(layer):
            seen.append(reordered(layer.weight))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert seen == [None]


@needs_onednn
def test_a_lazy_scope_reorders_at_the_first_turn_inside_it_once_and_releases_at_its_end(monkeypatch):
    calls = []
    reorder = torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(packed.torch.ops.mkldnn, "_reorder_linear_weight",
                        lambda w, rows: calls.append(w.shape) or reorder(w, rows), raising=False)
    model, turn_only = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)
    with torch.no_grad(), packed_linears(model, lazy=True):  # a step's sampling
        assert reordered(model.weight) is None and not calls  # nothing sampled yet: nothing spent
        with packed_linears(model):  # the first round's turn
            assert reordered(model.weight) is not None
        with packed_linears(model, turn_only):  # the second round's: the first one's copy, and its own layer
            assert reordered(model.weight) is not None and reordered(turn_only.weight) is not None
        assert reordered(model.weight) is not None  # kept for the step's next round
    assert calls == [(8, 8), (4, 8)]
    assert not packed._packed and "forward" not in model.__dict__ and "forward" not in turn_only.__dict__


@needs_onednn
def test_tied_weights_are_reordered_once_and_the_output_layer_uses_them(monkeypatch):
    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), hidden=64)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    calls = []
    reorder = torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(packed.torch.ops.mkldnn, "_reorder_linear_weight",
                        lambda w, rows: calls.append(w.shape) or reorder(w, rows), raising=False)
    hidden = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    pointwise, used = torch.ops.mkldnn._linear_pointwise, []
    monkeypatch.setattr(packed.torch.ops.mkldnn, "_linear_pointwise",
                        lambda *a: used.append(a[1].shape) or pointwise(*a), raising=False)
    with torch.no_grad(), packed_linears(model):
        assert reordered(model.lm_head.weight) is not None
        logits = head_logits(hidden, model.lm_head)
    assert len(used) == 1  # the output layer's product ran on the copy
    assert calls.count(model.lm_head.weight.shape) == 1
    assert len(calls) == sum(isinstance(m, torch.nn.Linear) for m in model.modules())  # each layer once
    torch.testing.assert_close(logits, hidden @ model.lm_head.weight.T, rtol=FP32_TOLERANCE, atol=FP32_TOLERANCE)


@needs_onednn
def test_on_another_cpu_nothing_is_reordered(monkeypatch):
    monkeypatch.setattr(packed, "X86", False)
    layer = torch.nn.Linear(8, 8)
    with torch.no_grad(), packed_linears(layer):
        assert reordered(layer.weight) is None and "forward" not in layer.__dict__


@needs_onednn
def test_sampled_log_probs_agree_with_the_trainer_to_fp32_rounding(monkeypatch):
    """The sampler decodes on reordered weights, the trainer's pass uses F.linear: the sampling ratio
    stays 1 to fp32 rounding. Greedy decoding picks the same tokens as without reordering."""
    tokenizer = make_tokenizer()
    model = make_model(len(tokenizer), seed=3, hidden=64, layers=3)
    calls = []
    pointwise = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(packed.torch.ops.mkldnn, "_linear_pointwise",
                        lambda *a: calls.append(1) or pointwise(*a), raising=False)
    rollout = generate(model, tokenizer, _prompts(tokenizer), group_size=4, max_new_tokens=16, temperature=0.7,
                       generator=torch.Generator().manual_seed(0))
    assert calls, "the decode ran on reordered weights"
    with torch.no_grad():
        trainer, _ = rollout_logprobs(model, rollout, tokenizer.pad_token_id, temperature=0.7)
    assert rollout.mask.sum() > 100
    gap = ((trainer - rollout.logprobs) * rollout.mask).abs()
    assert gap.max() <= FP32_TOLERANCE, f"max |log pi_trainer - log pi_sampler| = {gap.max():.2e}"
    greedy = generate(model, tokenizer, _prompts(tokenizer), group_size=1, max_new_tokens=16, temperature=0.0)
    monkeypatch.setattr(packed, "X86", False)
    plain = generate(model, tokenizer, _prompts(tokenizer), group_size=1, max_new_tokens=16, temperature=0.0)
    assert torch.equal(greedy.completion_ids, plain.completion_ids)


def test_the_memory_prediction_counts_the_reordered_copy_while_sampling():
    shape = ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=10, tied=True)
    run = RunShape(group_size=4, prompts_per_step=2, max_new_tokens=3, prompt_tokens=5, micro_batch_tokens=100,
                   eval_batch_size=1, eval_rows=1, reward_workers=0, steps=3)
    plain = predict(shape, run, Device("cpu")).phases
    with_copy = predict(shape, run, Device("cpu", packs_weights=True)).phases
    # a layer's weights and norms 592 (tests/test_memory.py), two layers 1184, the output layer 10 x 8 = 80:
    # 1264 fp32 floats
    assert with_copy["sampling"] - plain["sampling"] == 4 * 1264
    assert with_copy["evaluation"] - plain["evaluation"] == 4 * 1264
    assert with_copy["the update"] == plain["the update"]
    assert predict(shape, run, Device("cuda", packs_weights=True)).phases == predict(shape, run, Device("cuda")).phases


@needs_onednn
def test_an_error_midway_through_the_reordering_leaves_no_layer_patched(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    reorder, calls = torch.ops.mkldnn._reorder_linear_weight, []

    def failing(w, rows):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return reorder(w, rows)

    monkeypatch.setattr(packed.torch.ops.mkldnn, "_reorder_linear_weight", failing, raising=False)
    with pytest.raises(RuntimeError, match="out of memory"), torch.no_grad(), packed_linears(model, lazy=True):
        with packed_linears(model):
            pass
    assert not any("forward" in m.__dict__ for m in model) and not packed._packed
    assert packed._scope == {"depth": 0, "pending": (), "layers": []}


@needs_onednn
def test_a_subclass_with_its_own_forward_keeps_it():
    class Scaled(torch.nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    layer = Scaled(4, 4)
    with torch.no_grad(), packed_linears(layer):
        assert "forward" not in layer.__dict__ and reordered(layer.weight) is None
        torch.testing.assert_close(layer(torch.eye(4)), 2 * (layer.weight.T + layer.bias))


@needs_onednn
def test_a_step_reorders_once_for_all_its_rounds_and_the_update_runs_on_the_weights(monkeypatch):
    """The user's path: trainer steps with dynamic sampling's several rounds; one reordering a step, inside
    the generation time, and nothing left patched or held once the step's sampling ends."""
    from tiny_run import tiny_trainer

    calls = []
    reorder = torch.ops.mkldnn._reorder_linear_weight
    trainer = tiny_trainer(steps=2, filter_groups=True, max_gen_rounds=3, eval_every=0)
    layers = sum(isinstance(m, torch.nn.Linear) for m in trainer.model.modules())
    monkeypatch.setattr(packed.torch.ops.mkldnn, "_reorder_linear_weight",
                        lambda w, rows: calls.append(torch.is_grad_enabled()) or reorder(w, rows), raising=False)
    rounds = []
    for step in (1, 2):
        before = len(calls)
        record = trainer.step(step)
        rounds.append(record["gen_rounds"])
        assert len(calls) - before == layers  # one reordering a step, whatever the rounds
        assert not packed._packed and not any("forward" in m.__dict__ for m in trainer.model.modules())
    assert max(rounds) > 1, rounds  # several rounds did share it
    assert not any(calls)


def test_on_other_cpus_or_when_turned_off_nothing_is_reordered_and_nothing_is_counted(monkeypatch):
    monkeypatch.setenv("GRPO_REORDERED_WEIGHTS", "0")
    assert not packed.packs_here()
    from tiny_run import tiny_config

    from grpo.run.memory_check import run_device

    assert not run_device(tiny_config(), 1).packs_weights
    monkeypatch.delenv("GRPO_REORDERED_WEIGHTS")
    assert run_device(tiny_config(), 1).packs_weights == packed.packs_here()


def test_sampling_ahead_in_a_thread_counts_no_copy():
    shape = ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=10, tied=True)
    run = RunShape(group_size=4, prompts_per_step=2, max_new_tokens=3, prompt_tokens=5, micro_batch_tokens=100,
                   eval_batch_size=1, eval_rows=1, reward_workers=0, steps=3, async_lag=1)
    terms = predict(shape, run, Device("cpu", packs_weights=True)).phases
    assert terms["sampling"] == predict(shape, run, Device("cpu")).phases["sampling"]
    assert terms["evaluation"] > predict(shape, run, Device("cpu")).phases["evaluation"]  # on the main thread


@needs_onednn
def test_on_one_thread_nothing_is_reordered():
    torch.set_num_threads(1)
    layer = torch.nn.Linear(8, 8)
    with torch.no_grad(), packed_linears(layer):
        assert reordered(layer.weight) is None and "forward" not in layer.__dict__
