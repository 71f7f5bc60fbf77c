"""On-policy distillation (GKD, Agarwal et al. 2023; "on-policy distillation", Thinking Machines 2025): a
teacher model scores every token the policy samples, and the student is trained towards the teacher on its
own samples, the states it meets at test time. With no reward (``--rewards none``) that is the whole signal;
with rewards, the teacher's term adds to GRPO's surrogate.

The package owns the teacher's options and refusals (options.py), the divergence math, pure functions of
tensors (divergence.py), and the teacher's model and passes (scoring.py). It imports the configuration, the
model loader and the log-prob passes (grpo.config, grpo.models, grpo.learning.logprobs, grpo.sampling.forward); the update
(grpo/learning/update.py) and the trainer import it, never the other way round.
"""
