"""A run, top to bottom: the loop (trainer), building its parts, the pre-flight check, memory, checkpoints
and the run's state, what a step records, where each batch comes from. Imports every other part but the CLI.
"""
