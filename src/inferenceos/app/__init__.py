"""The application layer beside the Python API: what a command does, conducted once,
for the CLI (and the server, where they share it) to call and render.

It owns the steps a command takes through the lower layers (resolve the model, read
its media, plan, load, generate, record), in the order the commands have always taken
them, so the same error comes first. It may import every layer below it (engine,
registry, tuning, plan, ...) and `inferenceos.api`, never `cli` or `server`: what it
has to show (a plan line, streamed text) goes out through callbacks its caller gives.
"""
