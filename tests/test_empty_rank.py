"""A round with fewer prompts than processes (docs/gpu.md's 3 prompts under --nproc 4): the rank with none.

Its tensors must sit on the device it trains on, beside the other ranks' (checked under FakeTensorMode,
where CPU and CUDA tensors cannot mix), and under FSDP it joins the others' parameter gathers only when
they sample on the policy: with vLLM they sample outside it, and a gather of its own would be unmatched.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from grpo.config import TrainConfig
from grpo.sampling.prompt_samplers import DrawCounts
from grpo.sampling.rounds import generate_round, probe_features
from grpo.system.distributed import World

GPU = torch.device("cuda:0")


@dataclass(frozen=True)
class LastOfFour(World):
    """Rank 3 of 4, as torchrun starts it; its collectives return what World's do, on the devices they do."""

    rank: int = 3
    size: int = 4
    device: torch.device = GPU

    def gather(self, local):  # every rank's rows, as World.gather returns them: back on local's device
        return torch.zeros((6, *local.shape[1:]), dtype=local.dtype, device=self.device).to(local.device)

    def gather_objects(self, value):
        return [value] * self.size


class Recorder:
    """The policy's gathers: under FSDP each gathers every unit on every rank."""

    def __init__(self):
        self.calls = 0

    @contextmanager
    def gathered(self):
        self.calls += 1
        yield None

    def join_gathers(self):
        with self.gathered():
            pass


def _sampling(*, fsdp: bool = False, engine: object | None = None, agent: object | None = None):
    rows = [{"question": str(i), "answer": str(i)} for i in range(8)]
    generation = SimpleNamespace(world=LastOfFour(fsdp=fsdp), device=GPU, policy=Recorder(), engine=engine, agent=agent)
    return SimpleNamespace(config=TrainConfig(group_size=2), task=SimpleNamespace(train=rows), generation=generation,
                           drawing=SimpleNamespace(draws=DrawCounts(len(rows)), sampler=None))


def test_the_rank_with_no_prompt_has_its_tensors_on_its_gpu():
    sampling = _sampling()
    with FakeTensorMode(allow_non_fake_inputs=True):
        done = generate_round(sampling, [0, 1, 2], step=1, index=1)  # 3 prompts, 4 processes: rank 3 has none
        assert len(done.mine) == 0
        for name in ("rewards", "lengths", "truncated", "errors"):
            assert getattr(done, name).device == GPU, name
        for name in ("completion_ids", "mask", "logprobs", "truncated"):
            assert getattr(done.rollout, name).device == GPU, name
        # the rounds of a step are joined (grpo/sampling/rounds.py informative_batch): with another rank's round too
        other = torch.zeros(6, dtype=done.lengths.dtype, device=GPU)
        assert torch.cat([done.lengths, other]).device == GPU and torch.cat([done.truncated, other.bool()]).device == GPU


def test_under_fsdp_the_empty_rank_joins_the_gathers_only_when_the_others_sample_on_the_policy():
    own = _sampling(fsdp=True)
    with FakeTensorMode(allow_non_fake_inputs=True):
        generate_round(own, [0, 1, 2], step=1, index=1)
    assert own.generation.policy.calls == 1  # the own sampler: the others gather every unit; so does this rank
    vllm = _sampling(fsdp=True, engine=object())  # a stand-in engine: the others sample on vLLM
    with FakeTensorMode(allow_non_fake_inputs=True):
        generate_round(vllm, [0, 1, 2], step=1, index=1)
        probe_features(vllm, [0, 1, 2], step=1, index=1)
    assert vllm.generation.policy.calls == 0  # no gather the others do not make
    episodes = _sampling(fsdp=True, engine=object(), agent=object())  # episodes run under the policy's call
    with FakeTensorMode(allow_non_fake_inputs=True):
        generate_round(episodes, [0, 1, 2], step=1, index=1)
    assert episodes.generation.policy.calls == 1


def test_four_gloo_processes_and_a_round_of_three_prompts_under_fsdp_own_and_vllm(tmp_path):
    # a rank that gathered alone (the vllm case before the fix) would leave the others' next collective
    # unmatched: the run hangs, and the timeout ends it
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(tests.parent), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
           str(tests / "empty_rank_worker.py"), str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400, cwd=tests.parent)
    finished = all((tmp_path / f"rank{r}.json").exists() for r in range(4))
    # gloo's teardown can abort a rank after every rank has finished its round and passed the barrier
    # ('terminate called without an active exception', seen twice in clean-clone CI runs): that is not the
    # round's behaviour this test checks, so it is tolerated only then
    teardown_abort = finished and "terminate called without an active exception" in done.stderr
    assert done.returncode == 0 or teardown_abort, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    for rank, found in enumerate(ranks):
        for case in ("own", "vllm"):
            assert found[case]["mine"] == (0 if rank == 3 else 1)  # 3 prompts over 4 processes
            assert found[case]["rows"] == 3 * 2  # every rank holds the whole draw's lengths
            assert found[case]["devices"] == [found["device"]]  # on the device it trains on
