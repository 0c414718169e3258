"""Triton kernels for paged attention, each with a pure-torch `*_ref` twin.

Modules are imported on demand: `triton.jit` reads `TRITON_INTERPRET` when a kernel is
decorated, so the variable must be set before `schedlab.kernels.store_kv`,
`schedlab.kernels.decode_attention` or `schedlab.kernels.prefill_attention` is imported.
"""

if __name__ == "kernels":
    # NOTE: imported as the top-level `kernels`, not `schedlab.kernels`: the checkout's root is
    # on sys.path (`python -m pytest`, `python -c` in the repository) and this folder shadows
    # Hugging Face's `kernels` package, which transformers (>= 5.25) imports. The package
    # found on the rest of sys.path takes this module's place (without one, this folder stays
    # what `kernels` names, as transformers < 5.25 expects of a name it only probes).
    import importlib.machinery as _machinery
    import importlib.util as _util
    import os as _os
    import sys as _sys

    _root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    _path = [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != _root]
    _spec = _machinery.PathFinder.find_spec("kernels", _path)
    if _spec is not None and _spec.loader is not None:
        _module = _util.module_from_spec(_spec)
        _sys.modules["kernels"] = _module
        _spec.loader.exec_module(_module)
