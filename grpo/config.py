"""The run's configuration: one frozen dataclass, each field documented once.

The field docs are also the CLI's help text (``grpo train --help``).
Validation happens on construction and names the field at fault.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from grpo.math.recommended import RECOMMENDED, Recommended  # noqa: F401 (Recommended: re-exported)

DATA_MAX_NEW_TOKENS = 256
"""The token limit of a run on the user's data when none is given and no pre-flight check fits one
(TRL's default max_completion_length is 256 too): room for short reasoning, not the demo's 8."""
PROMPT_FORMATS = ("auto", "chat", "plain", "r1-zero")  # grpo/sampling/prompts.py


# The options an objective or estimator reads, with who reads them: given for another, they are refused.
READERS: dict[str, tuple[str, ...]] = {"ratio_cap": ("dppo_tv", "dppo_kl"), "sapo_tau_pos": ("sapo",),
                                       "sapo_tau_neg": ("sapo",)}

# Where a resolved value came from (config.json's "sources"): what the user gave (resume: on the command
# line that resumed the run), then what filled the rest.
USER_SOURCES = ("cli", "file", "python", "resume")
# trl: TRL's default for a key a TRL config file leaves unset; it stands (nothing fills or amends it) but is not given
STANDING = (*USER_SOURCES, "trl")
# model: what the model's files say before its weights load (prompt_format auto); tokenizer: what a tokenizer says
SOURCES = (*STANDING, "task", "data", "objective", "model", "tokenizer", "preflight", "memory", "default")


class ConfigError(ValueError):
    """An invalid configuration value; the message names the field."""


def _doc(text: str, **kw: object) -> dict:
    return {"metadata": {"help": text}, **kw}


@dataclass(frozen=True)
class TrainConfig:
    """Everything a GRPO run needs; defaults are the README's default run."""

    model: str = field(**_doc("model: 'smollm2' (embedded), a Hugging Face folder, a .gguf file or a hub id", default="smollm2"))
    task: str = field(**_doc("built-in task name (see `grpo tasks`)", default="add"))
    data: str = field(**_doc("your dataset instead of the task: .jsonl/.csv/.parquet file, a folder of split files (train.jsonl, test.jsonl, ...), a saved Hugging Face dataset folder, a folder laid out as a hub dataset or a hub name (default reward: math_answer; see docs/data.md)", default=""))
    eval_data: str = field(**_doc("held-out evaluation data (same formats and field options as data) instead of the data's own held-out split", default=""))
    data_config: str = field(**_doc("the configuration of data to read, for a dataset that has several (a hub name or a folder whose README.md declares configs); empty: its only one (one with several is refused, listing them)", default=""))
    data_split: str = field(**_doc("the split of data trained on (empty: train, or a dataset's only split)", default=""))
    eval_config: str = field(**_doc("the configuration of eval_data to read (empty: data_config when held out from data itself)", default=""))
    eval_split: str = field(**_doc("the split held out (of eval_data, else of data): its first eval_size rows are scored, and a training row whose prompt it holds is removed from training; empty: test, else validation, else eval_size prompts split off the training split (so is naming data_split itself)", default=""))
    prompt_field: str = field(**_doc("the data's prompt column (empty: prompt, question, problem or input)", default=""))
    answer_field: str = field(**_doc("the data's answer column (empty: answer, solution, output or target; GSM8K's '#### x' is recognised)", default=""))
    system_prompt: str = field(**_doc("system message before every prompt (empty: none, or the task's own)", default=""))
    prompt_template: str = field(**_doc("format string over the row's fields making the user message, e.g. '{question} Answer in \\boxed{{}}.' (empty: the prompt as is)", default=""))
    prompt_format: str = field(**_doc("how prompts are written: auto (the tokenizer's chat template when it has one, else plain), chat, plain (for base models: the system prompt, then 'Question: ...' and the cue 'Answer:'; stops at a newline or 'Question:') or r1-zero (DeepSeek-R1-Zero's template: think in <think> </think>, answer in <answer> </answer>, the cue 'Assistant: <think>'; stops at '</answer>'; a wrong answer in that layout scores 0.1); the format's stop strings join --stop", default="auto"))
    chat_template: str = field(**_doc("a Jinja chat template file to use instead of the tokenizer's own (the chat format)", default=""))
    few_shot: int = field(**_doc("worked examples before every prompt: this many training rows (a fixed draw, then left out of training), each as a question and its answer (plain and chat formats)", default=0))
    rewards: tuple[str, ...] = field(**_doc("reward functions (built-in name, module:function, file.py:function); empty: the task's own", default=()))
    reward_style: str = field(**_doc("how the rewards are called: auto (read from each signature), grpo (completion, example), trl (completions, **kwargs; per batch) or verl (data_source, solution_str, ground_truth, extra_info); a stated style applies to every reward", default="auto"))
    reward_weights: tuple[float, ...] = field(**_doc("one weight per reward; empty: all 1.0", default=()))
    reward_workers: int = field(**_doc("worker processes computing rewards (0: in the trainer's process, no timeout)", default=2))
    reward_timeout: float = field(**_doc("seconds one reward call may take before it counts as an error", default=30.0))
    on_error: str = field(**_doc("a reward call that raises or times out, or an environment that raises: zero (the row errored: left out of the loss and of its group's statistics, counted, warned) or raise (stop the run)", default="zero"))
    tools: str = field(**_doc("tools the policy may call, path/to/file.py:fn1,fn2 or module:fn1 (typed functions with docstrings); empty: the task's own; none: the task's tools withheld (calls get an error: the control run)", default=""))
    env: str = field(**_doc("environment class, path/to/file.py:Class or module:Class, with reset(example) -> messages and step(messages) -> (reply, reward, done); one instance per episode", default=""))
    max_turns: int = field(**_doc("most policy turns per episode (0: the task's own setting, else 4 with tools or an environment; a task without either is single-turn)", default=0))
    max_episode_tokens: int = field(**_doc("most tokens per episode after the prompt, the environment's included (0: max_turns x (max_new_tokens + 64))", default=0))
    turn_discount: float = field(**_doc("an environment's reward for turn k counts turn_discount ** (k - 1)", default=1.0))
    tool_timeout: float = field(**_doc("seconds a tool call may take before the model gets a timeout error", default=10.0))
    env_timeout: float = field(**_doc("seconds an environment's reset or step may take; past it the episode ends as an errored row (the call is left behind in its thread)", default=30.0))
    sandbox: str = field(**_doc("how code rewards run untrusted code: strict (bubblewrap: own namespaces, read-only system, no network, no parent's files) or weak (an in-process guard the code can defeat; for machines without bubblewrap, with a warning)", default="strict"))
    steps: int = field(**_doc("number of GRPO steps, one batch of prompts each (0: the task's setting, see `grpo tasks`; 20 for a task without one)", default=0))
    minutes: float = field(**_doc("end training before a step (with the evaluation due after it) that would end past this many minutes of training; the final evaluation still runs (0: no limit; for --data without --steps, the data's setting: 10)", default=0.0))
    seed: int = field(**_doc("seed for prompt order, sampling and initialisation", default=0))
    output: str = field(**_doc("run directory; empty: a new timestamped folder under runs/", default=""))
    prompts_per_step: int = field(**_doc("B: distinct prompts per step", default=8))
    group_size: int = field(**_doc("G: completions sampled per prompt", default=8))
    batch_size: int = field(**_doc("N = B * G: completions per step, a multiple of group_size; sets prompts_per_step (0: from prompts_per_step)", default=0))
    max_new_tokens: int = field(**_doc("most tokens sampled per completion (0: the task's own setting, see `grpo tasks`; for --data, fitted by the pre-flight check to the lengths the model writes, at most 256, or 256 without it)", default=0))
    mask_truncated: bool = field(**_doc("leave completions that hit max_new_tokens out of the loss and of their group's mean and std (DAPO's overlong filtering; they count as errored rows) instead of only scoring their answer 0", default=False))
    temperature: float = field(**_doc("sampling temperature (the policy trained is softmax(logits / temperature))", default=0.7))
    temperature_target: float = field(**_doc("adapt the temperature after each step to hold the policy's mean per-token entropy near this many nats: T <- clip(T (target / H)^(1/4), 0.3, 1.0), H the step's entropy on the completions it trained (E3, arXiv 2505.18573; --temperature is the start; see docs/temperature.md); 0: a fixed temperature", default=0.0))
    top_p: float = field(**_doc("nucleus sampling mass (1.0: off)", default=1.0))
    stop: tuple[str, ...] = field(**_doc("stop strings: a completion ends with the token that completes one (besides EOS)", default=()))
    top_k: int = field(**_doc("sample among the k likeliest tokens only (0: off)", default=0))
    lr: float = field(**_doc("AdamW learning rate (0: the task's setting: 1e-5 on a --data file, 3e-5 on a built-in task)", default=0.0))
    warmup_steps: int = field(**_doc("linear learning-rate warm-up, in steps", default=2))
    weight_decay: float = field(**_doc("AdamW weight decay", default=0.0))
    max_grad_norm: float = field(**_doc("clip the gradient's global norm to this (0: off)", default=1.0))
    beta: float = field(**_doc("KL penalty weight towards the frozen reference (0: no reference model is loaded)", default=0.0))
    teacher: str = field(**_doc("on-policy distillation: a teacher model (anything --model takes) scores every token the policy samples, and its term joins the loss (docs/distillation.md); its tokenizer must be the model's; empty: none", default=""))
    teacher_coef: float = field(**_doc("the teacher term's weight in the loss (per token, beside the policy's surrogate)", default=1.0))
    teacher_loss: str = field(**_doc("the teacher term: sampled (the reverse KL's estimate log p - log p_teacher at each sampled token, a score-function gradient) or full (the generalised JSD over the whole vocabulary at each position, chunked)", default="sampled"))
    teacher_beta: float = field(**_doc("teacher_loss full: the generalised JSD's beta, TRL's meaning (the mixture beta p_teacher + (1 - beta) p): 1.0 reverse KL(p || p_teacher), 0.0 forward KL(p_teacher || p), 0.5 symmetric", default=1.0))
    objective: str = field(**_doc("the policy loss: ppo (clipped ratio), cispo (clipped stop-gradient weight on log pi), sapo (soft sigmoid gate), gmpo (geometric mean of the token ratios), dppo_tv or dppo_kl (tokens leave the loss past a divergence threshold); see docs/objectives.md", default="ppo"))
    clip_low: float = field(**_doc("epsilon_low, read by each objective its own way: ppo and cispo bound the ratio below at 1 - clip_low, gmpo bounds log rho at -clip_low, dppo_tv/dppo_kl take it as the divergence threshold for A < 0 (unset: the objective's recommended value; ppo's 0.2)", default=0.2))
    clip_high: float = field(**_doc("epsilon_high: ppo and cispo bound the ratio above at 1 + clip_high (> clip_low is DAPO's clip-higher), gmpo bounds log rho at clip_high, dppo_tv/dppo_kl take it as the threshold for A > 0 (unset: the objective's recommended value; ppo's 0.28)", default=0.28))
    ratio_cap: float = field(**_doc("dppo_tv/dppo_kl: the ratio weighting each token's log pi is truncated at this (its stop-gradient weight min(rho, ratio_cap))", default=20.0))
    sapo_tau_pos: float = field(**_doc("sapo: the gate's temperature for tokens with A > 0", default=1.0))
    sapo_tau_neg: float = field(**_doc("sapo: the gate's temperature for tokens with A <= 0", default=1.05))
    advantage_estimator: str = field(**_doc("how rewards become advantages: grpo (group mean and std), rloo (leave-one-out mean), reinforce_pp (whitened over the batch's tokens), reinforce_pp_baseline (group mean, then whitened), passk (only a group's best completion, by its margin over the second)", default="grpo"))
    scale: str = field(**_doc("advantage scaling of the grpo and passk estimators: group (GRPO), batch, none (Dr. GRPO)", default="group"))
    ratio_level: str = field(**_doc("importance ratio per token, or per sequence (GSPO; objective ppo only)", default="token"))
    aggregate: str = field(**_doc("loss aggregation: token (DAPO), sequence (GRPO), fixed (Dr. GRPO) (unset: the objective's recommended one; token, sequence for sapo and gmpo)", default="token"))
    tis_cap: float = field(**_doc("the sampler/trainer mismatch correction's upper bound C: each token's loss is weighted by its ratio pi_trainer / pi_sampler, truncated at C or masked above it (tis_mode), the ratio between the trainer's log-probs and the sampling engine's (0: off, the sampler's log-probs are the old policy's)", default=2.0))
    tis_level: str = field(**_doc("token (each token's ratio) sequence (a completion's geometric-mean ratio: always a mask, within [1/tis_cap, tis_cap] under truncate, [tis_low, tis_cap] under mask) or sequence_ratio (a completion's whole ratio prod_t pi_trainer / pi_sampler on every token: corrects the law each completion was drawn from, short of the cap, at a higher variance; the group-normalised advantages, the token normaliser of --aggregate token and the KL term stay the lagged sampler's, uncorrected: see grpo/math/algorithm.py tis_weights)", default="token"))
    tis_mode: str = field(**_doc("truncate (a weight above tis_cap becomes tis_cap) or mask (a weight outside [tis_low, tis_cap] becomes 0: IcePop's token mask is --tis-mode mask --tis-low 0.5 --tis-cap 5)", default="truncate"))
    tis_low: float = field(**_doc("tis_mode mask: the lower bound of the weights kept (0: none)", default=0.0))
    epochs: int = field(**_doc("mu: optimisation passes over each batch", default=1))
    minibatches: int = field(**_doc("optimiser steps per pass (the batch split by groups)", default=1))
    micro_batch_tokens: int = field(**_doc("token budget of one forward/backward; micro-batches accumulate", default=4096))
    gradient_checkpointing: bool = field(**_doc("recompute each decoder layer's activations in backward instead of keeping them: less memory for one more forward pass of each layer (TRL's key of that name maps here)", default=False))
    skip_zero_advantage: bool = field(**_doc("skip forward/backward of groups whose advantages are all zero (exact when beta = 0)", default=True))
    async_lag: int = field(**_doc("asynchronous GRPO: batch t is sampled with the weights after update t - 1 - K while the policy trains on earlier batches (a fixed lag K, so a run is deterministic and resumes exactly; the loss corrects with tis_cap's importance weights; 0: the synchronous loop; TRL's max_staleness maps here)", default=0))
    filter_groups: bool = field(**_doc("DAPO dynamic sampling: drop groups whose rewards are all equal and generate more until the step has prompts_per_step informative groups (at most max_gen_rounds rounds)", default=True))
    max_gen_rounds: int = field(**_doc("with filter_groups: generation rounds per step at most; then train on the informative groups there are", default=4))
    round_prompts: int = field(**_doc("with filter_groups: the most prompts one generation round draws (like verl's data.gen_batch_size, but sized each round): each round draws the informative groups still missing over the share of groups expected to vary (this step's so far; for its first round, a running average over the steps before), and a step never draws more than prompts_per_step x max_gen_rounds in all; e.g. prompts_per_step x max_gen_rounds decodes a step whose groups rarely vary in one pass instead of several (on a GPU it should cost little more than one round, not measured; on a 2-core CPU it did not make steps faster, see docs/screening.md); 0: prompts_per_step", default=0))
    sampler: str = field(**_doc("which prompts each step: uniform, or frontier (those whose groups are likely mixed, from per-prompt pass-rate statistics; see grpo/sampling/prompt_samplers.py); empty: the task's setting, uniform for a --data file, else frontier", default=""))
    explore_frac: float = field(**_doc("frontier sampler: share of each draw taken uniformly from all prompts (unseen, solved and unsolvable ones are revisited)", default=0.25))
    sampler_half_life: float = field(**_doc("frontier sampler: steps after which a prompt's old evidence counts half", default=20.0))
    screen: int = field(**_doc("screening: each generation round prefills this many candidate prompts per group it generates, predicts each one's pass rate from the policy's hidden state at the prompt's end (a logistic regression fitted online on the groups seen) and generates the groups most likely to vary; screen_by probe reads one sampled completion per candidate instead (see docs/screening.md; 0 or 1: off)", default=0))
    screen_by: str = field(**_doc("screening: what the predictor reads: state (the policy's hidden state at the prompt's end; predicts the pass rate) or probe (one completion sampled and scored per candidate: its probability, its least likely token's, its reward; predicts whether the group varies). A probe is not part of the group generated after it (see docs/screening.md)", default="state"))
    screen_explore: float = field(**_doc("screening: share of each round's groups drawn uniformly from the candidates whatever their prediction, so a prompt the predictor would skip is still tried now and then", default=0.25))
    lora_rank: int = field(**_doc("LoRA rank through peft (0: full fine-tuning)", default=0))
    lora_alpha: float = field(**_doc("LoRA alpha (0: twice the rank)", default=0.0))
    eval_size: int = field(**_doc("held-out prompts scored by greedy decoding at start and end", default=256))
    eval_every: int = field(**_doc("also evaluate the alarms' prompts (eval_subset) every K steps (0: automatic, fixed before step 1 from the planned steps: 5 evaluations during the run, planned for at most 20 steps under --minutes; -1: only at start and end)", default=0))
    eval_subset: int = field(**_doc("prompts scored by the evaluations during training, eval_train of them training prompts and the rest held-out (0: all eval_size held-out); start and end score all eval_size", default=128))
    eval_train: int = field(**_doc("of eval_subset, a fixed sample of training prompts scored greedily beside the held-out ones (train_sample_accuracy): the memorising alarm reads the gap", default=32))
    eval_samples: int = field(**_doc("n: completions sampled per held-out prompt for pass@k and maj@k (0: greedy pass@1 only; n costs about n times the greedy evaluation)", default=0))
    eval_k: tuple[int, ...] = field(**_doc("the k of pass@k and maj@k (each at most eval_samples)", default=(1, 4)))
    eval_batch_size: int = field(**_doc("prompts per batch in evaluation", default=128))
    sample_every: int = field(**_doc("write sample completions to completions.jsonl every K steps (0: never)", default=10))
    log_every: int = field(**_doc("print a one-line summary of the metrics every K steps (0: never)", default=10))
    alarm_window: int = field(**_doc("steps over which the reward-hacking alarms (length, repetition) measure trends, and before which no verdict on learning is taken (0: half the planned steps, between 6 and 20)", default=0))
    early_stop: bool = field(**_doc("end the run early, with the final evaluation, when an alarm shows it is not learning: no signal for no_signal_steps steps, or a verdict on learning (stall, checker suspected, memorising) held at two held-out evaluations in a row", default=True))
    no_signal_steps: int = field(**_doc("steps in a row in which under a quarter of the batch had rewards that vary before the no-signal alarm fires", default=5))
    preflight: str = field(**_doc("before the first step, sample the starting model on a few training prompts and report pass rate, groups that vary, truncation, lengths and reward errors: on (stop when no group varies, warn otherwise), warn (never stop), strict (stop on any problem), off", default="on"))
    adapt: bool = field(**_doc("under --minutes, when the pre-flight check finds fewer than 10 steps fit, change what the user did not set, in order, until they do: a lower max_new_tokens (what a correct answer needs), fewer max_gen_rounds, a smaller group_size (not below 4); and, before the weights load, when the predicted memory peak exceeds what is free (grpo/run/memory.py), a lower micro_batch_tokens, then gradient checkpointing, then a smaller eval_batch_size; each change printed and kept in config.json", default=True))
    preflight_prompts: int = field(**_doc("training prompts the pre-flight check samples (a group of group_size each)", default=16))
    wandb: bool = field(**_doc("also log to Weights & Biases (needs the wandb package)", default=False))
    engine: str = field(**_doc("what samples the rollouts: own (this package's sampler, on the policy itself) or vllm (a vLLM engine in a process of its own, weights synced after every optimiser step; `make vllm` installs it)", default="own"))
    vllm_python: str = field(**_doc("engine vllm: the Python that runs vLLM (empty: $GRPO_VLLM_PYTHON, else the project's .venv-vllm, else this Python)", default=""))
    vllm_sleep: bool = field(**_doc("engine vllm on a GPU: put vLLM to sleep while the trainer updates (its weights moved to host memory, its KV cache freed, both back before the next rollout), so the update has the GPU's memory; ignored on the CPU, where vLLM has no sleep mode", default=True))
    vllm_memory: float = field(**_doc("engine vllm: share of the device's memory vLLM may reserve for weights and KV cache (gpu_memory_utilization; on the CPU backend, of host memory); 0: on a GPU, what its 16-bit weights and a round's KV cache need, on the CPU 0.1", default=0.0))
    vllm_bucket_mb: float = field(**_doc("engine vllm, full fine-tuning: a weight push goes through a shared-memory buffer of this many MiB, bucket by bucket (a decoder layer at least, whatever the size)", default=1024.0))
    device: str = field(**_doc("cpu, cuda, cuda:N or auto", default="auto"))
    threads: int = field(**_doc("CPU threads for torch (0: torch's default)", default=0))
    heap_release_mb: int = field(**_doc("Linux (glibc): freed host-memory blocks of at least this many MiB go back to the system at once instead of being kept for reuse, which lowers peak memory on the CPU; while a turn is sampled they are reused, which saves the page faults of each decode step (0: leave the allocator as it is)", default=1))
    save_every: int = field(**_doc("write a checkpoint every K steps (and always at the end)", default=25))
    keep_checkpoints: int = field(**_doc("how many of the latest checkpoints to keep", default=2))
    max_bad_steps: int = field(**_doc("stop after this many consecutive steps with a NaN/inf loss or gradient (their updates are skipped)", default=5))
    fsdp: bool = field(**_doc("under torchrun, shard parameters, gradients and optimiser state with FSDP2 instead of keeping a whole copy per process", default=False))
    save_model: bool = field(**_doc("write the final model as a Hugging Face folder into the run directory", default=True))
    given: frozenset[str] | None = field(default=None, compare=False, repr=False, metadata={
        "help": "the options given (to the constructor, on the command line, in a config file); filled on "
                "construction, not an option", "internal": True})

    def __new__(cls, *args: object, **kwargs: object) -> TrainConfig:
        # the one place that sees which options were given: the generated __init__ fills the rest with defaults
        self = super().__new__(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        object.__setattr__(self, "_passed", frozenset(names[:len(args)]) | frozenset(kwargs))
        return self

    def __post_init__(self) -> None:
        self._record_given()
        self._check_ranges()
        if self.group_size < 2:
            raise ConfigError(f"group_size must be at least 2 (advantages compare samples within a group), got {self.group_size}")
        self._apply_batch_size()
        self._check_choices()
        self._check_objective()
        self._check_consistency()

    def _check_ranges(self) -> None:
        positive = ("prompts_per_step", "epochs", "minibatches",
                    "micro_batch_tokens", "eval_batch_size", "save_every", "keep_checkpoints", "max_bad_steps",
                    "reward_timeout", "tool_timeout", "env_timeout", "max_gen_rounds", "sampler_half_life", "no_signal_steps", "preflight_prompts")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        non_negative = ("steps", "minutes", "lr", "top_k", "warmup_steps", "weight_decay", "max_grad_norm", "beta", "clip_low",
                        "clip_high", "teacher_coef", "lora_rank", "lora_alpha", "eval_size", "temperature_target", "max_new_tokens", "alarm_window", "eval_subset", "eval_train", "screen",
                        "sample_every", "threads", "heap_release_mb", "temperature", "batch_size", "eval_samples", "log_every",
                        "reward_workers", "max_turns", "max_episode_tokens", "few_shot", "async_lag", "round_prompts")
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.eval_every < -1:
            raise ConfigError(f"eval_every must be -1 (never), 0 (automatic) or a number of steps, got {self.eval_every}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.temperature == 0:
            raise ConfigError("temperature must be > 0 for training (greedy samples give every group equal rewards)")
        if self.temperature_target and self.async_lag:
            raise ConfigError("temperature_target sets each step's temperature from the step before; with async_lag "
                              "the batch is sampled before that step ends: use one or the other")
        self._check_fractions()

    def _check_choices(self) -> None:
        choices = {"scale": ("group", "batch", "none"), "ratio_level": ("token", "sequence"),
                   "aggregate": ("token", "sequence", "fixed"), "on_error": ("zero", "raise"),
                   "sampler": ("", "uniform", "frontier"), "screen_by": ("state", "probe"), "preflight": ("on", "warn", "strict", "off"),
                   "sandbox": ("strict", "weak"), "reward_style": ("auto", "grpo", "trl", "verl"),
                   "engine": ("own", "vllm"), "tis_level": ("token", "sequence", "sequence_ratio"),
                   "tis_mode": ("truncate", "mask"), "teacher_loss": ("sampled", "full"),
                   "objective": tuple(RECOMMENDED),
                   "advantage_estimator": ("grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "passk"),
                   "prompt_format": PROMPT_FORMATS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                named = ", ".join(a for a in allowed if a)  # "": automatic, not a choice to offer
                raise ConfigError(f"{name} must be one of {named}, got {getattr(self, name)!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"device must be cpu, cuda, cuda:N or auto, got {self.device!r}")

    def _record_given(self) -> None:
        """``given``: the options named to the constructor. dataclasses.replace names every option and
        passes ``given`` on unchanged: what a replace sets (a resolution, an amendment, the prompt format)
        is not given; a caller that gives options through replace says so (``given=config.given | {...}``)."""
        passed = self.__dict__.pop("_passed", frozenset())
        given = passed - {"given"} if self.given is None else self.given
        object.__setattr__(self, "given", frozenset(given))

    def _check_objective(self) -> None:
        """The objective's and estimator's parameters: in range, and none set that the choice ignores."""
        if self.objective == "ppo" and self.clip_low >= 1.0:
            raise ConfigError(f"clip_low must be below 1, got {self.clip_low}")
        if self.objective == "cispo" and self.clip_low > 1.0:
            raise ConfigError(f"clip_low must be at most 1 for cispo (1: no lower bound), got {self.clip_low}")
        if self.ratio_level != "token" and self.objective != "ppo":
            raise ConfigError(f"ratio_level {self.ratio_level} is ppo's (GSPO); objective {self.objective} works per token")
        for name in READERS:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.tis_low < 0 or (self.tis_low and self.tis_cap and self.tis_low >= self.tis_cap):
            raise ConfigError(f"tis_low must lie in [0, tis_cap), got {self.tis_low}")
        if self.tis_low and self.tis_mode != "mask":
            raise ConfigError("tis_low is the lower bound of tis_mode mask (truncation has an upper bound only)")

    def _check_consistency(self) -> None:
        if 0 < self.round_prompts < self.prompts_per_step:  # after batch_size has set B
            raise ConfigError(f"round_prompts must be 0 or at least prompts_per_step ({self.prompts_per_step}), got {self.round_prompts}")
        if self.minibatches > self.prompts_per_step:
            raise ConfigError(f"minibatches ({self.minibatches}) cannot exceed prompts_per_step ({self.prompts_per_step}): a minibatch holds whole groups")
        if self.reward_weights and len(self.reward_weights) != len(self.rewards):
            raise ConfigError(f"reward_weights has {len(self.reward_weights)} entries but rewards has {len(self.rewards)}")
        if self.few_shot and self.prompt_format == "r1-zero":
            raise ConfigError("few_shot: r1-zero's template is zero-shot (its answers are the model's own reasoning); "
                              "use prompt_format plain or chat for worked examples")
        if self.chat_template and self.prompt_format not in ("auto", "chat"):
            raise ConfigError(f"chat_template is a chat format's template; prompt_format {self.prompt_format} has its own")
        if self.eval_samples and not all(0 < k <= self.eval_samples for k in self.eval_k):
            raise ConfigError(f"eval_k must lie in 1..eval_samples ({self.eval_samples}), got {list(self.eval_k)}")

    def _check_fractions(self) -> None:
        for name in ("explore_frac", "turn_discount", "screen_explore"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0 < self.vllm_bucket_mb < math.inf:
            raise ConfigError(f"vllm_bucket_mb must be positive, got {self.vllm_bucket_mb}")
        if not 0.0 <= self.vllm_memory <= 1.0:
            raise ConfigError(f"vllm_memory must be in [0, 1] (0: sized for the run), got {self.vllm_memory}")
        if self.tis_cap != 0.0 and self.tis_cap <= 1.0:
            raise ConfigError(f"tis_cap must be above 1 (or 0: off), got {self.tis_cap}")

    def _apply_batch_size(self) -> None:
        """batch_size is the other way to give prompts_per_step: derive B = N / G from it."""
        if not self.batch_size:
            return
        if self.batch_size % self.group_size:
            raise ConfigError(
                f"batch_size ({self.batch_size}) must be a multiple of group_size ({self.group_size}): "
                "each prompt gets a whole group"
            )
        object.__setattr__(self, "prompts_per_step", self.batch_size // self.group_size)

    @property
    def round_cap(self) -> int:
        """The most prompts one generation round draws: round_prompts (else B), never more than a step may draw
        (B x max_gen_rounds under filter_groups, else B: one round)."""
        b = self.prompts_per_step
        return min(self.round_prompts or b, b * self.max_gen_rounds) if self.filter_groups else b

    @property
    def completions_per_step(self) -> int:
        """N = B * G."""
        return self.prompts_per_step * self.group_size

    def to_dict(self) -> dict:
        return {f.name: _plain(getattr(self, f.name)) for f in option_fields()}

    @classmethod
    def from_dict(cls, values: dict) -> TrainConfig:
        known = {f.name for f in option_fields()}
        unknown = sorted(set(values) - known)
        if unknown:
            import difflib

            hint = difflib.get_close_matches(unknown[0], known, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ConfigError(f"unknown config key {unknown[0]!r}{extra}")
        hints = typing.get_type_hints(cls)
        clean = {key: _coerce(key, value, hints[key]) for key, value in values.items()}
        given_b, given_n = clean.get("prompts_per_step"), clean.get("batch_size")
        if given_b and given_n and given_b * clean.get("group_size", cls.group_size) != given_n:
            raise ConfigError(
                f"batch_size ({given_n}) contradicts prompts_per_step ({given_b}) x group_size: give only one of them"
            )
        return cls(**clean)


def option_fields() -> tuple[dataclasses.Field, ...]:
    """TrainConfig's options: every field but the record of which were given."""
    return tuple(f for f in dataclasses.fields(TrainConfig) if not f.metadata.get("internal"))


def with_given(config: TrainConfig, given: typing.Iterable[str]) -> TrainConfig:
    """``config`` whose record of what the user gave is exactly ``given``."""
    return dataclasses.replace(config, given=frozenset(given))


def _plain(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


def automatic(config: TrainConfig, name: str) -> bool:
    """Whether ``name`` is left for the run to fill: not given, or given as its documented "automatic"
    value (0 or the empty string where that is the default). minutes' 0 is a value: no time limit."""
    if name not in config.given:
        return True
    default = TrainConfig.__dataclass_fields__[name].default
    value = getattr(config, name)
    return name != "minutes" and not isinstance(value, bool) and value in (0, "") and value == default




def load_config_file(path: str | Path) -> dict:
    """The values of a YAML (.yaml, .yml) or TOML (.toml) config file, as a flat mapping."""
    path = Path(path)
    if path.suffix not in (".yaml", ".yml", ".toml", ".json"):
        raise ConfigError(f"config file {path} must end in .yaml, .yml, .toml or .json")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror or err}") from err
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:
        tomllib = None
    if path.suffix == ".toml" and tomllib is None:
        raise ConfigError("TOML config files need Python 3.11 or later; use YAML")
    try:
        if path.suffix == ".toml":
            values = tomllib.loads(text)
        elif path.suffix == ".json":
            values = json.loads(text)
        else:
            values = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError) as err:  # TOMLDecodeError is a ValueError
        first = " ".join(str(err).split())
        raise ConfigError(f"config file {path} is not valid {path.suffix[1:].upper()}: {first}") from err
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path} must hold a mapping of option: value, got {type(values).__name__}")
    return values


def _coerce(name: str, value: object, kind: object) -> object:
    """Check a config file value against the field's type (ints widen to floats)."""
    origin = typing.get_origin(kind)
    if origin is tuple:
        (inner, _) = typing.get_args(kind)
        if not isinstance(value, (list, tuple)):
            value = [value]
        return tuple(_coerce(name, v, inner) for v in value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    if kind in (int, float, str) and (not isinstance(value, kind) or isinstance(value, bool)):
        raise ConfigError(f"{name} must be of type {kind.__name__}, got {value!r}")
    return value
