"""Learning from a batch: the log-probs with gradients, the update (epochs, micro-batches, the loss), and
the teacher's distillation term. Imports sampling, math, system and the configuration; never observe or run.
"""
