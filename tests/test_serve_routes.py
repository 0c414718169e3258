"""`schedlab serve` as the clients built for vLLM expect it: served names, the API key, the
routes vLLM has (HEAD probes, a model card, tokenize / detokenize, version), vLLM's sampling
extras over HTTP, and a second signal that exits at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")

from schedlab.config import EngineConfig  # noqa: E402
from schedlab.serve.server import Server, ServerOptions  # noqa: E402


@pytest.fixture(scope="module")
def server(llama_dir):
    cfg = EngineConfig(model=llama_dir, num_kv_blocks=128)
    with Server(cfg, ServerOptions(port=0, log_level="warning")) as s:
        yield s


def test_served_under_the_model_path_clients_load_the_tokenizer_from(server, llama_dir):
    from transformers import AutoTokenizer

    c = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
    [card] = c.models.list().data
    assert card.id == llama_dir
    assert c.models.retrieve(llama_dir).id == llama_dir
    tok = AutoTokenizer.from_pretrained(card.id)  # what aiperf / guidellm do with the name
    r = c.chat.completions.create(model=card.id, messages=[{"role": "user", "content": "hi"}],
                                  max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}],
                                     add_generation_prompt=True, tokenize=False)
    assert r.usage.prompt_tokens == len(tok.encode(prompt, add_special_tokens=False))
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("gpt-9")


def test_probes_tokenize_detokenize_and_version(server):
    u = server.base_url
    assert httpx.head(u + "/health").status_code == 200
    assert httpx.head(u + "/metrics").status_code == 200
    assert httpx.get(u + "/version").json()["version"]
    t = httpx.post(u + "/tokenize", json={"prompt": "The quick brown fox"}).json()
    assert t["count"] == len(t["tokens"]) > 0 and t["max_model_len"] == server.engine.max_model_len
    back = httpx.post(u + "/detokenize", json={"tokens": t["tokens"]}).json()
    assert back["prompt"] == "The quick brown fox"
    chat = httpx.post(u + "/tokenize", json={"messages": [{"role": "user", "content": "x"}]})
    assert chat.json()["count"] > t["count"] - 4
    assert httpx.post(u + "/detokenize", json={"tokens": [10**6]}).status_code == 400


def _greedy(server, **extra) -> dict:
    r = httpx.post(server.base_url + "/v1/completions", json={
        "prompt": [5, 17, 99, 3], "max_tokens": 12, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_min_tokens_and_logit_bias_over_http(server):
    force = {"logit_bias": {"300": 100}, "stop_token_ids": [300]}  # token 300 first, a stop id
    assert _greedy(server, **force)["usage"]["completion_tokens"] == 1
    held = _greedy(server, **force, min_tokens=5)  # held back for 5 tokens, then it stops
    assert held["usage"]["completion_tokens"] == 6
    forced = _greedy(server, logit_bias={"300": 100}, ignore_eos=True)
    assert forced["choices"][0]["text"] == httpx.post(
        server.base_url + "/detokenize", json={"tokens": [300] * 12}).json()["prompt"]
    plain = _greedy(server, ignore_eos=True)["choices"][0]["text"]
    damped = _greedy(server, ignore_eos=True, frequency_penalty=2.0, repetition_penalty=1.5)
    assert damped["choices"][0]["text"] != plain


def test_continuous_usage_stats_counts_every_chunk(server):
    body = {"prompt": [4, 5], "max_tokens": 4, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    counts = [c["usage"]["completion_tokens"] for c in chunks if c["choices"]]
    assert counts == [1, 2, 3, 4] and chunks[-1]["usage"]["completion_tokens"] == 4


def test_api_key_and_several_names(llama_dir, caplog):
    cfg = EngineConfig(model=llama_dir, num_kv_blocks=64)
    opts = ServerOptions(host="0.0.0.0", port=0, log_level="warning", api_key="s3cret",
                         model_names=("a", "b/c"))
    with caplog.at_level("WARNING", "schedlab.serve"):
        Server(cfg, ServerOptions(host="0.0.0.0", port=0, log_level="warning"))
    assert [r.getMessage() for r in caplog.records if "without an API key" in r.getMessage()]
    with Server(cfg, opts) as s:
        u = f"http://127.0.0.1:{s.port}"
        body = {"model": "b/c", "prompt": [1, 2], "max_tokens": 2}
        assert httpx.post(u + "/v1/completions", json=body).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert httpx.get(u + "/v1/models", headers=wrong).status_code == 401
        assert httpx.get(u + "/health").status_code == 200
        assert httpx.get(u + "/metrics").status_code == 200
        ok = httpx.post(u + "/v1/completions", json=body,
                        headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["model"] == "a"
        names = httpx.get(u + "/v1/models", headers={"Authorization": "Bearer s3cret"}).json()
        assert [m["id"] for m in names["data"]] == ["a", "b/c"]


@pytest.mark.slow
def test_second_signal_exits_at_once_without_tracebacks(tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    # NOTE: the simulated H100 paces each stream over ~a minute, so all are in flight
    cmd = [sys.executable, "-m", "schedlab.cli", "serve", "--port", "0", "executor=sim",
           "model=llama3_8b", "hardware=h100", "logger=none",
           f"hydra.run.dir={tmp_path / 'run'}"]
    p = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    port = threading.Event()
    url: list[str] = []

    def read():
        for line in p.stdout:
            lines.append(line)
            if "running on http://127.0.0.1:" in line:
                url.append(line.split("running on ")[1].split()[0])
                port.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert port.wait(120), "".join(lines)
        streams = []
        body = {"prompt": [3, 4], "max_tokens": 6000, "ignore_eos": True, "stream": True}
        for _ in range(4):
            h = httpx.Client(timeout=60)
            r = h.send(h.build_request("POST", url[0] + "/v1/completions", json=body),
                       stream=True)
            lines_in = r.iter_lines()
            next(lines_in)
            streams.append((h, r, lines_in))  # NOTE: a dropped iterator closes its stream
        p.send_signal(signal.SIGTERM)
        time.sleep(0.3)  # NOTE: two signals close together arrive as one
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=15) == -signal.SIGTERM, "".join(lines)
    finally:
        if p.poll() is None:
            p.kill()
    out = "".join(lines)
    assert "Traceback" not in out and "CancelledError" not in out
    assert "second signal" in out


def test_request_metadata_reaches_the_engine(server, monkeypatch):
    engine = server.engine
    seen = []
    add = engine.add_request

    def recording_add(*args, **kwargs):
        req = add(*args, **kwargs)
        seen.append((req.client_id, req.priority, req.deadline_ms, req.slo_class,
                     req.expected_output_len))
        return req

    monkeypatch.setattr(engine, "add_request", recording_add)
    body = {"prompt": [4, 5], "max_tokens": 4, "ignore_eos": True, "user": "alice",
            "priority": -3, "deadline_ms": 500, "slo_class": "interactive",
            "expected_output_len": 3}
    assert httpx.post(server.base_url + "/v1/completions", json=body).status_code == 200
    assert seen == [("alice", -3, 500.0, "interactive", 3)]
    for field, value in (("priority", "high"), ("expected_output_len", -1)):
        bad = httpx.post(server.base_url + "/v1/completions",
                         json={"prompt": [1], field: value})
        assert bad.status_code == 400 and field in bad.json()["error"]["message"]
