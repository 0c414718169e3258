"""`schedlab serve` and `schedlab bench serve`: Hydra-composed exactly as `schedlab run` (the same
conf/ groups and overrides, `build_settings`), plus `--options` of their own."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import hydra
from omegaconf import DictConfig

from schedlab.cli.app import CONFIG_PACKAGE, FAILURES, seed_everything, user_errors
from schedlab.cli.config_keys import PLUGIN_GROUPS
from schedlab.cli.settings import RunSettings, build_settings
from schedlab.config import ConfigError

SERVE_USAGE = """\
usage: schedlab serve [--host H] [--port P] [--max-waiting N] [--drain-timeout S]
                      [--served-model-name NAME [NAME ...]] [--max-request-bytes B]
                      [--api-key KEY] [--log-level L] [overrides]

An OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, /tokenize,
/detokenize, /version, /health, /metrics) over the engine that `schedlab run [overrides]`
would build: any scheduler, queue, KV allocator, prefix cache, attention backend and executor
(executor=sim answers in real time on the simulated clock, with words of its tokenizer).

options:
  --host H                 address to bind (default 127.0.0.1: this machine only)
  --port P                 TCP port (default 8000; 0: a free one)
  --max-waiting N          answer 503 while N requests wait in the engine's queue
                           (default: no limit)
  --drain-timeout S        after SIGINT/SIGTERM, seconds in-flight requests get to finish
                           (default 30)
  --served-model-name NAME [NAME ...]
                           the `model` names clients may send (default: the directory of
                           the model's tokenizer, which clients can load, as vLLM's path)
  --max-request-bytes B    the largest request body (413 beyond; default: room for a
                           max_model_len prompt, at least 1 MiB)
  --api-key KEY            require `Authorization: Bearer KEY` (default: $SCHEDLAB_API_KEY;
                           /health, /metrics and /version stay open)
  --log-level L            uvicorn's log level (default info)

examples:
  schedlab serve
  schedlab serve --port 8001 scheduler=chunked_prefill prefix_cache=hash_block
  schedlab serve executor=sim model=llama3_8b hardware=h100
"""

BENCH_USAGE = """\
usage: schedlab bench serve --base-url URL [--model NAME] [--vocab-size N]
                            [--timeout S] [--api-key KEY] [overrides]

Replay a workload (the `workload=` group and its keys, `seed`, `sampling.*`,
`driver.max_concurrency`, `metrics.*`) against any OpenAI-compatible server over HTTP with
streaming; writes results.json (vLLM's keys) and plots as `schedlab run` does. Prompts are
token ids drawn for the vocabulary of `model=` (or --vocab-size).

options:
  --base-url URL   the server, e.g. http://127.0.0.1:8000
  --model NAME     the `model` to send (default: the first of the server's /v1/models)
  --vocab-size N   token ids in [2, N) (default: the vocabulary of the `model=` config)
  --timeout S      per-request timeout in seconds (default 600)
  --api-key KEY    sent as `Authorization: Bearer KEY`, for a server run with --api-key
                   (default: $SCHEDLAB_API_KEY)

examples:
  schedlab bench serve --base-url http://127.0.0.1:8000
  schedlab bench serve --base-url http://127.0.0.1:8000 workload.num_requests=200 \\
      workload.arrival.process=poisson workload.arrival.rate=8
"""


@dataclass(frozen=True, slots=True)
class _BenchArgs:
    base_url: str
    model: str | None
    vocab_size: int | None
    timeout_s: float
    api_key: str | None


def serve_main(argv: Sequence[str]) -> int:
    """`schedlab serve [--options] [overrides]`. Returns the exit status (0 after a drain)."""
    from schedlab.serve.server import ServerOptions

    ap = _parser("schedlab serve")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-waiting", type=int, default=None)
    ap.add_argument("--drain-timeout", type=float, default=30.0)
    ap.add_argument("--served-model-name", nargs="+", default=None)
    ap.add_argument("--max-request-bytes", type=int, default=None)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--log-level", default="info",
                    choices=["critical", "error", "warning", "info", "debug", "trace"])
    parsed = _parse(ap, argv, SERVE_USAGE)
    if isinstance(parsed, int):
        return parsed
    ns, overrides = parsed
    if ns.max_waiting is not None and ns.max_waiting < 0:
        return _usage_error("schedlab serve", "--max-waiting must be >= 0", SERVE_USAGE)
    if not 0 <= ns.port <= 65535:
        return _usage_error("schedlab serve", f"--port {ns.port} is not a TCP port",
                            SERVE_USAGE)
    if not ns.drain_timeout >= 0:  # NOTE: NaN too
        return _usage_error("schedlab serve", "--drain-timeout must be >= 0 (seconds)",
                            SERVE_USAGE)
    if ns.max_request_bytes is not None and ns.max_request_bytes <= 0:
        return _usage_error("schedlab serve", "--max-request-bytes must be > 0", SERVE_USAGE)
    key = ns.api_key if ns.api_key is not None else os.environ.get("SCHEDLAB_API_KEY") or None
    opts = ServerOptions(host=ns.host, port=ns.port,
                         model_names=tuple(ns.served_model_name or ()),
                         max_waiting=ns.max_waiting, drain_timeout=ns.drain_timeout,
                         log_level=ns.log_level, max_request_bytes=ns.max_request_bytes,
                         api_key=key)
    return _hydra(_serve_task, "schedlab serve", overrides, opts)


def bench_main(argv: Sequence[str]) -> int:
    """`schedlab bench serve --base-url URL [overrides]`."""
    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(BENCH_USAGE, end="")
        return 0 if args else 2
    if args[0] != "serve":
        return _usage_error("schedlab bench", f"unknown benchmark {args[0]!r}; benchmarks: "
                            "serve", BENCH_USAGE)
    ap = _parser("schedlab bench serve")
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--vocab-size", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--api-key", default=None)
    parsed = _parse(ap, args[1:], BENCH_USAGE)
    if isinstance(parsed, int):
        return parsed
    ns, overrides = parsed
    if not ns.base_url.startswith(("http://", "https://")):
        return _usage_error("schedlab bench serve", f"--base-url {ns.base_url!r} must start "
                            "with http:// or https://", BENCH_USAGE)
    if not any(o.split("=", 1)[0].lstrip("+~") == "executor" for o in overrides):
        # NOTE: no engine is built here; sim accepts every model config (a preset included)
        overrides = [*overrides, "executor=sim"]
    key = ns.api_key if ns.api_key is not None else os.environ.get("SCHEDLAB_API_KEY") or None
    return _hydra(_bench_task, "schedlab bench serve", overrides,
                  _BenchArgs(ns.base_url, ns.model, ns.vocab_size, ns.timeout, key))


# ---- argument handling ---------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # raise instead of exiting the interpreter
        raise ValueError(message)


def _parser(prog: str) -> argparse.ArgumentParser:
    return _Parser(prog=prog, add_help=False, allow_abbrev=False)


def _parse(ap: argparse.ArgumentParser, argv: Sequence[str], usage: str):
    args = list(argv)
    if any(a in ("-h", "--help") for a in args):
        print(usage, end="")
        return 0
    if any(a in ("-m", "--multirun") for a in args):
        return _usage_error(ap.prog, "-m (a sweep) is not supported here; start one server "
                            "per configuration", usage)
    try:
        ns, rest = ap.parse_known_args(args)
    except ValueError as e:
        return _usage_error(ap.prog, str(e), usage)
    unknown = [a for a in rest if a.startswith("--") and a not in ("--cfg", "--resolve",
                                                                   "--info", "--package")]
    if unknown:
        return _usage_error(ap.prog, f"unknown option {unknown[0]}", usage)
    return ns, rest


def _usage_error(prog: str, message: str, usage: str) -> int:
    print(f"{prog}: error: {message}\n\n{usage}", file=sys.stderr, end="")
    return 2


def _hydra(task, prog: str, overrides: list[str], options: Any) -> int:
    from schedlab.cli.checks import prepare_overrides

    prepared = prepare_overrides(overrides)
    if prepared is None:
        return 2
    @hydra.main(version_base="1.3", config_path=CONFIG_PACKAGE, config_name="config")
    def job(cfg: DictConfig) -> None:
        task(cfg, options)

    FAILURES.clear()
    saved = sys.argv
    sys.argv = [prog, *prepared]
    try:
        job()
    finally:
        sys.argv = saved
    return 2 if FAILURES else 0


def _report(e: Exception) -> None:
    msg = str(e).strip()
    FAILURES.append(msg)
    print(f"schedlab: error: {msg}", file=sys.stderr)


def _cluster_name(s: RunSettings) -> str:
    """The `cluster` group's choice as the command line names it (e.g. `replicas`)."""
    node = s.config.get("cluster")
    name = node.get("name") if isinstance(node, dict) else None
    return str(name) if name else "<a cluster>"


# ---- the Hydra task functions --------------------------------------------------------------
def _serve_task(cfg: DictConfig, opts) -> None:
    """One Hydra job of `schedlab serve`: build the engine, serve until drained."""
    from schedlab.serve.server import Server

    try:
        s = build_settings(cfg)
        if s.workers != 1:
            raise ConfigError(f"driver.workers={s.workers} is for `schedlab run` (a simulated "
                              "cluster split over processes); `schedlab serve` runs one engine "
                              "in this process: drop the key")
        if s.cluster is not None:
            raise ConfigError(f"cluster={_cluster_name(s)} is for `schedlab run` (a cluster of "
                              "engines on one timeline); `schedlab serve` serves one engine: use "
                              "cluster=single, or one server per instance behind a router of "
                              "your own")
        seed_everything(s.seed)
        s.model.prepare()
        try:
            server = Server(s.engine, replace(opts, plugin_timeout_s=s.plugin_timeout_s))
        except (ValueError, OSError, RuntimeError) as e:
            if isinstance(e, user_errors()):
                raise
            raise ConfigError(f"the engine could not be built from this config: {e}") from None
    except user_errors() as e:
        _report(e)
        return
    ec = s.engine
    names = ", ".join(map(repr, server.model_names))
    print(f"schedlab serve: model {names} ({s.model.name}), scheduler={ec.scheduler} "
          f"queue={ec.queue} kv_allocator={ec.kv_allocator} prefix_cache={ec.prefix_cache} "
          f"executor={ec.executor}; http://{opts.host}:{opts.port}  (Ctrl-C drains and exits)",
          flush=True)
    server.run()


def _bench_task(cfg: DictConfig, args: _BenchArgs) -> None:
    """One Hydra job of `schedlab bench serve`."""
    from schedlab.serve.bench import BenchError

    errors: tuple[type[Exception], ...] = (*user_errors(), BenchError)
    try:
        _bench(build_settings(cfg), args)
    except errors as e:
        _report(e)


def _bench(s: RunSettings, a: _BenchArgs) -> None:
    import logging

    from schedlab.runs.metrics import compute_metrics
    from schedlab.runs.results import collect_environment, format_table, write_results
    from schedlab.runs.workload import build_workload
    from schedlab.serve.bench import (
        BenchError,
        BenchOptions,
        client_metrics,
        failure_summary,
        run_bench,
        served_model,
    )

    if not s.save_detailed:
        raise ConfigError("driver.save_detailed=false is for `schedlab run` (a simulated or "
                          "real engine in this process); `schedlab bench serve` keeps every "
                          "request's record: drop the key")
    if s.workers != 1:
        raise ConfigError(f"driver.workers={s.workers} is for `schedlab run` (a simulated "
                          "cluster split over processes); `schedlab bench serve` measures a "
                          "server over HTTP: drop the key")
    if s.cluster is not None:
        raise ConfigError(f"cluster={_cluster_name(s)} is for `schedlab run` (a cluster of "
                          "engines on one timeline); `schedlab bench serve` measures the server "
                          "at --base-url, whatever runs behind it: drop the key")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    vocab = a.vocab_size
    if vocab is None:
        from schedlab.sim.model_presets import resolve_model

        s.model.prepare()
        try:
            vocab = resolve_model(s.engine.model).spec.vocab_size
        except ValueError as e:
            raise ConfigError(f"cannot tell the vocabulary size: {e}; pass --vocab-size") from None
    seed_everything(s.seed)
    workload = build_workload(s.workload, vocab, seed=s.seed)
    model = a.model or served_model(a.base_url, api_key=a.api_key)
    opts = BenchOptions(base_url=a.base_url, model=model, temperature=s.temperature,
                        ignore_eos=s.ignore_eos, max_concurrency=s.max_concurrency,
                        timeout_s=a.timeout_s, progress=s.progress, api_key=a.api_key)
    result = run_bench(workload, opts)
    metrics = client_metrics(result, compute_metrics(result, percentiles=s.percentiles,
                                                     slo=s.slo))
    metrics["base_url"] = a.base_url
    metrics["model_id"] = model
    # NOTE: the engine and plugin groups describe no server here; the record keeps the rest
    config = {k: v for k, v in s.config.items()
              if k not in (*PLUGIN_GROUPS, "engine", "hardware", "cluster", "router")}
    config["bench"] = {"base_url": a.base_url, "model": model, "vocab_size": vocab,
                       "endpoint": "/v1/completions"}
    path = write_results(s.output_dir, metrics, config, collect_environment())
    if s.plots:
        from schedlab.runs.plots import write_plots

        write_plots(s.output_dir, result, metrics)
    if s.print_table:
        print(format_table(metrics))
    print(f"results: {path}")
    failed = failure_summary(result)
    if failed is not None:  # NOTE: the results are written; the exit status says they are partial
        raise BenchError(failed)
