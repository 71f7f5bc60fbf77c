"""A GPU run's start-up order and its CUDA calls, tested on this CPU build with those calls patched.

``cuda`` below stands for the driver: every patched call that would initialise CUDA in a real run
(mem_get_info, set_device, moving a module to a GPU) marks it initialised, and torch.cuda.is_initialized
reads the mark, as grpo/system/workers.py does to choose between forking its workers and a fresh interpreter.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import grpo.run.memory_check
import grpo.system.workers as workers
from grpo.config import ConfigError, TrainConfig
from grpo.rewards import combine_rewards
from grpo.rewards.basic import final_number
from grpo.run.build import check_before_loading, resolve_run
from grpo.sampling.prompts import r1_zero_reward
from grpo.sampling.tools import ToolCall
from grpo.system.distributed import init_world


class FakeCuda:
    """The CUDA calls of a GPU run, on a CPU build: each that would start CUDA marks it started."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started_by: list[str] = []
        mark = self.started_by.append
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: bool(self.started_by))
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (mark("mem_get_info"), (20 << 30, 24 << 30))[1])
        monkeypatch.setattr(torch.cuda, "set_device", lambda *a: mark("set_device"))
        monkeypatch.setattr(torch.cuda, "init", lambda: mark("init"))
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a: True)  # autocast asks
        # what a child interpreter reads (grpo.run.memory_check.cuda_memory): it starts CUDA there, not here
        monkeypatch.setattr(grpo.run.memory_check, "cuda_memory", lambda index: (20 << 30, 24 << 30), raising=False)
        real_to = nn.Module.to

        def to(module, *args, **kwargs):  # a move to a GPU starts CUDA; the module stays where it is
            target = args[0] if args else kwargs.get("device")
            if isinstance(target, (str, torch.device)) and torch.device(target).type == "cuda":
                mark("Module.to(cuda)")
                return module
            return real_to(module, *args, **kwargs)

        monkeypatch.setattr(nn.Module, "to", to)


def main_reward(completion: str, example: dict) -> float:
    """Stands for a reward defined in a user's script: pickled by name, it would not load elsewhere."""
    return 0.5


main_reward.__module__, main_reward.__qualname__ = "__main__", "defined_in_a_notebook"


def main_tool(x: int) -> str:
    """Three times a number.

    Args:
        x: the number
    """
    return str(3 * int(x))


main_tool.__module__, main_tool.__qualname__ = "__main__", "defined_in_a_script"


def test_the_memory_check_and_init_world_do_not_start_cuda(monkeypatch):
    cuda = FakeCuda(monkeypatch)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    run = resolve_run(TrainConfig(task="add", device="cuda", steps=1))
    checked = check_before_loading(run, 1)
    world = init_world("cuda")
    assert world.device == torch.device("cuda:0")
    assert cuda.started_by == [] and not workers.cuda_initialised()
    assert checked.config.device == "cuda"


def test_free_gpu_memory_unreadable_is_one_line(monkeypatch):
    # this CPU build has no CUDA: the child interpreter's mem_get_info fails, and says so in one line
    with pytest.raises(ConfigError, match=r"^cannot read the free memory of cuda:0: [^\n]+$"):
        grpo.run.memory_check.cuda_memory(0)


def test_a_builtin_r1_zero_reward_reaches_workers_started_from_a_fresh_interpreter(monkeypatch):
    monkeypatch.setattr(workers, "cuda_initialised", lambda: True)  # a GPU after the model moved
    score = combine_rewards([r1_zero_reward(final_number)], workers=1, timeout=30.0)
    try:
        rewards, _ = score(["2 and 5 make 7 </think> <answer>7</answer>", "2 and 5 make 8 </think> <answer>8</answer>"],
                           [{"answer": "7"}, {"answer": "7"}])
        assert rewards.tolist() == pytest.approx([1.0, 0.1])
    finally:
        score.close()


def _trainer(monkeypatch, **options):
    from grpo.run.trainer import GRPOTrainer

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cuda = FakeCuda(monkeypatch)
    tools = options.pop("tools", False)
    config = TrainConfig(task="add", device="cuda", steps=1, prompts_per_step=2, group_size=2, max_new_tokens=8,
                         reward_workers=1, preflight="off", **options)
    run = check_before_loading(resolve_run(config, rewards=[main_reward]), 1)
    world = init_world("cuda")
    trainer = GRPOTrainer(run, world=world, progress=False, tools=[main_tool] if tools else None)
    return trainer, cuda


def test_an_r1_zero_run_and_a_main_reward_reach_their_forked_workers_before_cuda_starts(monkeypatch):
    trainer, cuda = _trainer(monkeypatch, prompt_format="r1-zero")
    try:
        assert "set_device" in cuda.started_by  # the build did start CUDA, after its pools
        rewards, _ = trainer.score(["anything"], [{"answer": "1"}])
        assert rewards.tolist() == [0.5]  # the __main__ reward ran in its worker
        checked, _ = trainer.checker(["</think> <answer>1</answer>"], [{"answer": "1"}])
        assert checked.tolist() == [1.0]  # r1-zero's reward around the task's checker
    finally:
        trainer.close()


def test_a_scripts_tool_reaches_its_forked_worker_before_cuda_starts(monkeypatch):
    trainer, cuda = _trainer(monkeypatch, tools=True)
    try:
        assert cuda.started_by
        [result] = trainer.toolbox.run([ToolCall(name="main_tool", args=(4,))])
        assert result.text == "12", result
    finally:
        trainer.close()


def test_a_checkpoint_keeps_one_gpu_rng_state_and_resumes_where_fewer_gpus_are_visible(monkeypatch):
    from grpo.run.checkpoint import global_rng_state, set_global_rng_state

    states = {i: torch.full((16,), i, dtype=torch.uint8) for i in range(8)}  # 8 GPUs, as under --nproc 8
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": states[0])
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(states.values()))
    saved = global_rng_state()
    assert [s.tolist() for s in saved["cuda"]] == [states[0].tolist()]
    restored = []

    def set_all(new):  # torch's: one state per visible GPU, and there is one now
        if len(new) > 1:
            raise RuntimeError("invalid device ordinal")
        restored.extend(new)

    monkeypatch.setattr(torch.cuda, "set_rng_state_all", set_all)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda new, device="cuda": restored.append(new))
    set_global_rng_state(saved)
    assert [s.tolist() for s in restored] == [states[0].tolist()]


def test_preflights_timed_update_calls_the_policy_as_a_step_does_and_waits_for_the_gpu(monkeypatch):
    from contextlib import nullcontext
    from types import SimpleNamespace

    import grpo.learning.update
    from grpo.sampling.rollout import Rollout
    from grpo.sampling.step_parts import Temperature
    from grpo.system.distributed import World

    events: list[str] = []
    calls: list[dict] = []

    def policy(fn, part, pad_id, **options):  # records the options; one layer's all-gather per call under FSDP
        calls.append(options)
        events.append("forward")
        return torch.zeros(part.mask.shape, requires_grad=True), None

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("synchronize"))
    monkeypatch.setattr(grpo.learning.update.time, "perf_counter", lambda: events.append("clock") or float(len(events)))
    rollout = Rollout(prompt_ids=[[1, 2], [1, 2]], completion_ids=torch.ones((2, 3), dtype=torch.long),
                      mask=torch.ones((2, 3)), logprobs=torch.zeros((2, 3)), truncated=torch.zeros(2, dtype=torch.bool),
                      texts=["", ""], group_size=2)
    for fsdp in (True, False):
        learner = SimpleNamespace(config=TrainConfig(group_size=2), policy=policy, world=World(fsdp=fsdp),
                                  tokenizer=SimpleNamespace(pad_token_id=0), autocast=nullcontext(),
                                  optimizer=SimpleNamespace(zero_grad=lambda **kw: None), temperature=Temperature(1.0),
                                  teacher=None)
        grpo.learning.update.update_seconds(learner, rollout)
        assert calls[-1]["share_prefix"] is (not fsdp)  # as micro_step: one decoder call per micro-batch under FSDP
    # each reading of the clock waits for what the GPU was given
    assert events[:4] == ["synchronize", "clock", "forward", "synchronize"] and events[4] == "clock"


def test_under_fsdp_the_full_models_stay_on_the_cpu_until_sharding(monkeypatch):
    from conftest import make_model

    import grpo.run.build
    from grpo.system.distributed import ModelCalls, World

    where: list[tuple[str, torch.device]] = []

    def shard(model, world):  # FSDP2's fully_shard moves each rank's shards to the mesh's device itself
        where.append(("sharded" if world.fsdp else "wrapped", next(model.parameters()).device))
        return ModelCalls(model)

    monkeypatch.setattr(grpo.run.build, "shard_policy", shard)
    gpu = torch.device("meta")  # stands for the GPU: a move there is seen, and costs nothing
    for fsdp in (True, False):
        where.clear()
        config = TrainConfig(beta=0.04, fsdp=fsdp)
        model, _, reference, _ = grpo.run.build.build_policy(config, World(device=gpu, fsdp=fsdp), gpu, make_model(64))
        assert reference is not None and len(where) == 2  # the reference, then the policy
        expected = torch.device("cpu") if fsdp else gpu
        assert [d for _, d in where] == [expected, expected], (fsdp, where)


@pytest.mark.parametrize(("name", "index"), [("cuda", 0), ("cuda:0", 0), ("cuda:3", 3)])
def test_the_first_cuda_call_takes_a_device_without_an_index(monkeypatch, name, index):
    """A world of one trains on pick_device's ``cuda`` (no index): torch's own set_device refuses a device
    without one, so use_device names the first GPU."""
    from grpo.system.distributed import use_device

    chosen = []
    monkeypatch.setattr(torch._C, "_cuda_setDevice", chosen.append, raising=False)
    use_device(torch.device(name))
    assert chosen == [index]
