"""Calibration of the simulator: time the real engine, fit the cost model, validate it.

`schedlab calibrate` (`calibrate`) measures step shapes with the real executor (`measure`) and
fits a `schedlab.sim.hardware.HardwareProfile` to them (`costfit`); `schedlab validate`
(`validate`) runs workloads under both executors. Unlike `schedlab.sim`, this package drives
an `Engine` and needs torch.
"""
