"""grpo: Group Relative Policy Optimization on verifiable rewards."""

from grpo.algorithm import group_advantages, policy_loss
from grpo.config import TrainConfig

__all__ = ["GRPOTrainer", "TrainConfig", "group_advantages", "policy_loss", "train"]
__version__ = "0.1.0"


def __getattr__(name: str):  # keep `import grpo` light: the trainer pulls in transformers
    if name in ("GRPOTrainer", "train"):
        from grpo import trainer

        return getattr(trainer, name)
    raise AttributeError(name)
