"""The planner: how to run a model on a machine, decided from metadata before loading.

Modules, one job each:
- `model_facts`  ModelSpec plus the tensor table the planner needs (types, rows, bytes)
- `devices`      Device records from a HardwareProfile, a profile file or CLI overrides
- `memory`       the analytical memory model (weights, KV, compute, output per device)
- `placement`    which device holds each layer and each layer's MoE experts
- `perf`         the roofline performance model (prefill/decode t/s, TTFT, bottleneck)
- `microbatch`   n_batch / n_ubatch from memory headroom and the prefill curve
- `preflight`    degrade in a stated order until the plan fits, or refuse with numbers
- `plan`         the Plan record and its llama.cpp parameters
- `simulate`     Plan + perf model → Prediction (what `inferenceos simulate` prints)
"""
