"""What a CUDA graph cannot hold, recorded on any device: a TorchDispatchMode over a forward.

A captured CUDA graph replays kernels only: an op that copies a value to the host (`item`,
`bool`, `int`), whose output shape depends on tensor data (`nonzero`, boolean-mask indexing,
`unique`, `repeat_interleave` without `output_size`), that reads host data (`torch.tensor`
inside the forward) or that puts a tensor on another device than the step's either fails at
capture or replays stale values. `CaptureSafetyRecorder` records every such op run under it
(with the first caller outside torch), so a CPU test can show that a backend's captured
decode step, and transformers' own layers around it, contain none.

Triton's interpreter (`TRITON_INTERPRET=1`, how the Triton kernels run on a CPU) copies a
kernel's tensor arguments to the host and back at each launch; it does so on untyped storages
(`untyped_storage().cpu()`, `set_`, storage `copy_`), which pass no flagged op through the
dispatcher (checked with Triton 3.9: nothing of the interpreter's is recorded), so no filter
is needed and everything the `kernels/` launchers run is recorded as on a GPU.

Limits: a `.tolist()` or `.numpy()` of a CPU tensor reads memory without an op, so it is
invisible on a CPU (on CUDA it shows as a copy to the CPU); the backend's host copies in
`AttentionMetadata` are Python lists, read without any op.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

#: ops that copy a tensor value to the host (a sync, and a stale constant in a replay)
HOST_SYNC_OPS = {aten._local_scalar_dense.default: "copies a value to the host (item/int/float)",
                 aten.item.default: "copies a value to the host (item)",
                 aten.equal.default: "returns a Python bool (a copy to the host)",
                 aten.is_nonzero.default: "returns a Python bool (a copy to the host)"}
#: ops whose output shape depends on tensor values (a sync to size the output)
DATA_SHAPE_OPS = {
    aten.nonzero.default, aten.masked_select.default, aten._unique.default,
    aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default,
    aten.unique_dim_consecutive.default, aten.bincount.default, aten.argwhere.default,
}
#: `torch.tensor(data)` inside the forward: a copy from host data
HOST_DATA_OPS = {aten.lift_fresh.default, aten.lift_fresh_copy.default}
_REPEAT_INTERLEAVE = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}
_INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
              aten._index_put_impl_.default}

_TORCH_DIR = os.path.dirname(torch.__file__)
_HERE = os.path.abspath(__file__)


@dataclass(frozen=True, slots=True)
class Finding:
    """One op a CUDA graph cannot hold."""

    op: str
    why: str
    where: str  # file:line function of the innermost caller outside torch


class CaptureSafetyRecorder(TorchDispatchMode):
    """Records ops that would sync the host, have data-dependent output shapes, read host
    data, or touch another device than `device`. Use as a context manager; read `findings`.

    Args:
        device: the step's device.
    """

    def __init__(self, device: torch.device | str) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.findings: list[Finding] = []
        self.num_ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.num_ops += 1
        # recorded before the op runs: an op that then fails is still reported
        self._record(func, _unsafe(func, args, kwargs) or self._reads_off_device(args, kwargs))
        out = func(*args, **kwargs)
        outs = _tensors(out if isinstance(out, list | tuple) else [out])
        off = next((t.device for t in outs if t.device != self.device), None)
        if off is not None:
            self._record(func, f"creates a tensor on {off} (the step runs on {self.device})")
        return out

    def _record(self, func, why: str | None) -> None:
        if why is not None:
            self.findings.append(Finding(str(func), why, _caller()))

    def _reads_off_device(self, args, kwargs) -> str | None:
        for t in _tensors(args) + _tensors(list(kwargs.values())):
            # a 0-dim CPU tensor is a wrapped Python number, as valid on any device
            if t.device != self.device and not (t.device.type == "cpu" and t.dim() == 0):
                return f"reads a tensor on {t.device} (the step runs on {self.device})"
        return None

    def report(self) -> str:
        """The findings, one a line (empty when there are none)."""
        return "\n".join(f"{f.op}: {f.why} at {f.where}" for f in self.findings)


def _unsafe(func, args, kwargs) -> str | None:
    if func in HOST_SYNC_OPS:
        return HOST_SYNC_OPS[func]
    if func in DATA_SHAPE_OPS:
        return "output shape depends on tensor values (a copy to the host to size it)"
    if func in HOST_DATA_OPS:
        return "a tensor made from host data inside the step (torch.tensor)"
    if func in _REPEAT_INTERLEAVE and _arg(func, args, kwargs, "output_size") is None:
        return "repeat_interleave without output_size (a copy to the host to size it)"
    if func in _INDEX_OPS:
        indices = _arg(func, args, kwargs, "indices") or ()
        if any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in indices):
            return "boolean-mask indexing (a nonzero inside: data-dependent shape)"
    return None


def _arg(func, args, kwargs, name: str):
    """An op's argument by name, passed by position or by keyword (None: not passed)."""
    if name in kwargs:
        return kwargs[name]
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            return args[i] if i < len(args) else None
    return None


def _tensors(values) -> list[torch.Tensor]:
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, list | tuple):
            out.extend(_tensors(v))
    return out


def _caller() -> str:
    """The innermost stack frame outside torch and this module."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith(_TORCH_DIR) or os.path.abspath(frame.filename) == _HERE:
            continue
        return f"{frame.filename}:{frame.lineno} {frame.name}"
    return "?"
