"""Contract and property checks for plugin authors, shipped with schedlab.

Run them against any plugin, registered or not::

    schedlab plugins --check scheduler=my_policy
    pytest --pyargs schedlab.testing --plugin scheduler=my_module:MyScheduler

or from Python: `check_plugin("queue", MyQueue)`. See docs/plugins.md.

Names are imported on first use, so the pytest plugin (`schedlab.testing.pytest_plugin`)
loads nothing heavy into other test suites.
"""

from __future__ import annotations

from schedlab._lazy import lazy_exports

_EXPORTS = {
    "CheckResult": "checks", "all_targets": "checks", "check_plugin": "checks",
    "parse_target": "checks",
    "CheckingExecutor": "executor", "KVContractError": "executor", "reference_output": "executor",
    "SETTINGS": "runs", "RunSetting": "runs", "engine_config": "runs", "run_engine": "runs",
    "run_cluster": "runs",
    "CONTRACTS": "contracts",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, {k: f"{__name__}.{m}" for k, m in _EXPORTS.items()})
