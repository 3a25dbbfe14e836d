"""Measured tuning: `optimize` (search by short real trials), `benchmark` (a matrix of
settings against llama.cpp's defaults) and `profile` (one run broken down by phase).

This layer sits above `engine/` (it loads models through `LoadedModel` and `Engine`)
and writes what it measures to `telemetry/`. The planner never imports it: the best
settings it finds are read back by `plan.tuned.best_settings`, from telemetry.

- `space`: the knobs, llama.cpp's defaults, the candidate values (pure);
- `stopping`: when a trial is hopeless, how settings are scored (pure);
- `trials`: one short real measurement of prefill and decode t/s;
- `search`: the budgeted coordinate search with a paired confirmation at the end;
- `records`: the bridge to the telemetry store;
- `matrix` and `chart`: the benchmark matrix and its PNG;
- `profiler` and `html_report`: the phase timeline and its self-contained HTML page.
"""
