"""`check_plugin`: every check a plugin of an interface must pass, as results, not exceptions.

Behind `schedlab plugins --check` and `pytest --pyargs schedlab.testing --plugin KIND=NAME`.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from typing import Any

from schedlab import registry
from schedlab.config import ConfigError
from schedlab.testing.contracts import CONTRACTS
from schedlab.testing.runs import RUN_KINDS, SETTINGS, engine_config, run_cluster, run_engine


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check of one plugin. `ok` is None when the check was skipped."""

    kind: str
    plugin: str  # as messages name it, e.g. "'fcfs'" or "'my_module:MyQueue'"
    check: str  # "load", "options", "contract", "engine runs"
    ok: bool | None
    message: str


def parse_target(text: str) -> tuple[str, str]:
    """`"scheduler=my_policy"` -> ("scheduler", "my_policy"); the name may be a dotted path.

    Raises:
        ValueError: not `KIND=NAME`, or an unknown kind (the message lists the kinds).
    """
    kind, sep, name = text.partition("=")
    kind, name = kind.strip(), name.strip()
    if not sep or not kind or not name:
        raise ValueError(f"{text!r} is not KIND=NAME (e.g. scheduler=my_policy or "
                         "queue=my_module:MyQueue)")
    if kind not in registry.all_groups():
        raise ValueError(f"{text!r}: unknown plugin kind {kind!r}; kinds: "
                         f"{', '.join(registry.all_groups())}")
    return kind, name


def all_targets() -> list[tuple[str, str]]:
    """Every installed plugin as (kind, name)."""
    return [(kind, name) for kind in registry.all_groups() for name in registry.available(kind)]


def _why(exc: BaseException) -> str:
    """The exception as one line, with the innermost frame (in the plugin, usually)."""
    msg = f"{type(exc).__name__}: {exc}" if not isinstance(
        exc, AssertionError | registry.PluginError | ConfigError) else str(exc)
    tb = traceback.extract_tb(exc.__traceback__)
    if tb and not isinstance(exc, registry.PluginError | ConfigError) and not (
            isinstance(exc, AssertionError) and _is_check(tb[-1].filename)):
        last = tb[-1]
        msg += f" (at {last.filename}:{last.lineno})"
    return msg or type(exc).__name__


def _is_check(path: str) -> bool:
    """Whether a frame is in the checks themselves (their message says it all)."""
    return os.path.dirname(os.path.abspath(path)) == os.path.dirname(os.path.abspath(__file__))


def check_plugin(kind: str, spec: str | type, options: dict[str, Any] | None = None,
                 seeds: tuple[int, ...] = (0, 1)) -> list[CheckResult]:
    """Run every check for one plugin: load-time class checks, its options, its interface's
    unit contract, and checked engine runs (`SETTINGS` x `seeds`). Stops at the first failure.

    Args:
        kind: the interface (`scheduler`, `queue`, ...).
        spec: a registered name, a `"module:Class"` path or a class.
        options: constructor keyword options (default: none).
        seeds: the workloads of the engine runs.

    Returns:
        One result per check, in order; a failed one ends the list.
    """
    label = registry.describe(spec)
    out: list[CheckResult] = []

    def add(check: str, ok: bool | None, message: str) -> bool:
        out.append(CheckResult(kind, label, check, ok, message))
        return ok is not False

    try:
        cls = registry.load(kind, spec)
    except Exception as e:  # noqa: BLE001 - every failure becomes a result
        add("load", False, _why(e))
        return out
    base = registry.interface(kind)
    what = f"subclasses {base.__qualname__}, " if base is not None else ""
    add("load", True, f"{what}implements every abstract method, constructor takes "
        f"({', '.join(registry.POSITIONAL.get(kind, ()))})")
    try:
        registry.resolve(kind, spec, options)
        specs, open_ = registry.option_specs(kind, cls)
    except Exception as e:  # noqa: BLE001
        add("options", False, _why(e))
        return out
    add("options", True, "accepts any options" if open_ else
        f"accepts {'; '.join(map(str, specs))}" if specs else "takes no options")
    contract = CONTRACTS.get(kind)
    if contract is not None:
        try:
            contract(cls, options)
        except RuntimeError as e:
            if kind != "attention":
                add("contract", False, _why(e))
                return out
            add("contract", None, f"not available here: {e}")
        except Exception as e:  # noqa: BLE001
            add("contract", False, _why(e))
            return out
        else:
            add("contract", True, f"the {kind} contract holds")
    if kind not in RUN_KINDS:
        add("engine runs", None, f"none for {kind} plugins (the checks above only)")
        return out
    if kind == "router":
        return _cluster_runs(cls, options, seeds, add, out)
    steps = preemptions = runs = 0
    for setting in SETTINGS:
        for seed in seeds:
            try:
                report = run_engine(engine_config(kind, cls, options, setting), seed)
            except Exception as e:  # noqa: BLE001
                add("engine runs", False, f"under {setting.name}, seed {seed}: {_why(e)}")
                return out
            runs += 1
            steps += report.num_steps
            preemptions += report.num_preemptions
    add("engine runs", True, f"{runs} runs, {steps} steps, {preemptions} preemptions: every plan "
        "in limits, KV consistent, outputs as without scheduling")
    return out


def _cluster_runs(cls: type, options: dict[str, Any] | None, seeds: tuple[int, ...], add,
                  out: list[CheckResult]) -> list[CheckResult]:
    """A router's runs: a checked cluster of three engines per seed."""
    steps = 0
    for seed in seeds:
        try:
            steps += run_cluster(cls, options, seed).num_steps
        except Exception as e:  # noqa: BLE001
            add("cluster runs", False, f"3 instances, seed {seed}: {_why(e)}")
            return out
    add("cluster runs", True, f"{len(seeds)} runs of 3 instances, {steps} steps: every request "
        "routed to an instance in range and finished, outputs as without scheduling")
    return out
