"""What a run shows: the alarms and their noise model, metric sinks, progress bars, the held-out
evaluations' schedule, and the report. Imports learning, sampling, math and below; never run.
"""
