"""What an episode adds up to: its reward (the task's plus the environment's), the tokens a length-aware
reward counts, and a step's figures over its episodes (grpo/sampling/episodes.py runs the episodes)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from grpo.sampling.episodes import Episode
from grpo.sampling.rollout import Rollout


def episode_total(task_reward: float, episode: Episode | None) -> float:
    """An episode's reward: the task's reward of its last policy turn plus the environment's (discounted)
    per-turn rewards; NaN when the environment raised (the row errored: training leaves it out, evaluation
    counts it unsolved). A single-turn completion (None): the task's."""
    if episode is None:
        return task_reward
    return math.nan if episode.env_error is not None else task_reward + episode.reward


def scored_tokens(rollout: Rollout) -> list[int]:
    """Each row's tokens in the completion its task reward scores, what a reward sees as
    ``completion_tokens``: a single-turn row's, an episode's last policy turn.

    Length-aware rewards (DAPO's overlong penalty) compare this count with
    ``max_completion_tokens``, which is max_new_tokens, the per-turn limit; so an
    episode's count is per turn too, like with like. Not the sum over its turns,
    which the per-turn limit does not bound (three turns of 60 under a limit of
    100 scored as 180, past it), and not the episode's total against
    max_episode_tokens, which counts the environment's tokens, not the policy's
    to shorten. A turn cut by a limit ends its episode, so the turn a cut falls
    on is the last one, the one counted.
    """
    if rollout.episodes is None:
        return rollout.lengths.tolist()
    return [e.last_turn_tokens for e in rollout.episodes]


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Per-step figures over the episodes: turns and tool calls per episode; parse failures, tool
    errors, tool timeouts and environment errors (counts); seconds in tools and in environments
    (tools included); the environment's share of the tokens after the prompts."""
    n = max(len(episodes), 1)
    total = {key: sum(e.stats.get(key, 0.0) for e in episodes)
             for key in ("tool_calls", "parse_failures", "tool_errors", "tool_timeouts", "seconds_tools")}
    env_tokens = sum(e.env_tokens for e in episodes)
    return {
        "turns_per_episode": sum(e.turns for e in episodes) / n,
        "tool_calls_per_episode": total.pop("tool_calls") / n,
        **total,
        "env_errors": float(sum(e.env_error is not None for e in episodes)),
        "seconds_env": sum(e.seconds_env for e in episodes),
        "env_token_frac": env_tokens / max(env_tokens + sum(e.policy_tokens for e in episodes), 1),
    }
