"""The worker process and its pipe: the typed messages each way, the worker's loop
around the scheduler, the parent's end of the pipe, and live migration (exporting every
running sequence, the `LiveState` it carries, and swapping an engine onto a new worker).

It sits on top of the engine: it may import any engine module; only the engine's faces
(`engine`, `base`) import it.
"""
