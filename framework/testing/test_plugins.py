"""The plugin checks as pytest tests: `pytest --pyargs schedlab.testing --plugin KIND=NAME`.

Without `--plugin`, every installed plugin is checked.
"""

from __future__ import annotations

import pytest

from schedlab import registry
from schedlab.testing.checks import all_targets, check_plugin, parse_target
from schedlab.testing.contracts import CONTRACTS
from schedlab.testing.runs import RUN_KINDS, SETTINGS, engine_config, run_engine


def _targets(config) -> list[tuple[str, str]]:
    try:
        given = config.getoption("plugin")
    except ValueError:  # the pytest plugin is not installed: check everything
        given = None
    return [parse_target(t) for t in given] if given else all_targets()


def pytest_generate_tests(metafunc) -> None:
    if "target" in metafunc.fixturenames:
        targets = _targets(metafunc.config)
        metafunc.parametrize("target", targets, ids=[f"{k}={n}" for k, n in targets])
    if "setting" in metafunc.fixturenames:
        metafunc.parametrize("setting", SETTINGS, ids=[s.name for s in SETTINGS])


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
    run_engine(engine_config(kind, registry.load(kind, name), None, setting), seed)


def test_check_plugin_passes(target):
    kind, name = target
    failed = [r for r in check_plugin(kind, name, seeds=(0,)) if r.ok is False]
    assert not failed, failed[0].message
