"""The engine: one loaded model, continuous batching over one llama.cpp context.

The core modules at this level own a generation's path: `session` (model and context),
`scheduler` (the step), `step_plan` and `executor` (one batch, one decode), `sampling`,
`output` and `stop` (tokens to text), and the three faces callers use (`client`,
`engine`, `local`). Below them sit `llama/` (the library and its structs), `kv/` (slots,
policies, the tiered KV store), `weights/` (layout, residency, streaming) and `spec/`
(drafting and verification); `worker/` (the process, its pipe, live migration) sits on
top. The engine may import the layers below it (plan, telemetry, hardware, model, ...),
never registry, server or cli; tests/test_layers.py checks both rules.
"""
