"""Fault injection: a fault is applied to a real server, model file or database; each
test checks the clear error, recovery without a restart and that nothing was lost
(registry and telemetry intact, other models unaffected)."""
