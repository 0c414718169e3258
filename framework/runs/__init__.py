"""Running and measuring: workloads and traces, the driver that feeds an engine, vLLM-style
metrics, results files, plots, reports and experiment tracking.

Everything here uses the engine's public API only (`Engine.add_request`, `step`, `abort`, its
clock and counters), so the same code drives any scheduler and either executor.
"""
