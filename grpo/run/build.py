"""A run's one setup path and the building of its parts. :func:`resolve_run` resolves what a run is (its task
and rewards) and refuses what the options and the world size rule out, before anything loads; `grpo train`,
`grpo preflight` and grpo.train() all start there, then run the memory check before loading
(:func:`check_before_loading`). Then the parts, in the order they depend on each other:
the rewards' scorer, the policy (loaded, LoRA-wrapped, sharded) with its reference and optimiser, the vLLM
engine; then what the pre-flight check settles of the config. grpo/run/trainer.py calls these once; each takes
what it reads and returns what it built."""

from __future__ import annotations

import copy
import json
import math
import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import torch
from torch import nn

from grpo.chat_template import model_has_chat_template
from grpo.config import DATA_MAX_NEW_TOKENS, STANDING, ConfigError, TrainConfig, with_given
from grpo.config_resolution import resolve_config
from grpo.learning.teacher.options import check_teacher, check_vocabulary, vocabulary
from grpo.models import add_lora, check_model, load_policy, trains_adapter
from grpo.refusals import config_trains_adapter, refuse_unbuilt, world_size
from grpo.rewards import RewardScorer, combine_rewards, resolve_reward
from grpo.rewards.sandbox import check_sandbox, needs_sandbox, set_sandbox
from grpo.rewards.styles import check_style
from grpo.run.preflight import PreflightReport
from grpo.run.token_limit import mean_tokens
from grpo.sampling.episodes import Agent
from grpo.sampling.prompts import config_task, format_settled, format_task, has_chat_template
from grpo.sampling.tools import load_functions
from grpo.sampling.vllm_engine import VLLMEngine
from grpo.sampling.vllm_process import cpu_share
from grpo.system.distributed import ModelCalls, World, full_state_dict, shard_policy
from grpo.system.interrupt import RunStopped
from grpo.tasks import Task

RewardFn = Callable[[str, Mapping], float]
EPISODE_OPENING_TOKENS = 1024  # --engine vllm: what an episode's opening may add to the task's prompt


@dataclass(frozen=True)
class RunSetup:
    """A run as its options resolve it, before anything loads: the config resolved (what was not given
    filled, grpo.config_resolution.resolve_config) and where each value came from, the task (the given one, else the
    config's; formatted by the trainer, grpo.sampling.prompts.format_task) and the rewards (the given, else the
    config's, resolved; none: the task's own checker); the user's tool and environment files as checked
    (imported here, once; the agent is made from them)."""

    config: TrainConfig
    task: Task
    rewards: list[Callable]
    tools: list[Callable] | None = None  # config.tools' functions; None: none named (or "none")
    env: Callable | None = None  # config.env's environment; None: none named
    sources: dict[str, str] = field(default_factory=dict)  # each option's source (grpo.config.SOURCES)

    def amended(self, changes: Mapping[str, object], source: str) -> RunSetup:
        """The run with ``changes`` (a named amendment: what the memory or pre-flight check fitted) recorded."""
        if not changes:
            return self
        return replace(self, config=with_given(replace(self.config, **changes), self.config.given),
                       sources={**self.sources, **{name: source for name in changes}})

    def user_gave(self, name: str) -> bool:
        """Whether the user gave ``name``, or a TRL config file filled it with TRL's default (amendments
        leave those alone)."""
        return self.sources.get(name) in STANDING


def resolve_run(config: TrainConfig, *, task: Task | None = None, rewards: Sequence[RewardFn | str] | None = None,
                model: nn.Module | None = None, processes: int | None = None, origin: Mapping[str, str] | None = None,
                resumed: Mapping[str, str] | None = None, tokenizer: object | None = None) -> RunSetup:
    """The one setup path of `grpo train`, `grpo preflight` and grpo.train(): the configuration resolved
    once (grpo.config_resolution.resolve_config; ``origin``: where each given option came from, cli or file; the prompt
    format auto from the model's files, grpo.sampling.prompts.format_settled), the task
    and the rewards, and every refusal that depends only on the options, the task, the model's files and the
    number of ``processes`` (torchrun's WORLD_SIZE when not given), each one line (ConfigError,
    RewardError, TaskError) before a model loads or a worker forks. ``model``, when given, stands for the
    config's (which is then not checked); ``tokenizer``, when given, tells whether the prompts can be chat
    (with or without ``model``). ``resumed``: the saved sources of a configuration resolved already (a
    resumed run's, or the one `grpo train --nproc` hands its processes), which is kept."""
    processes = world_size() if processes is None else processes
    if model is None:
        check_model(config.model)
    if task is None:
        task = config_task(config, require_answer=not (rewards or config.rewards))
    if resumed is None:
        config, sources = resolve_config(config, format_task(task, config), origin)
    else:
        sources = dict(resumed)
    adapter = config_trains_adapter(config) if model is None else config.lora_rank > 0 or trains_adapter(model)
    turns = bool(config.env or config.tools not in ("", "none") or getattr(task, "env", None) or getattr(task, "tools", ()))
    chat = has_chat_template(tokenizer) if tokenizer is not None else \
        model_has_chat_template(config.model) if model is None else None
    if resumed is None:  # prompt_format auto, as the model's files (or the tokenizer given) decide, and its stops
        config, sources = format_settled(config, sources, chat, "model" if tokenizer is None else "tokenizer")
    # the combinations not built (grpo/refusals.py), before the user's files import or the sandbox is probed
    refuse_unbuilt(config, processes, adapter=adapter, turns=turns, chat=chat)
    check_teacher(config, processes, resumed=resumed is not None)
    if config.teacher and config.teacher != config.model:
        check_model(config.teacher)
        if model is None:  # a model given as an object: the trainer compares its tokenizer
            check_vocabulary(config.teacher, vocabulary(config.model))
    reward_fns = [resolve_reward(r) for r in (list(rewards) if rewards is not None else list(config.rewards))]
    tools, env = check_user_code(config, task, reward_fns)
    if config.engine == "vllm":
        import grpo.sampling.vllm_engine as vllm_engine  # by the module: tests stand in for its find_python

        vllm_engine.find_python(config.vllm_python)  # a Python that has vLLM (EngineError, one line, if not)
    if config.prompts_per_step % processes:
        raise ConfigError(
            f"prompts_per_step ({config.prompts_per_step}) must be divisible by the number of "
            f"processes ({processes}): each process samples whole groups"
        )
    return RunSetup(config, task, reward_fns, tools, env, sources)


def check_before_loading(run: RunSetup, processes: int, *, resume: bool = False) -> RunSetup:
    """The memory check before the weights load (grpo/run/memory_check.py), shared by `grpo train`, `grpo
    preflight` and grpo.train(): the run with what it adapted, or ConfigError, one line, for a run that
    cannot fit. Once, where the run starts: a process torchrun started skips it (the command that started
    it checked, and passed on what it adapted). A resumed run's options refuse, never adapt."""
    if "WORLD_SIZE" in os.environ:
        return run
    from grpo.run.memory_check import check_memory

    config = run.config
    adaptable = () if resume or not config.adapt else [
        name for name in ("micro_batch_tokens", "gradient_checkpointing", "eval_batch_size") if not run.user_gave(name)]
    # the task as the trainer formats it: r1-zero drops a task's tuned token limit, which the completions' terms read
    return run.amended(check_memory(config, format_task(run.task, config), processes, adaptable), "memory")


def check_user_code(config: TrainConfig, task: Task, reward_fns: Sequence[Callable]
                    ) -> tuple[list[Callable] | None, Callable | None]:
    """The rewards fit their style, the user's tool and environment files import, and code rewards and
    environments that run code can be sandboxed: refused now, not at the first step. Returns the tools and
    the environment the files hold (None where none is named), imported once: the agent is made from them."""
    for fn in reward_fns:
        check_style(fn, config.reward_style)
    tools = load_functions(config.tools) if config.tools and config.tools != "none" else None
    env = load_functions(config.env, "environment")[0] if config.env else None
    if needs_sandbox([*(list(reward_fns) or [task.reward]), *episode_envs(task, env)]):
        check_sandbox(config.sandbox)
    # as make_agent decides: the given or the task's environment, beside the given or the task's tools
    has_env = bool(config.env) or getattr(task, "env", None) is not None
    has_tools = (config.tools not in ("", "none")) or bool(getattr(task, "tools", ()))
    if has_env and has_tools:
        raise ConfigError("give tools or an environment, not both (an environment can call tools itself)")
    return tools, env


def episode_envs(task: Task, env: Callable | None) -> list[Callable]:
    """The environments a run's episodes may come from, for the sandbox's switch: the one given (by --env or
    the Python API) and the task's own."""
    return [e for e in (env, getattr(task, "env", None)) if e is not None]


def build_scorer(config: TrainConfig, task: Task, rewards: Sequence[Callable], env: Callable | None = None
                 ) -> tuple[list[Callable], RewardScorer, RewardScorer]:
    """The reward functions (the resolved ``rewards``, else the task's checker), the scorer that runs them
    (in worker processes, with a time limit), and the task's checker, for held-out accuracy, pre-flight and
    the step's accuracy: in workers with the same time limit (the reward's own scorer when the checker is
    the reward). ``env``: the environment given (--env or the Python API), which may run code too."""
    reward_fns = list(rewards) or [task.reward]
    # process-wide, before the reward workers fork, so they inherit it
    if needs_sandbox([*reward_fns, *episode_envs(task, env)]):
        set_sandbox(check_sandbox(config.sandbox))
    weights = config.reward_weights or (1.0,) * len(reward_fns)
    style = config.reward_style if rewards else "auto"
    score = combine_rewards(
        reward_fns, weights, workers=config.reward_workers, timeout=config.reward_timeout,
        on_error=config.on_error, styles=[check_style(fn, style) for fn in reward_fns],
    )
    checker = score if reward_fns == [task.reward] and not config.reward_weights else \
        combine_rewards([task.reward], workers=config.reward_workers, timeout=config.reward_timeout)
    return reward_fns, score, checker


def load_model(config: TrainConfig, device: torch.device, model: nn.Module | None, tokenizer: object | None
               ) -> tuple[nn.Module, object]:
    """The model and tokenizer given, or those the config names (a tokenizer given without a model stands:
    resolve_run settled the prompt format with it); the tokenizer pads with EOS if it has no pad."""
    if model is None:
        loaded = load_policy(config.model, device=device)
        model, tokenizer = loaded.model, tokenizer if tokenizer is not None else loaded.tokenizer
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def build_policy(config: TrainConfig, world: World, device: torch.device, model: nn.Module
                 ) -> tuple[nn.Module, ModelCalls, ModelCalls | None, torch.optim.Optimizer]:
    """The policy's module (on the device, LoRA-wrapped when asked, the same on every process), its calls
    that FSDP can see, the frozen reference for the KL term, and the optimiser. Under FSDP the full models
    stay on the CPU (host memory) until sharding moves each rank's shards to its device: a whole model on
    every GPU first would need 4 P there at build time, where the memory check counts 4 P / world."""
    if not world.fsdp:
        model.to(device)
    if config.lora_rank > 0:
        model = add_lora(model, config.lora_rank, config.lora_alpha or None)
    world.broadcast_parameters(model)
    reference = reference_model(config, world, model)
    policy = shard_policy(model, world)  # calls of the model that FSDP can see
    params = [p for p in model.parameters() if p.requires_grad]
    # the fused kernel updates in place, with none of the foreach path's parameter-sized temporaries
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay,
                                  fused=None if config.fsdp else True)
    return model, policy, reference, optimizer


def reference_model(config: TrainConfig, world: World, model: nn.Module) -> ModelCalls | None:
    """The frozen reference for the KL term (sharded as the policy is); none when beta = 0.
    LoRA reuses the base weights."""
    if config.beta == 0.0 or trains_adapter(model):
        return None
    ref = copy.deepcopy(model).eval()
    ref.requires_grad_(False)
    return shard_policy(ref, world)


def build_engine(config: TrainConfig, world: World, device: torch.device, model: nn.Module, tokenizer: object,
                 agent: Agent | None, train_prompts: list[list[int]]) -> VLLMEngine | None:
    """The vLLM engine for ``engine="vllm"`` (started at the first rollout); None for the own sampler."""
    if config.engine == "own":
        return None
    # room for the longest prompt and the longest completion any setting may ask for; an episode's
    # opening may add to the prompt (a tool list in the system message): room for that too
    after = config.max_episode_tokens + EPISODE_OPENING_TOKENS if agent is not None else 0
    longest = max(len(p) for p in train_prompts) + max(config.max_new_tokens, DATA_MAX_NEW_TOKENS, after)
    # each process samples its own groups with an engine of its own, on its own device (or share of cores)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cpus = cpu_share(world.local_rank, local, os.cpu_count() or 1) if local > 1 else ""
    engine = VLLMEngine(model, tokenizer, python=config.vllm_python, memory=engine_share(config, world, device, model, longest),
                        seed=config.seed, max_model_len=longest, cpus=cpus, announce=world.is_main,
                        sleep=config.vllm_sleep and device.type == "cuda" and not config.async_lag,
                        bucket_mb=config.vllm_bucket_mb)  # sampling ahead: vLLM works while the policy trains
    if world.fsdp:  # the weights vLLM starts from, gathered now (collective): every process is here
        engine.push(model, full_state_dict(model, world))
    return engine


def engine_share(config: TrainConfig, world: World, device: torch.device, model: nn.Module, longest: int) -> float:
    """vLLM's share of the device: --vllm-memory, else sized for a round (grpo.sampling.vllm_device.vllm_share): its
    16-bit weights and the KV cache of this process's share of a round's sequences at the longest."""
    from grpo.run.memory_shapes import Device, ModelShape
    from grpo.sampling.vllm_device import VLLM_CPU_SHARE, vllm_share

    if config.vllm_memory or device.type != "cuda":
        return config.vllm_memory or VLLM_CPU_SHARE
    rows = -(-config.round_cap // world.size) * config.group_size
    total = torch.cuda.mem_get_info(device)[1]
    return vllm_share(ModelShape.from_config(model.config), rows, longest, Device("cuda", world.size, None, total))


def preflight_verdict(report: PreflightReport, config: TrainConfig, world: World, run_dir: Path | None, *,
                      fit: bool, adaptable: Collection[str]) -> dict[str, int]:
    """Rank 0's verdict and fitted limit, binding every rank; the report printed (and written to run_dir);
    RunStopped when the mode says the run must not start; else the config's changes: the fitted token
    limit and what the step budget adapts."""
    # every rank sampled the same draws; rank 0's verdict and limit bind all, so none can diverge
    report.problems, report.fitted_max_new_tokens = world.broadcast_object(
        (report.problems, report.fitted_max_new_tokens))
    if world.is_main:
        print(report.describe(), flush=True)
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "preflight.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    fatal = report.stops(config.preflight)
    if fatal:
        where = f" (report: {run_dir / 'preflight.json'})" if run_dir is not None else ""
        raise RunStopped(f"pre-flight check: {fatal[0].message}{where}", exit_code=1)
    fitted = {} if report.fitted_max_new_tokens is None else {"max_new_tokens": report.fitted_max_new_tokens}
    return {**fitted, **budget_changes(report, replace(config, **fitted), world, run_dir, fit=fit, adaptable=adaptable)}


def pending_amendments(run: RunSetup) -> list[str]:
    """What may still change the resolved configuration once the model loads, each with who changes it:
    the pre-flight check's fitted token limit and step budget, and the adapting temperature."""
    config, out = run.config, []
    fit = run.sources.get("max_new_tokens") == "default"
    if config.preflight != "off" and fit:
        out.append(f"max_new_tokens: fitted by the pre-flight check to the lengths the model writes "
                   f"(at most {config.max_new_tokens})")
    if config.preflight != "off" and config.minutes and config.adapt:
        names = [*(["max_new_tokens"] if fit else []), "max_gen_rounds", "group_size"]
        names = [n for n in names if n == "max_new_tokens" or not run.user_gave(n)]
        out.append(f"{', '.join(names)}: lowered by the step budget if fewer than {MIN_STEPS} steps fit in "
                   f"{config.minutes:g} minutes")
    if config.prompt_format == "auto":
        out.append("prompt_format: chat if the loaded tokenizer has a chat template, else plain (no file told)")
    if config.temperature_target:
        out.append("temperature: adapted after each step towards temperature_target (the run's state, "
                   "not its configuration)")
    return out


def preflight_may_change(config: TrainConfig, *, fit: bool) -> bool:
    """Whether the pre-flight check can change the config: it runs, and it fits a token limit (``fit``) or
    may adapt the run to a time budget (step_budget changes nothing without ``minutes`` and ``adapt``). The
    trainer builds the prompt sampler once the check has settled these, and only then."""
    return config.preflight != "off" and (fit or (bool(config.minutes) and config.adapt))


def budget_changes(report: PreflightReport, config: TrainConfig, world: World, run_dir: Path | None, *,
                   fit: bool, adaptable: Collection[str]) -> dict[str, int]:
    """Print the steps that fit in --minutes; what to adapt (of ``adaptable``, what the user did not set,
    and the token limit when it was fitted) when too few do."""
    untouched = {name for name in ("max_gen_rounds", "group_size") if name in adaptable}
    changes = world.broadcast_object(step_budget(report, config, untouched | ({"max_new_tokens"} if fit else set())))
    if world.is_main:
        for line in report.budget(config.minutes):
            print(line, flush=True)
        if run_dir is not None:  # with the budget's lines; config.json, written next, has the values
            (run_dir / "preflight.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return changes


MIN_STEPS = 10  # under --minutes, fewer steps than this leave no time to learn: the budget adapts the run
MIN_GROUP = 4  # the step budget never makes groups smaller than this


def step_budget(report: PreflightReport, config: object, adaptable: Collection[str]) -> dict[str, int]:
    """The steps that fit in ``config.minutes`` at the check's pace, and, when fewer than MIN_STEPS
    and ``config.adapt``, the changes that buy more, in order and only to ``adaptable`` options: a
    lower max_new_tokens (fitted to what a correct answer needs), fewer generation rounds, a smaller
    group_size (not below MIN_GROUP). Generation time is taken as proportional to the token limit,
    the rounds and the group size, the update's to the group size and to the mean length of the check's
    completions cut at the limit. Sets report.steps_fit and
    report.adapted; returns the changed fields."""
    if not config.minutes or report.step_seconds is None or report.update_seconds is None:
        return {}
    gen, upd, changes = report.step_seconds, report.update_seconds, {}
    limit, rounds, group = config.max_new_tokens, config.max_gen_rounds, config.group_size
    fits = lambda: int(60 * config.minutes // max(gen + upd, 1e-6))  # noqa: E731
    report.steps_fit = report.steps_before = fits()
    if report.steps_fit >= MIN_STEPS or not config.adapt:
        return {}
    answer = report.answer_limit
    if "max_new_tokens" in adaptable and answer is not None and answer < limit:
        gen *= answer / limit
        if report.sample_lengths:  # the update pays for the tokens the samples keep under the new limit
            upd *= mean_tokens(report.sample_lengths, answer) / max(mean_tokens(report.sample_lengths, limit), 1e-9)
        changes["max_new_tokens"] = answer
        report.adapted.append(f"step budget: max_new_tokens {limit} -> {answer} (what a correct answer needs)")
    if fits() < MIN_STEPS and "max_gen_rounds" in adaptable and config.filter_groups and rounds > 1:
        needed = min(rounds, math.ceil(1 / report.varying_frac)) if report.varying_frac else rounds
        fewer = max(1, min(needed - 1, rounds - 1))
        gen *= fewer / max(needed, 1)
        changes["max_gen_rounds"] = fewer
        report.adapted.append(f"step budget: max_gen_rounds {rounds} -> {fewer}")
    if fits() < MIN_STEPS and "group_size" in adaptable and group > MIN_GROUP and not config.batch_size:
        smaller = max(MIN_GROUP, group // 2)
        gen, upd = gen * smaller / group, upd * smaller / group
        changes["group_size"] = smaller
        report.adapted.append(f"step budget: group_size {group} -> {smaller}")
    report.steps_fit = fits()
    return changes


def default_run_dir(config: TrainConfig) -> Path:
    """--output, else runs/<time>-<the data file's or folder's name, or the task's>."""
    if config.output:
        return Path(config.output)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(config.data.rstrip("/")).stem) if config.data else config.task
    return Path("runs") / f"{stamp}-{name or config.task}"
