"""Data parallel across processes (gloo on the CPU): the same update as one process.

The torchrun launches are the slow part (about 10 s each on two cores), so
one launch runs every equivalence case.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_model, make_tokenizer
from distributed_worker import run_case

import grpo.run.checkpoint as checkpoint
from grpo.cli import main as cli_main
from grpo.system.distributed import World

TESTS = Path(__file__).parent
ROOT = TESTS.parent
CASES = [
    # a rank may own no group of a minibatch; pass@k sampled on 8 held-out prompts shared out over the ranks
    {"aggregate": "token", "minibatches": 2, "micro_batch_tokens": 1, "eval_samples": 4, "eval_k": [1, 4]},
    {"aggregate": "sequence", "scale": "batch", "beta": 0.1, "epochs": 2},  # batch std: needs gathered rewards
    {"aggregate": "fixed", "reward": "rare_first_char", "prompts_per_step": 8, "max_new_tokens": 3},  # skipping
    {"fsdp": True, "aggregate": "token", "minibatches": 2, "micro_batch_tokens": 1},  # padded micro-batches
    {"fsdp": True, "reward": "rare_first_char", "prompts_per_step": 8, "max_new_tokens": 3, "beta": 0.1, "epochs": 2},
    # dynamic sampling: later rounds draw odd numbers of groups, the batch is chosen from the global pool
    {"filter_groups": True, "reward": "rare_first_char", "max_new_tokens": 3, "max_gen_rounds": 6},
    {"filter_groups": True, "reward": "rare_first_char", "max_new_tokens": 3, "sampler": "frontier", "fsdp": True,
     "prompts_per_step": 6, "max_gen_rounds": 6, "beta": 0.1},
    {"same_prompt": True},  # every group asks the same: only the random streams tell them apart
    {"fsdp": True, "layers": 6, "hidden": 64, "beta": 0.1},  # sharded layer by layer: the memory it saves
    {"fsdp": True, "lora_rank": 4, "beta": 0.1, "lr": 1e-2},  # LoRA under FSDP; beta: the adapter switched off
    {"episodes": True, "fsdp": True},  # multi-turn episodes, each process running its share of the groups
    # errored rows (a reward that raises): left out of the loss, the normaliser and their group's statistics
    # on each process's share as on the whole batch
    {"reward": "raises_on_odd", "prompts_per_step": 8, "micro_batch_tokens": 1},
]
FILTERED = [i for i, case in enumerate(CASES) if case.get("filter_groups")]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def _torchrun(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", *args]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def two_process_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist") / "results.pt"
    proc = _torchrun("--standalone", "--nproc-per-node=2", str(TESTS / "distributed_worker.py"), str(out), json.dumps(CASES))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[json.dumps(c) for c in CASES])
def test_two_processes_make_the_update_of_one(two_process_results, index):
    one, two = run_case(CASES[index]), two_process_results[index]
    assert two["world_size"] == 2 and two["metrics"]["optimizer_steps"] >= 1
    shape = {key: CASES[index][key] for key in ("layers", "hidden") if key in CASES[index]}
    start = make_model(len(make_tokenizer()), seed=3, **shape).state_dict()
    if CASES[index].get("lora_rank"):  # the adapter's B starts at 0
        moved = max(v.abs().max().item() for k, v in one["params"].items() if "lora_B" in k)
    else:
        moved = max((one["params"][k] - start[k]).abs().max().item() for k in start)
    assert moved > 5e-4  # the step did something worth comparing (Adam moves weights by about lr = 1e-3)
    # lr is 1e-3, not larger: Adam turns float-summation-order differences in near-zero gradients
    # into differences of up to lr, and the comparison is to 3e-5 (seen: 1.1e-5 on one weight of the
    # same-prompt case with one thread on each side; a wrong update moves weights by about lr)
    for key, value in one["params"].items():
        torch.testing.assert_close(two["params"][key], value, atol=3e-5, rtol=0, msg=key)
    if CASES[index].get("reward") == "raises_on_odd":
        assert 0 < one["metrics"]["errored_frac"] < 1, one["metrics"]["errored_frac"]
    for key in ("reward_mean", "reward_std", "zero_var_frac", "trained_sequences", "optimizer_steps", "errored_frac",
                "completion_len", "grad_norm", "entropy", "kl", "gen_rounds", "generated_groups", "trained_groups",
                *(k for k in one["metrics"] if k.startswith("heldout_")),
                *(("turns_per_episode", "env_token_frac") if CASES[index].get("episodes") else ()),
                # the scorer's counts are the step's sums over ranks, its means over every rank's verdicts
                *(k for k in one["metrics"] if k.startswith(("reward_errors/", "reward_timeouts/", "reward_none/"))),
                *(f"reward/{k.split('/', 1)[1]}" for k in one["metrics"] if k.startswith("reward_errors/"))):
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-5, abs=1e-6), key
    assert two["generated"] == one["generated"]  # the same completions, round by round
    assert two["trained_prompts"] == one["trained_prompts"]  # the same groups, in the same order


def test_ranks_stop_together_on_rank_0s_verdict(tmp_path):
    # rank 1's alarms alone say stop; without the broadcast it left the loop and rank 0 hung in a collective
    out = tmp_path / "stop.pt"
    proc = _torchrun("--standalone", "--nproc-per-node=2", str(TESTS / "distributed_worker.py"), str(out),
                     json.dumps({"stop_on_rank": 1}), timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert torch.load(out, weights_only=False) == {"steps": [3, 3], "stopped": [None, None]}
    proc = _torchrun("--standalone", "--nproc-per-node=2", str(TESTS / "distributed_worker.py"), str(out),
                     json.dumps({"stop_on_rank": 0}), timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    stopped = torch.load(out, weights_only=False)
    assert stopped["steps"] == [1, 1] and stopped["stopped"] == ["no_signal (forced on rank 0)"] * 2


def test_the_episode_case_runs_several_turns(two_process_results):
    metrics = two_process_results[CASES.index({"episodes": True, "fsdp": True})]["metrics"]
    assert metrics["turns_per_episode"] > 1.5 and 0 < metrics["env_token_frac"] < 1


def test_dynamic_sampling_cases_need_several_rounds(two_process_results):
    for index in FILTERED:  # else they would not test choosing from the global pool
        metrics = two_process_results[index]["metrics"]
        assert metrics["gen_rounds"] >= 2 and metrics["generated_groups"] > CASES[index].get("prompts_per_step", 4)


def test_processes_sample_from_streams_of_their_own(two_process_results):
    """Every group asks the same prompt: with a stream shared by row position (as before), row j of each
    rank's groups drew the same numbers and so the same completion; with a stream per row they differ."""
    rank0, rank1 = two_process_results[CASES.index({"same_prompt": True})]["own_completions"]
    assert len(rank0) == len(rank1) == 8  # 2 groups of 4 each
    assert sum(a == b for a, b in zip(rank0, rank1, strict=True)) < 4


def test_fsdp_holds_a_share_of_the_training_state(two_process_results):
    """Parameters, gradients and Adam's moments on each of 2 ranks: at most 0.6 of one process's."""
    case = CASES.index({"fsdp": True, "layers": 6, "hidden": 64, "beta": 0.1})
    one = run_case(CASES[case])["state_bytes"][0]
    two = two_process_results[case]
    assert two["fsdp_units"] == [7, 7]  # the policy and the reference: each of 6 layers, then the root
    # resharded after forward: while training, a layer's forward finds at most itself and one prefetched
    # layer gathered (all 6 by the last one if the layers stayed gathered)
    assert 1 <= max(two["layers_held"]) <= 2, two["layers_held"]
    for rank, (held, rss) in enumerate(zip(two["state_bytes"], two["peak_rss_mib"], strict=True)):
        print(f"rank {rank}: {held} bytes of parameters + gradients + optimiser state "
              f"({held / one:.3f} of one process's {one}), peak RSS {rss:.0f} MiB")
        assert held <= 0.6 * one


def test_world_of_one_is_a_no_op():
    world = World()
    x = torch.arange(4.0)
    assert world.split(8) == range(8) and world.gather(x) is x and world.sum(x) is x and world.is_main


def test_a_split_gives_whole_contiguous_shares_the_first_ranks_one_more():
    assert [World(rank=r, size=3).split(8) for r in range(3)] == [range(0, 3), range(3, 6), range(6, 8)]
    assert [World(rank=r, size=3).split(2) for r in range(3)] == [range(0, 1), range(1, 2), range(2, 2)]


def _tiny_model_dir(path: Path) -> Path:
    tokenizer = make_tokenizer()
    make_model(len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


TRAIN_ARGS = ["--no-preflight", "--task", "add", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
              "--max-new-tokens", "3", "--eval-size", "4", "--sample-every", "1", "--device", "cpu", "--no-progress",
              "--sampler", "uniform", "--no-filter-groups", "--temperature", "1.0"]


def test_nproc_run_writes_once_and_its_model_trains_in_one_process(tmp_path):
    model = _tiny_model_dir(tmp_path / "tiny")
    run = tmp_path / "run2"
    cmd = [sys.executable, "-m", "grpo", "train", "--nproc", "2", "--model", str(model), "--output", str(run), *TRAIN_ARGS]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("run directory:") == 1 and "(2 processes)" in proc.stdout
    assert proc.stdout.count("step 0 held-out:") == 1  # rank 0 alone prints
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3  # the first evaluation, one step and the final evaluation
    samples = (run / "completions.jsonl").read_text().splitlines()
    assert len(samples) == 4  # both processes' groups: 2 prompts x G = 2
    assert cli_main(["train", "--model", str(run / "model"), "--output", str(tmp_path / "run1"), *TRAIN_ARGS]) == 0
    assert (tmp_path / "run1" / "model" / "config.json").is_file()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_nodes_on_one_machine_take_a_step(tmp_path):
    model = _tiny_model_dir(tmp_path / "tiny")
    port = str(_free_port())
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={rank}",
             "--nproc-per-node=1", "--master-addr=127.0.0.1", f"--master-port={port}",
             "-m", "grpo", "train", "--model", str(model), "--output", str(tmp_path / "run"), *TRAIN_ARGS],
            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=240) for node in nodes]
    for node, (_, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err[-4000:]
    assert "(2 processes)" in outputs[0][0] and "run directory" not in outputs[1][0]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 1


def test_checkpoints_without_fsdp_resume_at_another_world_size(tmp_path):
    """1 process -> 2 -> 1 again, without FSDP (rank 0 writes whole checkpoints), continues the run that
    1 process makes straight. Rewards that vary and lr 1e-2: every step updates, so a resume that lost
    the weights or the optimiser state would show."""
    model = _tiny_model_dir(tmp_path / "tiny")
    args = ["--model", str(model), *TRAIN_ARGS, "--prompts-per-step", "4", "--save-every", "1",
            "--rewards", f"{TESTS / 'distributed_worker.py'}:first_char", "--lr", "1e-2"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert cli_main(["train", "--output", str(straight), *args, "--steps", "3"]) == 0
    assert cli_main(["train", "--output", str(split), *args, "--steps", "1"]) == 0
    two = [sys.executable, "-m", "grpo", "train", "--nproc", "2", "--resume", str(split), "--steps", "2", "--no-progress"]
    proc = subprocess.run(two, env=_env(), capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    written = split / "checkpoints" / "step-00000002"  # by rank 0, whole
    assert (written / checkpoint.WEIGHTS).is_file() and not (written / checkpoint.SHARDS).exists()
    assert cli_main(["train", "--resume", str(split), "--steps", "3", "--no-progress"]) == 0
    ours, theirs = _metrics(split), _metrics(straight)
    assert [row["step"] for row in ours] == [row["step"] for row in theirs] == [0, 1, 2, 3, 3]
    assert all(row["optimizer_steps"] == 1 for row in ours[1:4])
    for mine, other in zip(ours[1:4], theirs[1:4], strict=True):
        for key in ("reward_mean", "reward_std", "completion_len", "trained_sequences", "loss", "grad_norm"):
            assert mine[key] == pytest.approx(other[key], rel=1e-6, abs=1e-7), (mine["step"], key)
    saved = [torch.load(checkpoint.latest(run) / checkpoint.WEIGHTS) for run in (straight, split)]
    for key, value in saved[0].items():
        torch.testing.assert_close(saved[1][key], value, atol=1e-5, rtol=0, msg=key)


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_fsdp_checkpoints_resume_at_another_world_size(tmp_path):
    """1 process -> 2 under FSDP (a whole checkpoint in, shards out) -> 2 under FSDP (shards in) -> 1 again
    (shards in) continues the run that 1 process makes straight."""
    model = _tiny_model_dir(tmp_path / "tiny")
    args = ["--model", str(model), *TRAIN_ARGS, "--prompts-per-step", "4", "--save-every", "1",
            "--rewards", f"{TESTS / 'distributed_worker.py'}:first_char", "--lr", "1e-2"]  # so that steps update
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert cli_main(["train", "--output", str(straight), *args, "--steps", "5"]) == 0
    assert cli_main(["train", "--output", str(split), *args, "--steps", "2"]) == 0
    for steps in ("3", "4"):
        two = [sys.executable, "-m", "grpo", "train", "--nproc", "2", "--resume", str(split), "--steps", steps,
               "--fsdp", "--no-progress"]
        proc = subprocess.run(two, env=_env(), capture_output=True, text=True, timeout=240, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-4000:]
    written = split / "checkpoints" / "step-00000004"  # under FSDP, each process its shards
    assert (written / "meta.json").is_file() and (written / checkpoint.SHARDS / ".metadata").is_file()
    assert len(list((written / checkpoint.SHARDS).glob("*.distcp"))) == 2 and not (written / checkpoint.WEIGHTS).exists()
    assert cli_main(["train", "--resume", str(split), "--steps", "5", "--no-fsdp", "--no-progress"]) == 0
    ours, theirs = _metrics(split), _metrics(straight)
    steps = [row["step"] for row in ours]
    assert steps == [row["step"] for row in theirs] == [0, 1, 2, 3, 4, 5, 5]
    assert all(row["optimizer_steps"] == 1 for row in ours[1:6])
    for mine, other in zip(ours[1:6], theirs[1:6], strict=True):  # the same completions, scored alike
        for key in ("reward_mean", "reward_std", "completion_len", "trained_sequences", "loss", "grad_norm"):
            assert mine[key] == pytest.approx(other[key], rel=1e-6, abs=1e-7), (mine["step"], key)
    saved = {name: torch.load(checkpoint.latest(run) / checkpoint.WEIGHTS) for name, run in
             (("straight", straight), ("split", split))}
    for key, value in saved["straight"].items():
        torch.testing.assert_close(saved["split"][key], value, atol=1e-5, rtol=0, msg=key)


def _update(run: Path, start: dict[str, torch.Tensor]) -> torch.Tensor:
    """The run's whole parameter update, final model minus the start, as one vector."""
    from safetensors.torch import load_file

    final = load_file(run / "model" / "model.safetensors")
    return torch.cat([(final[k] - start[k]).reshape(-1) for k in sorted(final)])


def test_the_cli_on_two_processes_trains_as_on_one(tmp_path):
    """3 steps with the defaults (frontier sampler, filter-groups, pre-flight check): the same prompts,
    completions and rewards, the same metrics and, to float noise, the same update."""
    model = _tiny_model_dir(tmp_path / "tiny")
    args = ["train", "--model", str(model), "--task", "add", "--steps", "3", "--eval-size", "8",
            "--rewards", f"{TESTS / 'distributed_worker.py'}:rare_first_char", "--sample-every", "1",
            "--device", "cpu", "--no-progress"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli_main([*args, "--output", str(one)]) == 0
    cmd = [sys.executable, "-m", "grpo", *args, "--nproc", "2", "--output", str(two)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]

    rows = [[json.loads(x) for x in (run / "completions.jsonl").read_text().splitlines()] for run in (one, two)]
    assert len(rows[0]) == len(rows[1]) == 3 * 8 * 8  # every trained completion, from both processes
    def key(r: dict) -> tuple:
        return r["step"], r["prompt"], r["completion"], r["reward"]
    same = sum(key(a) == key(b) for a, b in zip(*rows, strict=True))
    print(f"{same} of {len(rows[0])} rows with the same prompt, completion and reward")
    assert same >= 0.99 * len(rows[0])
    assert max(m["gen_rounds"] for m in _metrics(one)[1:4]) >= 2  # dynamic sampling drew a further round
    for a, b in zip(_metrics(one)[1:4], _metrics(two)[1:4], strict=True):
        assert a["step"] == b["step"]
        for k in ("reward_mean", "reward_std", "gen_rounds", "generated_groups", "trained_groups", "mixed_frac",
                  "completion_len", "optimizer_steps", "trained_sequences", "loss", "grad_norm", "entropy"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), (a["step"], k)
    from safetensors.torch import load_file

    start = load_file(model / "model.safetensors")
    d1, d2 = _update(one, start), _update(two, start)
    relative = float((d2 - d1).norm() / d1.norm())
    print(f"update: |d1| = {float(d1.norm()):.4g}, |d2 - d1| / |d1| = {relative:.3g}")
    assert float(d1.norm()) > 0 and relative < 1e-3


def test_lora_under_fsdp_saves_a_merged_model_and_resumes_in_one_process(tmp_path):
    model = _tiny_model_dir(tmp_path / "tiny")
    run = tmp_path / "run"
    two = [sys.executable, "-m", "grpo", "train", "--nproc", "2", "--fsdp", "--lora-rank", "4", "--lr", "1e-2",
           "--model", str(model), "--output", str(run), *TRAIN_ARGS, "--steps", "2", "--save-every", "1",
           "--rewards", f"{TESTS / 'distributed_worker.py'}:first_char"]  # varied rewards: something to learn
    proc = subprocess.run(two, env=_env(), capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    from safetensors.torch import load_file

    start, merged = load_file(model / "model.safetensors"), load_file(run / "model" / "model.safetensors")
    assert start.keys() == merged.keys()  # an ordinary model, the adapter merged in
    assert max((merged[k] - start[k]).abs().max().item() for k in start) > 1e-4  # ... and trained
    assert (run / "model" / "adapter" / "adapter_config.json").is_file()
    assert cli_main(["train", "--resume", str(run), "--steps", "3", "--no-fsdp", "--no-progress"]) == 0
    assert [row["step"] for row in _metrics(run)][-2:] == [3, 3]
