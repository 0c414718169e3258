"""Triton kernels for paged attention, each with a pure-torch `*_ref` twin.

Modules are imported on demand: `triton.jit` reads `TRITON_INTERPRET` when a kernel is
decorated, so the variable must be set before `schedlab.kernels.store_kv`,
`schedlab.kernels.decode_attention` or `schedlab.kernels.prefill_attention` is imported.
"""
