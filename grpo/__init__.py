"""grpo: Group Relative Policy Optimization on verifiable rewards."""

from grpo.config import TrainConfig

__all__ = ["GRPOTrainer", "TrainConfig", "group_advantages", "policy_loss", "train"]
__version__ = "0.1.0"


def __getattr__(name: str):  # keep `import grpo` light (and CLI errors fast): no torch until needed
    if name in ("GRPOTrainer", "train"):
        from grpo import trainer

        return getattr(trainer, name)
    if name in ("group_advantages", "policy_loss"):
        from grpo import algorithm

        return getattr(algorithm, name)
    raise AttributeError(name)
