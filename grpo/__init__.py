"""grpo: Group Relative Policy Optimization on verifiable rewards.

``grpo.train`` runs the whole trainer; the building blocks below are the GRPO
step's parts, for writing a loop of one's own (examples/plain_grpo.py).
"""

from grpo.config import TrainConfig

# name -> the module that defines it, imported on first use: `import grpo` stays light (and the CLI's
# errors fast), with no torch until a name that needs it is used. No name may be a submodule's
# (`evaluate`, `rollout`): once that submodule is imported, its module object shadows the name.
_LAZY = {
    "GRPOTrainer": "grpo.run.trainer",
    "resolve_run": "grpo.run.build",
    "train": "grpo.api",
    "setup_process": "grpo.run.process_setup",
    "load_policy": "grpo.models",
    "load_task": "grpo.tasks",
    "encode_prompts": "grpo.sampling.evaluate",
    "generate": "grpo.sampling.rollout",
    "Rollout": "grpo.sampling.rollout",
    "group_advantages": "grpo.math.algorithm",
    "rollout_logprobs": "grpo.learning.logprobs",
    "policy_loss": "grpo.math.loss",
    "greedy_accuracy": "grpo.sampling.evaluate",
}

__all__ = ["TrainConfig", *_LAZY]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'grpo' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
