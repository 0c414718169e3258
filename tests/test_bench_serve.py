"""`schedlab bench serve`: a workload replayed over HTTP against a running `schedlab serve`,
written as the same results.json (vLLM's keys) and plots as `schedlab run`."""

from __future__ import annotations

import json

import pytest

from schedlab.cli import main
from schedlab.config import EngineConfig
from schedlab.runs.workload import build_workload
from schedlab.serve.server import Server, ServerOptions


@pytest.fixture(scope="module")
def server(llama_dir):
    cfg = EngineConfig(model=llama_dir, num_kv_blocks=256)
    with Server(cfg, ServerOptions(port=0, model_names=("tiny",), log_level="warning")) as s:
        yield s


def _bench(server, llama_dir, tmp_path, *extra: str) -> tuple[int, dict]:
    run_dir = tmp_path / "run"
    rc = main(["bench", "serve", "--base-url", server.base_url, "model=path",
               f"model.path={llama_dir}", "logger=none", "driver.progress=false",
               "print_table=false", f"hydra.run.dir={run_dir}", *extra])
    path = run_dir / "results.json"
    return rc, (json.loads(path.read_text()) if path.is_file() else {})


def test_bench_writes_run_shaped_results(server, llama_dir, tmp_path):
    spec = ["workload.num_requests=10", "workload.input_len.min=8", "workload.input_len.max=40",
            "workload.output_len.min=2", "workload.output_len.max=9",
            "workload.arrival.process=poisson", "workload.arrival.rate=40", "seed=3"]
    rc, res = _bench(server, llama_dir, tmp_path, *spec)
    assert rc == 0
    # the same requests `schedlab run` would build from this spec and seed
    wl = build_workload({"type": "synthetic", "num_requests": 10,
                         "input_len": {"dist": "uniform", "min": 8, "max": 40},
                         "output_len": {"dist": "uniform", "min": 2, "max": 9},
                         "arrival": {"process": "poisson", "rate": 40}}, 512, seed=3)
    assert res["completed"] == 10 and res["num_rejected"] == 0
    assert res["total_input_tokens"] == sum(len(w.prompt_token_ids) for w in wl)
    assert res["total_output_tokens"] == sum(w.max_tokens for w in wl)
    assert sorted(res["output_lens"]) == sorted(w.max_tokens for w in wl)
    # a streamed chunk per token: one inter-token gap fewer than tokens, per request
    assert [len(g) for g in res["itls"]] == [n - 1 for n in res["output_lens"]]
    for key in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "median_e2el_ms",
                "request_throughput", "output_throughput", "total_token_throughput"):
        assert res[key] > 0, key
    assert "mean_queue_ms" not in res and "num_preemptions" not in res  # engine-only
    assert res["config"]["bench"]["base_url"] == server.base_url
    assert "scheduler" not in res["config"]
    assert (tmp_path / "run" / "plots" / "latency_cdf.png").is_file()


def test_refused_requests_are_counted_and_the_exit_status_says_so(server, llama_dir, tmp_path,
                                                                    capsys):
    rc, res = _bench(server, llama_dir, tmp_path, "--vocab-size", "100000",
                     "workload.num_requests=3", "workload.input_len.min=30", "plots=false")
    assert rc != 0
    assert res["completed"] == 0 and res["num_rejected"] == 3 and res["num_failed"] == 0  # disjoint
    assert all("outside the vocabulary" in e for e in res["errors"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("schedlab: error: 3 of 3 requests failed: HTTP 400: prompt token id "
                          "N is outside")


def test_fixed_lengths_as_documented(server, llama_dir, tmp_path):
    rc, res = _bench(server, llama_dir, tmp_path, "workload.num_requests=4",
                     "workload.output_len.dist=fixed", "+workload.output_len.value=6",
                     "workload.input_len.dist=fixed", "+workload.input_len.value=200",
                     "plots=false")
    assert rc == 0, res
    assert res["output_lens"] == [6] * 4 and res["total_input_tokens"] == 800


def test_unreachable_server_is_one_error_line(llama_dir, tmp_path, capsys):
    rc = main(["bench", "serve", "--base-url", "http://127.0.0.1:9", "model=path",
               f"model.path={llama_dir}", "logger=none", f"hydra.run.dir={tmp_path / 'r'}"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("schedlab: error: cannot list the models at http://127.0.0.1:9")


def test_bench_needs_a_base_url(capsys):
    assert main(["bench", "serve", "workload.num_requests=2"]) == 2
    assert "--base-url" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["driver.save_detailed=false", "driver.workers=2",
                                 "cluster=replicas", "cluster=disaggregated"])
def test_bench_refuses_schedlab_run_keys_with_one_line(tmp_path, capsys, key):
    """The streaming mode, a split run and a cluster are `schedlab run`'s: refused, never
    ignored (nor recorded as the server's)."""
    rc = main(["bench", "serve", "--base-url", "http://127.0.0.1:9", "--vocab-size", "1000",
               key, "logger=none", f"hydra.run.dir={tmp_path / 'r'}"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"schedlab: error: {key} is for `schedlab run`")


def test_run_and_bench_serve_give_each_request_the_same_outcome(server, llama_dir):
    """The tiny torch model, greedy with EOS honoured: the engine of `schedlab run` and `serve`
    + `bench serve` give every request the same output tokens and finish reason, and reject
    the same ones (a prompt over max_model_len, an empty one, a token outside the vocabulary,
    an output that cannot fit)."""
    from schedlab.engine import Engine
    from schedlab.request import RequestStatus
    from schedlab.runs.driver import run_workload
    from schedlab.serve.bench import BenchOptions, run_bench

    wl = build_workload({"type": "synthetic", "num_requests": 12,
                         "input_len": {"dist": "uniform", "min": 4, "max": 40},
                         "output_len": {"dist": "uniform", "min": 2, "max": 30},
                         "arrival": {"process": "poisson", "rate": 50}}, 512, seed=2)
    wl[3].prompt_token_ids = list(range(2, 600))
    wl[5].prompt_token_ids = []
    wl[7].prompt_token_ids = [5, 600]
    wl[8].max_tokens = 600
    ran = run_workload(Engine(EngineConfig(model=llama_dir, num_kv_blocks=256)), wl,
                       ignore_eos=False)
    benched = run_bench(wl, BenchOptions(base_url=server.base_url, model="tiny",
                                         ignore_eos=False))

    def outcomes(run) -> list[tuple]:
        return [(r.status, r.finish_reason, r.output_token_ids) for r in run.requests]

    assert outcomes(benched) == outcomes(ran)
    assert [i for i, r in enumerate(ran.requests)
            if r.status is RequestStatus.REJECTED] == [3, 5, 7, 8]


def test_bench_sends_the_api_key_a_server_requires(tmp_path, monkeypatch):
    """`serve --api-key` and `bench serve` work together: the key from --api-key or, as serve
    reads it, $SCHEDLAB_API_KEY (kept out of results.json)."""
    cfg = EngineConfig(model="llama3_8b", executor="sim", executor_options={"hardware": "h100"},
                       max_model_len=2048)
    opts = ServerOptions(port=0, model_names=("sim",), log_level="warning", api_key="s3cret")
    with Server(cfg, opts) as s:
        def bench(name: str, *extra: str) -> tuple[int, dict]:
            rc = main(["bench", "serve", "--base-url", s.base_url, *extra, "model=llama3_8b",
                       "logger=none", "driver.progress=false", "print_table=false",
                       "plots=false", "workload.num_requests=3",
                       f"hydra.run.dir={tmp_path / name}"])
            return rc, json.loads((tmp_path / name / "results.json").read_text())

        rc, res = bench("flag", "--api-key", "s3cret")
        assert rc == 0 and res["completed"] == 3
        monkeypatch.setenv("SCHEDLAB_API_KEY", "s3cret")
        rc, res = bench("env")
        assert rc == 0 and res["completed"] == 3
        assert "s3cret" not in (tmp_path / "env" / "results.json").read_text()
