"""The plugin checks as pytest tests: `pytest --pyargs schedlab.testing --plugin KIND=NAME`.

Without `--plugin`, every installed plugin is checked.
"""

from __future__ import annotations

import pytest

from schedlab import registry
from schedlab.testing.checks import all_targets, check_plugin, parse_target
from schedlab.testing.contracts import CONTRACTS
from schedlab.testing.runs import (
    RUN_KINDS,
    SETTINGS,
    RunSetting,
    engine_config,
    run_cluster,
    run_engine,
)


def _targets(config) -> list[tuple[str, str]]:
    try:
        given = config.getoption("plugin")
    except ValueError:  # the pytest plugin is not installed: check everything
        given = None
    return [parse_target(t) for t in given] if given else all_targets()


#: a router's run: a cluster of checked engines (`run_cluster`)
CLUSTER = RunSetting("3 instances behind the router")


def pytest_generate_tests(metafunc) -> None:
    if "target" not in metafunc.fixturenames:
        return
    targets = _targets(metafunc.config)
    if "setting" in metafunc.fixturenames:
        pairs = [(t, s) for t in targets
                 for s in ((CLUSTER,) if t[0] == "router" else SETTINGS)]
        metafunc.parametrize("target,setting", pairs,
                             ids=[f"{k}={n}-{s.name}" for (k, n), s in pairs])
    else:
        metafunc.parametrize("target", targets, ids=[f"{k}={n}" for k, n in targets])


def test_loads(target):
    kind, name = target
    registry.load(kind, name)


def test_contract(target):
    kind, name = target
    contract = CONTRACTS.get(kind)
    if contract is None:
        pytest.skip(f"no unit contract for {kind}; covered by the engine runs")
    cls = registry.load(kind, name)
    try:
        contract(cls, None)
    except RuntimeError as e:
        if kind != "attention":
            raise
        pytest.skip(str(e))


@pytest.mark.parametrize("seed", range(4))
def test_engine_runs(target, setting, seed):
    kind, name = target
    if kind not in RUN_KINDS:
        pytest.skip(f"{kind} plugins need a model to run")
    if kind == "router":
        run_cluster(registry.load(kind, name), None, seed)
        return
    run_engine(engine_config(kind, registry.load(kind, name), None, setting), seed)


def test_check_plugin_passes(target):
    kind, name = target
    failed = [r for r in check_plugin(kind, name, seeds=(0,)) if r.ok is False]
    assert not failed, failed[0].message
