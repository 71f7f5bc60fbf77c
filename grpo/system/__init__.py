"""The machine and its processes: the heap's settings, signals, worker pools, the user's code, collectives
and the launcher. Imports no other part of grpo.
"""
