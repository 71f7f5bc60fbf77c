"""The GRPO math on tensors and plain numbers: advantages, the objectives, KL, aggregation, and each
objective's recommended settings. Imports torch alone, no other part of grpo.
"""
