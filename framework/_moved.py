"""Old import paths of modules that moved into `schedlab.sim` and `schedlab.runs` (0.2).

`import schedlab.workload` still works, with a DeprecationWarning naming the new path, and gives
the very same module object as `schedlab.runs.workload`. The aliases go away in 0.4.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

#: old module name -> new module name
MOVED: dict[str, str] = {
    **{f"schedlab.{m}": f"schedlab.sim.{m}" for m in (
        "costmodel", "hardware", "model_presets")},
    **{f"schedlab.{m}": f"schedlab.calibration.{m}" for m in ("calibrate", "costfit", "validate")},
    **{f"schedlab.{m}": f"schedlab.runs.{m}" for m in (
        "workload", "traces", "driver", "metrics", "results", "report", "plots", "tracking")},
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {self.new}; the old path goes away in 0.4",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.new)

    def exec_module(self, module) -> None:
        sys.modules[module.__spec__.name] = module  # the new module, under the old name too


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Resolves the old names in `MOVED` to their new modules."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
