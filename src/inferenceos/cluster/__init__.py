"""Multi-node through llama.cpp's RPC backend (ggml-rpc).

A `worker` (`cluster.worker`) serves this machine's ggml devices to other machines with
`ggml_backend_rpc_start_server`, and beside the RPC port a small info endpoint
(`cluster.info`) that says what the worker offers: its devices, their free memory, the
`--mem` cap (llama.cpp's RPC protocol has no cap of its own), its threads and whether a
client holds it. The client side (`cluster.probe`) asks each worker's info endpoint and
measures the link once (round trip, bandwidth), cached like the hardware profile; the
planner turns the answers into ordinary `Device`s of kind "rpc".

Worker addresses (`host:port[=SIZE]`, device names) are parsed by the leaf
`inferenceos.endpoint`, which config and hardware use too. This package sits just above
`hardware/` in the data flow (it reads the hardware profile and feeds the pressure
sensor its `rpc_source`): it imports `hardware/`, `model/` and the shared leaves, never
`plan/`, `engine/`, `registry/` or `server/` (tests/test_layers.py).
"""
