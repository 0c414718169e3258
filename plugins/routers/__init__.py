"""Built-in routers (the `schedlab.routers` entry-point group)."""
