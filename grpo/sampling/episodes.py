"""Episodes: the policy takes turns with an environment (tools, feedback), all G episodes of a prompt batched.

An environment (grpo/sampling/environments.py) is any class with

    reset(example, seed) -> messages      the opening conversation for a task row
    step(messages) -> (reply, reward, done)   after each policy turn: the messages to
                                          append (None: none), a reward for the turn (None: 0)
                                          and whether the episode is over

and one instance is made per episode, so state never leaks between episodes.
The G episodes of a group are one task: they are sampled from one opening and
their relative rewards are the advantages. So ``reset`` gets a ``seed`` (an int
in [0, 2^32), one per group, the same on a rerun; grpo/sampling/random_streams.py) from which
to draw any random state (``random.Random(seed)``); a reset without a ``seed``
parameter is called with the row alone. A group whose openings differ stops
the run with an error naming the environment (state that the opening does not
show escapes the check).
Tools are the environment :class:`ToolEnv`: a turn with tool calls gets their
results back, a turn without ends the episode. A single-turn task is the
one-turn episode, sampled by :func:`grpo.sampling.rollout.generate` itself.

The KV cache continues across turns: after a turn the environment's tokens
(rendered by the chat template) are run onto each episode's cache, and the
conversation is never encoded again. Finished episodes leave the batch.
With ``--engine vllm`` the engine samples the turns: each turn's request is
the conversation so far, and vLLM's prefix cache keeps what it computed before.
The episode's reward is the task's reward of the last policy turn plus the
environment's per-turn rewards, summed with weight turn_discount ** (turn - 1);
every policy token of the episode gets the one advantage (no per-turn credit).

An environment whose reset or step raises, or runs past env_timeout seconds, ends its episode as errored (counted
as ``env_errors``; training leaves the row out of the loss and of its group's
statistics, as a reward call that failed), or stops the run with on_error = "raise".
A group whose every reset raised has no opening: it is not sampled, and its G
rows are errored (empty completions, a one-token stand-in prompt).
"""

from __future__ import annotations

import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from grpo.config import ConfigError, TrainConfig
from grpo.refusals import TURNS_NEED_CHAT
from grpo.sampling.environments import (
    Environment,
    Messages,
    ToolEnv,
    call_within,
    takes_seed,
    template_features,
)
from grpo.sampling.forward import has_sliding_window
from grpo.sampling.prompts import PromptFormat, prompt_format
from grpo.sampling.random_streams import stream_keys, stream_seeds
from grpo.sampling.rollout import Rollout, end_of_turn_ids
from grpo.sampling.tools import ToolBox, load_functions
from grpo.sampling.turn_takers import EngineTurns, OwnTurns

SENTINEL = "\u2063grpo-turn\u2063"  # stands in for a policy turn when the template renders the next messages


class EpisodeError(RuntimeError):
    """An environment raised and on_error is "raise"."""


@dataclass
class Episode:
    """One episode's transcript and counts."""

    messages: Messages  # role-tagged, the opening conversation included
    opening: int  # how many of the messages are the opening
    turns: int = 0
    reward: float = 0.0  # the environment's per-turn rewards, discounted and summed
    env_error: str | None = None  # the traceback's last line when the environment raised
    env_tokens: int = 0
    policy_tokens: int = 0
    last_turn_tokens: int = 0  # the policy's tokens in its last turn: the completion the task scores
    seconds_env: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)  # the environment's own counts (tool calls, ...)

    def transcript(self) -> Messages:
        """The messages after the opening: what the policy wrote and what came back."""
        return self.messages[self.opening :]


@dataclass
class Agent:
    """How the episodes of a run go: the environment factory and the limits.

    ``max_new_tokens`` (the run's) caps each turn; ``max_episode_tokens`` every
    token after the prompt, the environment's included.
    """

    make_env: Callable[[], Environment]
    max_turns: int
    max_episode_tokens: int
    turn_discount: float = 1.0
    on_error: str = "zero"
    schemas: list[dict] = field(default_factory=list)  # passed to the template as tools=, when it renders them
    prompt_format: PromptFormat = field(default_factory=lambda: PromptFormat("chat"))  # chat: episodes take turns
    reencode: bool = False  # encode the whole conversation again each turn (bench/bench_rollout.py's baseline)
    timeout: float = 30.0  # seconds one reset or step may take (config.env_timeout)
    warned: bool = field(default=False, repr=False)  # an environment's first raise was reported

    def encode(self, tokenizer: object, messages: Messages) -> list[int]:
        return self.prompt_format.encode(tokenizer, messages, **self._tools())

    def _call(self, episode: Episode, fn: Callable, *args: object) -> object:
        """Run an environment method, timed; a raise, or a call past ``timeout`` seconds, ends the episode
        (or the run, with on_error raise)."""
        start = time.perf_counter()
        try:
            return call_within(fn, args, self.timeout)
        except Exception as err:
            if self.on_error == "raise":
                raise EpisodeError(f"environment {fn.__qualname__} raised (on_error='raise'): {err}") from err
            if not self.warned:
                self.warned = True
                warnings.warn(f"environment {fn.__qualname__} raised; the episode ends as an errored row, left out of training (later "
                              f"ones are counted in env_errors):\n{traceback.format_exc()}", RuntimeWarning,
                              stacklevel=2)
            episode.env_error = f"{type(err).__name__}: {err}"
            return None
        finally:
            episode.seconds_env += time.perf_counter() - start

    @torch.no_grad()
    def run(
        self, model: nn.Module, tokenizer: object, rows: Sequence[Mapping], *, group_size: int, max_new_tokens: int,
        temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, stop_strings: tuple[str, ...] = (),
        generator: torch.Generator | None = None, streams: Tensor | None = None, engine: object | None = None,
        token_budget: int = 0,
    ) -> Rollout:
        """G episodes for each row, batched; the rollout of their whole transcripts (policy tokens in
        ``mask``, the environment's in ``env_mask``) with each one's :class:`Episode`. ``streams``
        (len(rows) * G, 2): each episode's random stream (grpo/sampling/random_streams.py), counted along its
        transcript, else episodes draw from ``generator``. ``engine``: a vLLM engine
        (grpo/sampling/vllm_engine.py) that samples the turns instead of the policy itself. ``token_budget``
        (0: none): the policy's prefills run in calls of at most that many tokens."""
        stops = end_of_turn_ids(model, tokenizer)
        envs = [self.make_env() for _ in range(len(rows) * group_size)]
        episodes, opened = self._open(envs, rows, group_seeds(len(rows), group_size, streams, generator),
                                      group_size, tokenizer)
        record = _Transcripts(len(envs))
        # the episodes still going, in the order the sampler holds them; a group that never opened is not sampled
        live = [i for i in range(len(envs)) if opened[i // group_size] is not None]
        turns = self._turns(model, tokenizer, engine, [p for p in opened if p is not None], group_size, stops,
                            token_budget)
        prompts = [p if p is not None else [tokenizer.pad_token_id] for p in opened]  # a stand-in: no opening
        limits = self._limits(engine, prompts, group_size)
        for turn_no in range(1, self.max_turns + 1):
            if not live:
                break
            budgets = [min(max_new_tokens, limits[i] - record.used(i)) for i in live]
            keys = None if streams is None else streams[torch.tensor(live, device=streams.device)]
            drawn = [record.used(i) for i in live]  # where each episode's stream goes on
            sampled = turns.sample(budgets, drawn, keys, temperature=temperature, top_p=top_p, top_k=top_k,
                                   stop_strings=stop_strings, generator=generator)
            going, replies = [], []
            for j, (i, (ids, logprobs, stopped)) in enumerate(zip(live, sampled, strict=True)):
                env_ids = self._take_turn(record, i, envs[i], episodes[i], ids, logprobs, stopped, turn_no, tokenizer,
                                          stops, limits[i])
                if env_ids is not None:
                    going.append(j)
                    replies.append(env_ids)
            if not going:
                break
            live = [live[j] for j in going]
            turns.extend(going, replies, [prompts[i // group_size] + record.ids[i] for i in live])
        for episode, env in zip(episodes, envs, strict=True):
            episode.stats.update(getattr(env, "stats", {}))
        return record.rollout(prompts, group_size, episodes, tokenizer.pad_token_id, next(model.parameters()).device)

    def _take_turn(self, record: _Transcripts, i: int, env: Environment, episode: Episode, ids: list[int],
                   logprobs: list[float], stopped: bool, turn_no: int, tokenizer: object, stops: list[int], limit: int
                   ) -> list[int] | None:
        """Record episode i's sampled turn and the environment's reply to it; the reply's tokens when the
        episode goes on, else None (cut by a token limit, ended by the environment, or no room left)."""
        record.add(i, ids, logprobs)
        episode.last_turn_tokens = len(ids)
        episode.messages.append(
            {"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)})
        episode.turns += 1
        if not stopped:
            record.truncated[i] = True  # cut by a token limit: the episode ends there
            return None
        env_ids = self._respond(env, episode, turn_no, tokenizer, ids[-1], stops)
        if env_ids is None:
            return None
        if record.used(i) + len(env_ids) >= limit:
            record.truncated[i] = True  # no room left for another turn
            return None
        record.add(i, env_ids, None)
        episode.env_tokens += len(env_ids)
        return env_ids

    def _turns(self, model: nn.Module, tokenizer: object, engine: object | None, prompts: list[list[int]],
               group_size: int, stops: list[int], token_budget: int = 0) -> OwnTurns | EngineTurns | None:
        """Who samples the turns of the groups that opened (``prompts``): the engine or the policy itself."""
        if not prompts:
            return None
        if engine is not None:
            return EngineTurns(engine, prompts, group_size)
        return OwnTurns(model, tokenizer, prompts, group_size, stops,
                        keep_cache=self.max_turns > 1 and not self.reencode and not has_sliding_window(model),
                        token_budget=token_budget)

    def _limits(self, engine: object | None, prompts: list[list[int]], group_size: int) -> list[int]:
        """The tokens each episode may add after its prompt; on an engine also within its length limit
        (vLLM refuses a request past it)."""
        limits = [self.max_episode_tokens if engine is None else
                  min(self.max_episode_tokens, engine.max_model_len - len(prompt))
                  for prompt in prompts for _ in range(group_size)]
        if min(limits) <= 0:
            raise ConfigError(f"an episode's opening ({max(len(p) for p in prompts)} tokens) leaves no room within "
                              f"the engine's length limit ({engine.max_model_len} tokens)")
        return limits

    def _open(self, envs: list[Environment], rows: Sequence[Mapping], seeds: list[int], group_size: int,
              tokenizer: object) -> tuple[list[Episode], list[list[int] | None]]:
        """Reset every environment with its group's seed; a group's prompt is its opening conversation.
        A group whose every reset raised (on_error "zero") has none (None): its episodes are errored rows."""
        episodes, prompts = [], []
        for b, (row, seed) in enumerate(zip(rows, seeds, strict=True)):
            group = envs[b * group_size : (b + 1) * group_size]
            opened = []
            for env in group:
                episode = Episode([], 0)
                args = (row, seed) if takes_seed(env.reset) else (row,)
                messages = self._call(episode, env.reset, *args)
                opened.append((episode, messages))
            good = [m for _, m in opened if m is not None]
            if not good:  # no opening to sample from: the group's rows are errored, like an episode's raise
                episodes += [episode for episode, _ in opened]
                prompts.append(None)
                continue
            if any(m != good[0] for m in good[1:]):
                raise ConfigError(
                    f"environment {type(group[0]).__qualname__}: the {group_size} episodes of row {b} opened with "
                    "different conversations, but a group's episodes must share one task; draw random state "
                    "from the seed reset(example, seed) is given (random.Random(seed)), not from a global RNG")
            for episode, messages in opened:
                episode.messages = [dict(m) for m in (messages if messages is not None else good[0])]
                episode.opening = len(episode.messages)
                episodes.append(episode)
            prompts.append(self.encode(tokenizer, good[0]))
        return episodes, prompts

    def _respond(self, env: Environment, episode: Episode, turn_no: int, tokenizer: object, last: int,
                 stops: list[int]) -> list[int] | None:
        """The environment's answer to a finished turn as token ids, or None when the episode ends."""
        if episode.env_error is not None:
            return None
        out = self._call(episode, env.step, [dict(m) for m in episode.messages])
        if out is None:
            return None
        reply, reward, done = out
        episode.reward += float(reward or 0.0) * self.turn_discount ** (turn_no - 1)
        if done or not reply or turn_no == self.max_turns:
            return None
        stop_text = tokenizer.decode([last]) if last in stops else ""
        ids = continuation_ids(tokenizer, episode.messages, list(reply), self._template_extra(), stop_text=stop_text)
        episode.messages.extend(dict(m) for m in reply)
        return ids

    def _tools(self) -> dict:
        return {"tools": self.schemas} if self.schemas else {}

    def _template_extra(self) -> dict:
        """What the chat template is called with: the tools, and the run's template when it is not the tokenizer's."""
        template = self.prompt_format.template
        return {**self._tools(), **({"chat_template": template} if template else {})}


def group_seeds(groups: int, group_size: int, streams: Tensor | None,
                generator: torch.Generator | None) -> list[int]:
    """One seed in [0, 2^32) per group for its environments' reset: from the group's first episode's
    stream (grpo/sampling/random_streams.py), the same on a rerun and on any number of processes; without streams,
    drawn from ``generator`` (the pre-flight check); without either (greedy evaluation), the stream
    of the group's index in the call, so that torch's global generator is left as it was."""
    if streams is not None:
        return stream_seeds(streams[::group_size][:groups])
    if generator is not None:
        return torch.randint(0, 2**32, (groups,), generator=generator, device=generator.device).tolist()
    return stream_seeds(stream_keys(torch.arange(groups)))


def continuation_ids(tokenizer: object, messages: Messages, reply: Messages, extra: dict, *,
                     stop_text: str) -> list[int]:
    """The tokens the chat template puts between the end of the last policy turn and the next one:
    the turn's closing, the reply messages, the next turn's opening.

    The last turn is rendered as a placeholder, so the template's text after it
    is exactly what follows the policy's tokens; the policy's own stop token
    (``stop_text``, already sampled) is not repeated.
    """
    conv = [*messages[:-1], {"role": "assistant", "content": SENTINEL}]
    text = tokenizer.apply_chat_template([*conv, *reply], add_generation_prompt=True, tokenize=False, **extra)
    after = text[text.rindex(SENTINEL) + len(SENTINEL) :]
    if stop_text and after.startswith(stop_text):
        after = after[len(stop_text) :]
    return list(tokenizer(after, add_special_tokens=False)["input_ids"])


class _Transcripts:
    """Each episode's tokens after the prompt as the policy and the environment add them."""

    def __init__(self, n: int) -> None:
        self.ids: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[float]] = [[] for _ in range(n)]
        self.policy: list[list[float]] = [[] for _ in range(n)]
        self.truncated = [False] * n

    def used(self, i: int) -> int:
        return len(self.ids[i])

    def add(self, i: int, ids: list[int], logprobs: list[float] | None) -> None:
        self.ids[i] += ids
        self.logprobs[i] += logprobs if logprobs is not None else [0.0] * len(ids)
        self.policy[i] += [1.0 if logprobs is not None else 0.0] * len(ids)

    def rollout(self, prompts: list[list[int]], group_size: int, episodes: list[Episode], pad_id: int,
                device: torch.device) -> Rollout:
        n, width = len(self.ids), max(max(len(x) for x in self.ids), 1)
        ids = torch.full((n, width), pad_id, dtype=torch.long)
        mask, env_mask, logprobs = torch.zeros(n, width), torch.zeros(n, width), torch.zeros(n, width)
        for i in range(n):
            k = len(self.ids[i])
            ids[i, :k] = torch.tensor(self.ids[i], dtype=torch.long)
            mask[i, :k] = torch.tensor(self.policy[i])
            env_mask[i, :k] = 1.0 - mask[i, :k]
            logprobs[i, :k] = torch.tensor(self.logprobs[i])
            episodes[i].policy_tokens = int(mask[i].sum())
        texts = [next((m["content"] for m in reversed(e.messages) if m["role"] == "assistant"), "") for e in episodes]
        return Rollout(
            prompt_ids=prompts, completion_ids=ids.to(device), mask=mask.to(device), logprobs=logprobs.to(device),
            truncated=torch.tensor(self.truncated, device=device), texts=texts, group_size=group_size,
            env_mask=env_mask.to(device), episodes=episodes,
        )


def make_agent(config: TrainConfig, task: object, tokenizer: object, *, tools: Sequence[Callable] | None = None,
               env: Callable | None = None) -> tuple[Agent | None, ToolBox | None]:
    """How a run's episodes go: the given, configured or task's (``task``: a grpo.tasks.Task) environment,
    else the given, configured or task's tools as a ToolEnv; (None, None) for a single-turn task. The
    ToolBox, when there is one, holds worker processes: close it when done. ``config`` is settled."""
    make_env = env or (load_functions(config.env, "environment")[0] if config.env else None) or task.env
    withheld = config.tools == "none"
    if tools is None:
        tools = load_functions(config.tools) if config.tools and not withheld else list(task.tools)
    if make_env is not None and tools:
        raise ConfigError("give tools or an environment, not both (an environment can call tools itself)")
    if make_env is None and not tools:
        return None, None
    fmt = prompt_format(tokenizer, config.prompt_format, config.chat_template)
    if fmt.name != "chat":
        raise ConfigError(TURNS_NEED_CHAT.format(fmt=fmt.name))
    schemas: list[dict] = []
    box = None
    if make_env is None:
        box = ToolBox(tools, timeout=config.tool_timeout, withheld=withheld)
        native, role = template_features(tokenizer, box.schemas, fmt.template)
        schemas = box.schemas if native else []

        def make_env() -> ToolEnv:  # one per episode
            return ToolEnv(box, task.messages, role, native)

    agent = Agent(make_env, max_turns=config.max_turns, max_episode_tokens=config.max_episode_tokens,
                  turn_discount=config.turn_discount, on_error=config.on_error, schemas=schemas, prompt_format=fmt,
                  timeout=config.env_timeout)
    return agent, box
