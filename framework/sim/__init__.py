"""The simulator: a cost model of one step on named hardware, its calibration and validation.

`executor=sim` (plugins/executors/sim.py) runs the real scheduler, allocator, prefix cache and
queue on a virtual clock and charges each step what `costmodel.CostModel` predicts.
"""
