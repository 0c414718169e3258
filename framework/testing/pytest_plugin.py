"""The pytest plugin (entry point `pytest11`): adds `--plugin KIND=NAME` to pytest.

It imports nothing from schedlab at start-up, so it costs nothing in other test suites.
"""

from __future__ import annotations


def pytest_addoption(parser) -> None:
    group = parser.getgroup("schedlab", "schedlab plugin checks")
    group.addoption(
        "--plugin", action="append", default=[], metavar="KIND=NAME",
        help="a schedlab plugin for `pytest --pyargs schedlab.testing` to check, e.g. "
             "scheduler=my_policy or queue=my_module:MyQueue (repeatable; default: every "
             "installed plugin)")
