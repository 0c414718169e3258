"""The `schedlab` command: run (Hydra), report, compare, calibrate, validate, plugins.

This package is the only place under `framework/` that imports Hydra or omegaconf, and it
imports them only when `schedlab run` needs them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

USAGE = """\
usage: schedlab <command> [args]

commands:
  run [overrides]     run one configuration, or a sweep with -m (Hydra); --help lists the groups
  report <dir>        tables and plots from results.json files under <dir>
  compare <dir> --by <param>   paired differences over seeds, with bootstrap intervals
  calibrate [args]    fit the simulated executor's cost model to measured steps
  validate [args]     compare the simulated executor with the real one
  serve [overrides]   an OpenAI-compatible HTTP server over the configured engine (--port ...)
  bench serve --base-url URL [overrides]   replay a workload against an OpenAI-compatible server
  plugins [--check]   list the installed plugins per interface; --check [KIND=NAME ...] runs
                      the plugin checks (contracts, checked engine runs) on them

examples:
  schedlab run
  schedlab run scheduler=static engine.max_num_seqs=8 workload.num_requests=100
  schedlab run -m scheduler=static,continuous kv_allocator=paged,contiguous
  schedlab run executor=sim model=llama3_8b hardware=h100
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `schedlab` console script. Returns the exit status (130 after
    Ctrl-C, as a shell reports SIGINT; what was written so far is kept)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        saved = sys.modules.get("schedlab.cli.app")
        what = getattr(saved, "INTERRUPTED", None)
        print("schedlab: interrupted" + (f": {what[-1]}" if what else ""), file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if args else 2
    cmd, rest = args[0], args[1:]
    if cmd == "run":
        return run_command(rest)
    if cmd == "plugins":
        return plugins_command(rest)
    if cmd in ("serve", "bench"):
        from schedlab.cli import serve

        return serve.serve_main(rest) if cmd == "serve" else serve.bench_main(rest)
    if cmd in DELEGATES:
        return _delegate(cmd, rest)
    print(f"schedlab: unknown command {cmd!r}; commands: run, {', '.join(DELEGATES)}, "
          f"plugins, serve, bench\n\n{USAGE}", file=sys.stderr, end="")
    return 2


def run_command(overrides: Sequence[str]) -> int:
    """`schedlab run [overrides]`: hand the overrides to Hydra (single run or -m sweep)."""
    from schedlab.cli.checks import prepare_overrides

    prepared = prepare_overrides(overrides)
    if prepared is None:
        return 2
    from schedlab.cli import app

    app.FAILURES.clear()
    app.INTERRUPTED.clear()
    saved = sys.argv
    sys.argv = ["schedlab run", *prepared]
    try:
        app.hydra_main()
    finally:
        sys.argv = saved
    if app.FAILURES:
        if len(app.FAILURES) > 1:
            print(f"schedlab: {len(app.FAILURES)} jobs failed", file=sys.stderr)
        return 2
    return 0


def plugins_command(args: Sequence[str]) -> int:
    """`schedlab plugins [--check [KIND=NAME ...]]`: list the installed plugins (nothing
    imported), or check them (see `schedlab.cli.plugins`)."""
    from schedlab.cli import plugins

    return plugins.main(args)


#: subcommand -> (module, what it is) ; each module has main(argv) -> int
DELEGATES = {
    "report": ("schedlab.runs.report", "the report"),
    "compare": ("schedlab.cli.compare", "the paired comparison"),
    "calibrate": ("schedlab.calibration.calibrate", "the cost-model calibration"),
    "validate": ("schedlab.calibration.validate", "the simulator validation"),
}


def _delegate(cmd: str, args: list[str]) -> int:
    module, what = DELEGATES[cmd]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        print(f"schedlab {cmd}: {what} is not available in this installation "
              f"({module} is missing)", file=sys.stderr)
        return 2
    return int(mod.main(args) or 0)
