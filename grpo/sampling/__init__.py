"""Generating and scoring a step's groups: prompt samplers, prompt formats, the decoder with its KV cache,
rollouts, episodes and tools, screening, rounds, vLLM, held-out evaluation. Imports math, system, rewards,
tasks and the configuration; never learning, observe or run.
"""
