"""`schedlab plugins [--check [KIND=NAME ...]]`: list the installed plugins, or check them."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from schedlab import registry

USAGE = """\
usage: schedlab plugins                      list the installed plugins per interface
       schedlab plugins --check              check every installed plugin
       schedlab plugins --check KIND=NAME..  check some, e.g. scheduler=my_policy or
                                             queue=my_module:MyQueue (a class on a dotted path)
"""

_MARK = {True: "ok  ", False: "FAIL", None: "skip"}


def main(args: Sequence[str]) -> int:
    """Returns the exit status: 0, 1 when a check failed, 2 on bad arguments."""
    args = list(args)
    if args and args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    if not args:
        return list_plugins()
    if args[0] != "--check":
        print(f"schedlab plugins: unknown argument {args[0]!r}\n{USAGE}", file=sys.stderr, end="")
        return 2
    from schedlab.testing.checks import all_targets, parse_target

    try:
        targets = [parse_target(a) for a in args[1:]] or all_targets()
    except ValueError as e:
        print(f"schedlab plugins: {e}", file=sys.stderr)
        return 2
    return check(targets, clashes=not args[1:])


def list_plugins() -> int:
    """Every interface's declared plugins, without importing them; a name declared twice is
    listed with each of its entry points and flagged."""
    for kind, group in registry.all_groups().items():
        print(f"{kind} ({group}):")
        clashing = registry.clashes(kind)
        for e in registry.entries(kind):
            flag = "  CLASH: name declared twice, cannot load" if e.name in clashing else ""
            print(f"  {e.name:<16} {e.value}  [{e.dist}]{flag}")
    return 0


def check(targets: list[tuple[str, str]], clashes: bool = False) -> int:
    """Run `check_plugin` on each target and print one line per check."""
    from schedlab.testing.checks import check_plugin

    failed = num_clashes = 0
    if clashes:
        for kind in registry.all_groups():
            for name, es in registry.clashes(kind).items():
                num_clashes += 1
                print(f"{kind} {name!r}\n  FAIL  load: declared by "
                      + " and ".join(f"{e.value} ({e.dist})" for e in es))
        targets = [(k, n) for k, n in targets if n not in registry.clashes(k)]
    for kind, name in targets:
        results = check_plugin(kind, name)
        print(f"{kind} {registry.describe(name)}")
        for r in results:
            print(f"  {_MARK[r.ok]}  {r.check}: {r.message}")
        failed += any(r.ok is False for r in results)
    total, failed = len(targets) + num_clashes, failed + num_clashes
    print(f"{total} plugin{'s' if total != 1 else ''} checked: {total - failed} passed, "
          f"{failed} failed")
    return 1 if failed else 0
