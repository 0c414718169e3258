"""`schedlab serve`: the OpenAI-compatible server, driven by the official `openai` client and raw
HTTP, on a free loopback port. Servers run in a daemon thread and drain when a test ends."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")

from schedlab.config import EngineConfig  # noqa: E402
from schedlab.serve.server import Server, ServerOptions  # noqa: E402
from schedlab.serve.text import TextStream  # noqa: E402

MODEL = "tiny"


def _server(model_dir: str, **kw) -> Server:
    opts = {k: kw.pop(k) for k in ("max_waiting", "drain_timeout") if k in kw}
    cfg = EngineConfig(model=model_dir, num_kv_blocks=kw.pop("num_kv_blocks", 256), **kw)
    return Server(cfg, ServerOptions(port=0, model_names=(MODEL,), log_level="warning", **opts))


@pytest.fixture(scope="module")
def server(llama_dir):
    with _server(llama_dir) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def llm(llama_dir):
    from schedlab.llm import LLM

    return LLM(llama_dir, num_kv_blocks=256)


def _stream_text(stream) -> tuple[str, str | None, object]:
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.text if hasattr(c, "text") else (c.delta.content or "")
            finish = c.finish_reason or finish
    return text, finish, usage


def _wait(cond, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


# ---- completions ----------------------------------------------------------------------------
def test_streamed_greedy_text_equals_llm_generate(client, llm):
    from schedlab.request import SamplingParams

    prompts = [[5, 17, 99, 3, 250], [42] * 9, list(range(10, 40))]
    ref = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    for prompt, out in zip(prompts, ref, strict=True):
        stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12,
                                           temperature=0, stream=True,
                                           stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True})
        text, finish, usage = _stream_text(stream)
        assert text == out.outputs[0].text
        assert finish == "length"
        assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt), 12)


def test_completion_from_text_not_streamed(client, llm):
    from schedlab.request import SamplingParams

    prompt = "The scheduler admits"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                  extra_body={"ignore_eos": True})
    ref = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    assert r.choices[0].text == ref.outputs[0].text
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert r.usage.completion_tokens == 6 and r.usage.total_tokens == r.usage.prompt_tokens + 6


def test_stop_token_id_ends_the_request(client, llm):
    from schedlab.request import SamplingParams

    prompt = [9, 8, 7]
    ids = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8,
                                                ignore_eos=True))[0].outputs[0].token_ids
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True, "stop_token_ids": [ids[2]]})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == ids.index(ids[2]) + 1
    with pytest.raises(openai.BadRequestError, match="stop_token_ids"):
        client.completions.create(model=MODEL, prompt=[9], max_tokens=2,
                                  extra_body={"stop_token_ids": "x"})


def test_seeded_sampling_repeats(client):
    kw = dict(model=MODEL, prompt=[7, 8, 9], max_tokens=10, temperature=0.9, top_p=0.9,
              seed=1234, extra_body={"top_k": 50, "ignore_eos": True})
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    assert a == b


def test_stop_string_ends_the_text_before_it(client):
    prompt = [11, 22, 33, 44]
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = full[8:11]
    assert len(stop) == 3
    expected = full[:full.find(stop)]
    for stream in (False, True):
        r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0,
                                      stop=[stop], stream=stream,
                                      extra_body={"ignore_eos": True})
        if stream:
            text, finish, _ = _stream_text(r)
        else:
            text, finish = r.choices[0].text, r.choices[0].finish_reason
        assert (text, finish) == (expected, "stop")


def test_text_stream_stop_across_tokens():
    class Chars:  # one character per token id
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids)

    s = TextStream(Chars(), stop=["STOP"])
    sent = "".join(s.add([ord(c)]).text for c in "abcST")
    d = s.add([ord("O")])
    assert not d.stopped and "S" not in sent + d.text  # a possible stop start is held back
    sent += d.text
    d = s.add([ord("P")])
    assert d.stopped and sent + d.text == "abc"


# ---- chat -----------------------------------------------------------------------------------
def test_chat_without_template_is_a_clear_400(llama_dir, tmp_path):
    d = tmp_path / "no-template"
    shutil.copytree(llama_dir, d)
    (d / "chat_template.jinja").unlink()
    with _server(str(d)) as s:
        r = httpx.post(s.base_url + "/v1/chat/completions",
                       json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400
    assert "chat template" in r.json()["error"]["message"]


def test_chat_streamed_and_not(server, client):
    c = client  # NOTE: the tiny tokenizer ships a chat template
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    tok = server.tokenizer
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert r.usage.prompt_tokens == len(tok.encode(prompt, add_special_tokens=False))
    stream = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=5,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    text, finish, usage = _stream_text(stream)
    assert text == r.choices[0].message.content
    assert finish == "length" and usage.completion_tokens == 5


def test_null_is_the_default_wherever_openai_allows_it(client):
    """The SDK sends `null` for a parameter given as None (`n`, `stream`, `echo`, ... are
    nullable in OpenAI's API): taken as the default, on both endpoints."""
    nulls = dict(n=None, stream=None, stop=None, seed=None, temperature=None, top_p=None,
                 presence_penalty=None, frequency_penalty=None, logit_bias=None, logprobs=None,
                 stream_options=None, user=None)
    r = client.completions.create(model=MODEL, prompt=[5, 6], max_tokens=2, echo=None,
                                  best_of=None, suffix=None, extra_body={"ignore_eos": True},
                                  **nulls)
    assert r.usage.completion_tokens == 2 and r.choices[0].finish_reason == "length"
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2, max_completion_tokens=None,
                                       extra_body={"ignore_eos": True}, **nulls)
    assert r.usage.completion_tokens == 2 and r.choices[0].finish_reason == "length"


# ---- errors ---------------------------------------------------------------------------------
P = {"model": MODEL, "prompt": [1, 2]}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
#: (case, endpoint, body, status, what the message names)
BAD = [
    ("invalid JSON", "completions", b"{not json", 400, "JSON"),
    ("lone surrogate", "completions", b'{"prompt": "a\\ud800b"}', 400, "JSON"),
    ("NaN", "completions", b'{"prompt": [1], "temperature": NaN}', 400, "temperature"),
    ("infinity", "completions", b'{"prompt": [1], "top_p": 1e999}', 400, "top_p"),
    ("wrong type", "completions", {**P, "max_tokens": "many"}, 400, "max_tokens"),
    ("max_tokens true", "completions", {**P, "max_tokens": True}, 400, "max_tokens"),
    ("max_tokens string", "completions", {**P, "max_tokens": "5"}, 400, "max_tokens"),
    ("stream yes", "completions", {**P, "stream": "yes"}, 400, "stream"),
    ("max_tokens 0", "completions", {**P, "max_tokens": 0}, 400, "max_tokens"),
    ("seed beyond 64 bits", "completions", {**P, "seed": 2**64}, 400, "seed"),
    ("temperature underflow", "completions", {**P, "temperature": 1e-45}, 400, "temperature"),
    ("too long", "completions", {"model": MODEL, "prompt": [5] * 600, "max_tokens": 4}, 400,
     "max_model_len"),
    ("outside vocab", "completions", {"model": MODEL, "prompt": [1, 512], "max_tokens": 4},
     400, "vocabulary"),
    ("logit_bias outside vocab", "completions", {**P, "logit_bias": {"9999": 5}}, 400,
     "logit_bias"),
    ("min_tokens over max", "completions", {**P, "max_tokens": 2, "min_tokens": 3}, 400,
     "min_tokens"),
    ("presence_penalty range", "completions", {**P, "presence_penalty": 3}, 400,
     "presence_penalty"),
    ("stream_options unstreamed", "completions", {**P, "stream_options": {
        "include_usage": True}}, 400, "stream_options"),
    ("unknown model", "completions", {"model": "gpt-9", "prompt": [1, 2]}, 404, "gpt-9"),
    ("n=2", "completions", {**P, "n": 2}, 400, "n=2"),
    ("no prompt", "completions", {"model": MODEL}, 400, "prompt"),
    ("tools", "chat/completions", {**CHAT, "tools": [{"type": "function", "function": {
        "name": "f"}}]}, 400, "tools"),
    ("response_format", "chat/completions", {**CHAT, "response_format": {
        "type": "json_object"}}, 400, "response_format"),
    ("completions tools", "completions", {**P, "tools": [{"type": "function", "function": {
        "name": "f"}}]}, 400, "tools"),
    ("completions response_format", "completions", {**P, "response_format": {
        "type": "json_schema", "json_schema": {}}}, 400, "response_format"),
    ("logprobs 0", "completions", {**P, "logprobs": 0}, 400, "logprobs"),
    ("top_logprobs", "chat/completions", {**CHAT, "top_logprobs": 2}, 400, "top_logprobs"),
    ("functions", "chat/completions", {**CHAT, "functions": [{"name": "f"}]}, 400,
     "functions"),
    ("min_p", "completions", {**P, "min_p": 0.1}, 400, "min_p"),
    ("chat min_p", "chat/completions", {**CHAT, "min_p": 0.1}, 400, "min_p"),
    ("include_stop_str_in_output", "chat/completions", {
        **CHAT, "stop": ["x"], "include_stop_str_in_output": True}, 400,
     "include_stop_str_in_output"),
    ("add_generation_prompt false", "chat/completions", {
        **CHAT, "add_generation_prompt": False}, 400, "add_generation_prompt"),
    ("completions max_completion_tokens", "completions", {**P, "max_completion_tokens": 4},
     400, "max_completion_tokens"),
    ("max_completion_tokens 0", "chat/completions", {**CHAT, "max_completion_tokens": 0}, 400,
     "max_completion_tokens"),
]


@pytest.mark.parametrize("endpoint,body,status,needle", [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])
def test_bad_input_is_an_openai_error_and_the_server_goes_on(server, endpoint, body, status,
                                                             needle):
    url = f"{server.base_url}/v1/{endpoint}"
    if isinstance(body, bytes):
        r = httpx.post(url, content=body, headers={"content-type": "application/json"})
    else:
        r = httpx.post(url, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"], err
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    ok = httpx.post(server.base_url + "/v1/completions",
                    json={"model": MODEL, "prompt": [1, 2], "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_fields_not_honoured_are_taken_at_their_defaults(client):
    """vLLM's extras that schedlab does not implement are refused only when they would change
    the output: their default values (as a vLLM client may send them) are taken."""
    defaults = {"ignore_eos": True, "min_p": 0.0, "skip_special_tokens": True,
                "include_stop_str_in_output": False, "use_beam_search": False, "bad_words": [],
                "metadata": {"run": "a"}}
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       max_completion_tokens=2, top_logprobs=0,
                                       extra_body=defaults)
    assert r.usage.completion_tokens == 2


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        client.completions.create(model=MODEL, prompt=[100000], max_tokens=2)


# ---- concurrency, disconnects, load limits --------------------------------------------------
def test_64_concurrent_streams_all_complete(server):
    async def main():
        c = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)

        async def one(i: int):
            stream = await c.completions.create(
                model=MODEL, prompt=[3 + i, 4, 5 + i % 7], max_tokens=4 + i % 5, temperature=0,
                stream=True, stream_options={"include_usage": True},
                extra_body={"ignore_eos": True})
            chunks, usage, finish = 0, None, None
            async for ch in stream:
                usage = ch.usage or usage
                for choice in ch.choices:
                    chunks += 1
                    finish = choice.finish_reason or finish
            return i, chunks, usage.completion_tokens, finish

        try:
            return await asyncio.gather(*(one(i) for i in range(64)))
        finally:
            await c.close()

    results = asyncio.run(main())
    assert len(results) == 64
    for i, chunks, n, finish in results:
        assert (chunks, n, finish) == (4 + i % 5, 4 + i % 5, "length")
    assert _wait(lambda: server.loop.num_active == 0)


def _engine(server, fn):
    return server.loop.call(fn).result(timeout=20)


def _num_aborted(server) -> float:
    text = httpx.get(server.base_url + "/metrics").text
    m = re.search(r'schedlab:request_success_total\{finished_reason="abort",'
                  r'model_name="tiny"\} (\S+)', text)
    return float(m.group(1)) if m else 0.0


def test_client_disconnect_aborts_and_frees_kv(server):
    free0 = _engine(server, lambda e: e.counters().kv_free_blocks)
    aborted0 = _num_aborted(server)
    body = {"model": MODEL, "prompt": list(range(2, 100)), "max_tokens": 400,
            "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.Client(timeout=30) as h, h.stream("POST", server.base_url + "/v1/completions",
                                                 json=body) as r:
        assert r.status_code == 200
        chunks = 0
        for line in r.iter_lines():
            chunks += line.startswith("data:")
            if chunks == 2:
                break  # leaving the block closes the connection mid-stream
    assert _wait(lambda: server.loop.num_active == 0)
    _engine(server, lambda e: e.check_integrity())
    assert _engine(server, lambda e: e.counters().kv_free_blocks) == free0
    assert _num_aborted(server) == aborted0 + 1  # cut short, not run to max_tokens


@pytest.fixture()
def one_seat_server():
    # NOTE: the simulated executor, paced at 0.2 s a step: a long request keeps its seat
    cfg = EngineConfig(model="llama3_8b", executor="sim", max_num_seqs=1, max_model_len=2048,
                       executor_options={"hardware": {"preset": "h100", "step_overhead": 0.2}})
    with Server(cfg, ServerOptions(port=0, model_names=(MODEL,), log_level="warning",
                                   max_waiting=1)) as s:
        yield s


def test_over_max_waiting_is_503(one_seat_server):
    s = one_seat_server
    url = s.base_url + "/v1/completions"
    long = {"model": MODEL, "prompt": [4, 5, 6], "max_tokens": 1000, "stream": True}
    with httpx.Client(timeout=30) as h, h.stream("POST", url, json=long) as a:
        assert a.status_code == 200
        with h.stream("POST", url, json=long) as b:
            assert b.status_code == 200
            c = s.loop.counters
            assert _wait(lambda: (s.loop.counters.num_running, s.loop.counters.num_waiting)
                         == (1, 1)), c
            r = httpx.post(url, json={"model": MODEL, "prompt": [1], "max_tokens": 1})
            assert r.status_code == 503
            assert "max_waiting=1" in r.json()["error"]["message"]
    assert _wait(lambda: s.loop.num_active == 0)
    r = httpx.post(url, json={"model": MODEL, "prompt": [1], "max_tokens": 1})
    assert r.status_code == 200


# ---- models, health, metrics ----------------------------------------------------------------
def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.base_url + "/health").status_code == 200
    client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=3)
    r = httpx.get(server.base_url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in ("schedlab:num_requests_running", "schedlab:num_requests_waiting",
                 "schedlab:kv_cache_usage_perc", "schedlab:prefix_cache_hit_rate",
                 "schedlab:num_preemptions_total", "schedlab:time_to_first_token_seconds_count",
                 "schedlab:inter_token_latency_seconds_count",
                 "schedlab:e2e_request_latency_seconds_count"):
        assert re.search(rf"^{re.escape(name)}\{{", text, re.M), name
    ttft = re.search(r'^schedlab:time_to_first_token_seconds_count\{model_name="tiny"\} (\S+)',
                     text, re.M)
    assert float(ttft.group(1)) >= 1


# ---- the simulated executor -----------------------------------------------------------------
def test_sim_executor_serves_words_that_retokenize_one_to_one():
    from schedlab.tokenizer import TINY_TOKENIZER

    cfg = EngineConfig(model="llama3_8b", executor="sim", executor_options={"hardware": "h100"},
                       max_model_len=2048)
    with Server(cfg, ServerOptions(port=0, log_level="warning")) as s:
        name = s.model_names[0]
        assert name.endswith(TINY_TOKENIZER)  # served under the tokenizer clients can load
        url = s.base_url + "/v1/completions"
        r = httpx.post(url, json={"model": name, "prompt": "The scheduler decides",
                                  "max_tokens": 12})
        assert r.status_code == 200, r.text
        body = r.json()
        text = body["choices"][0]["text"]
        assert body["usage"]["completion_tokens"] == 12 and text.strip()
        tok = s.tokenizer
        assert len(tok.encode(text, add_special_tokens=False)) == 12
        assert body["usage"]["prompt_tokens"] == len(tok.encode("The scheduler decides",
                                                                add_special_tokens=False))
        r = httpx.post(s.base_url + "/v1/chat/completions", json={
            "model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


# ---- draining: SIGTERM / SIGINT ------------------------------------------------------------
def _stream_events(url: str, body: dict, on_first) -> list[dict]:
    events: list[dict] = []
    with httpx.Client(timeout=60) as h, h.stream("POST", url + "/v1/completions",
                                                 json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            events.append(json.loads(line[5:]))
            if len(events) == 1:
                on_first()
    return events


@pytest.mark.parametrize("drain_timeout,max_tokens,finish", [(30.0, 40, "length"),
                                                             (0.05, 480, "abort")])
def test_drain_finishes_or_aborts_in_flight_then_stops(llama_dir, drain_timeout, max_tokens,
                                                       finish):
    s = _server(llama_dir, drain_timeout=drain_timeout).start_in_thread()
    try:
        def signal_then_check_refused():
            s.uvicorn.handle_exit(signal.SIGTERM, None)  # what the signal handler calls
            assert _wait(lambda: _refused(s.base_url), timeout=10)

        body = {"model": MODEL, "prompt": [3, 4, 5], "max_tokens": max_tokens,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        events = _stream_events(s.base_url, body, signal_then_check_refused)
        s._thread.join(30)
        assert not s._thread.is_alive()
    finally:
        s.stop()
    finishes = [c["choices"][0]["finish_reason"] for c in events if c["choices"]]
    assert finishes[-1] == finish and finishes.count(finish) == 1
    # a chunk per token; an abort adds a last chunk with no token
    num_tokens = len(finishes) - (finish == "abort")
    assert events[-1]["usage"]["completion_tokens"] == num_tokens
    assert (num_tokens == max_tokens) == (finish == "length")


# ---- the command: SIGTERM / SIGINT drain ----------------------------------------------------
def test_command_line_errors_are_one_line(capsys):
    from schedlab.cli import main

    assert main(["serve", "--help"]) == 0
    assert "--max-waiting" in capsys.readouterr().out
    assert main(["serve", "--port", "http"]) == 2
    assert "--port" in capsys.readouterr().err
    assert main(["serve", "--drain-timeout", "-5"]) == 2
    assert "--drain-timeout must be >= 0" in capsys.readouterr().err
    assert main(["serve", "scheduler=nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("schedlab: error: scheduler='nope'") and "continuous" in err
    for key in ("driver.workers=2", "cluster=replicas", "cluster=disaggregated"):
        assert main(["serve", key]) == 2  # a `schedlab run` key, never ignored
        assert capsys.readouterr().err.startswith(f"schedlab: error: {key} is for `schedlab run`")


def _start_cli(llama_dir: str, tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "schedlab.cli", "serve", "--port", "0", *args, "model=path",
           f"model.path={llama_dir}", "engine.num_kv_blocks=128", "logger=none",
           f"hydra.run.dir={tmp_path / 'run'}"]
    p = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    port: list[str] = []

    def read():
        for line in p.stdout:
            lines.append(line)
            m = re.search(r"running on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port.append(m.group(1))

    threading.Thread(target=read, daemon=True).start()
    if not _wait(lambda: port or p.poll() is not None, timeout=120):
        p.kill()
    if not port:
        p.kill()
        pytest.fail("the server did not start:\n" + "".join(lines))
    p.lines = lines  # type: ignore[attr-defined]
    return p, f"http://127.0.0.1:{port[0]}"


@pytest.mark.slow
@pytest.mark.parametrize("sig,drain_timeout,max_tokens,finish", [
    (signal.SIGTERM, "30", 40, "length"), (signal.SIGINT, "0.05", 480, "abort")])
def test_signal_drains_the_command_and_exits_0(llama_dir, tmp_path, sig, drain_timeout,
                                               max_tokens, finish):
    p, url = _start_cli(llama_dir, tmp_path, "--drain-timeout", drain_timeout)
    try:
        def signal_then_check_refused():
            p.send_signal(sig)
            assert _wait(lambda: _refused(url), timeout=10)

        body = {"model": llama_dir, "prompt": [3, 4, 5], "max_tokens": max_tokens,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        events = _stream_events(url, body, signal_then_check_refused)
        assert p.wait(timeout=60) == 0, "".join(p.lines)
    finally:
        if p.poll() is None:
            p.kill()
    finishes = [c["choices"][0]["finish_reason"] for c in events if c["choices"]]
    assert finishes[-1] == finish
    assert events[-1]["usage"]["completion_tokens"] == len(finishes) - (finish == "abort")


def _refused(url: str) -> bool:
    try:
        r = httpx.post(url + "/v1/completions", json={"prompt": [1], "max_tokens": 1},
                       timeout=5)
    except httpx.TransportError:
        return True
    return r.status_code == 503
