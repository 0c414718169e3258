"""One bad client never hurts another: while a long stream runs, bad requests of every kind
(wrong types, out-of-range sampling fields, NaN, a lone surrogate, a 50 MB body, a prompt far
over the limit, requests failing inside a step, a client that goes away) are answered or
failed on their own, and the stream finishes with all its tokens and no stall."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import httpx
import pytest

from schedlab.config import EngineConfig
from schedlab.serve.server import Server, ServerOptions

MODEL = "tiny"
LONG = 480
#: the logit_bias that the planted sampler fault recognises
POISON = {"3": 0.125}


@pytest.fixture()
def server(llama_dir, monkeypatch):
    import schedlab.sampler as sampler

    shape = sampler._shape_row

    def faulty(x, r):  # a fault inside the step, for the poisoned request only
        shape(x, r)
        if r.sampling_params.logit_bias == {3: 0.125}:
            x.fill_(float("nan"))

    monkeypatch.setattr(sampler, "_shape_row", faulty)
    from schedlab.plugins.executors.torch_executor import TorchExecutor

    execute = TorchExecutor.execute

    def broken(self, plan):  # a fault no request is named in, with the poisoned one in the step
        if any(sr.request.prompt_token_ids[:4] == [9, 9, 9, 9] for sr in plan.scheduled):
            raise RuntimeError("planted")
        return execute(self, plan)

    monkeypatch.setattr(TorchExecutor, "execute", broken)
    cfg = EngineConfig(model=llama_dir, num_kv_blocks=256)
    with Server(cfg, ServerOptions(port=0, model_names=(MODEL,), log_level="warning")) as s:
        yield s


def _long_stream(url: str, out: dict) -> None:
    body = {"model": MODEL, "prompt": [3, 4, 5], "max_tokens": LONG, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    times, finish, usage = [], None, None
    with httpx.Client(timeout=120) as h, h.stream("POST", url + "/v1/completions",
                                                  json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk["choices"]:
                times.append(time.monotonic())
                finish = c["finish_reason"] or finish
            if len(times) == 1:
                out["started"].set()
    out.update(times=times, finish=finish, usage=usage)


def _raw_post(port: int, head: str, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + payload)
        return sock.recv(4096)


P = {"model": MODEL, "prompt": [1, 2], "max_tokens": 2}
BAD_BODIES = [
    ({**P, "seed": 18446744073709551616}, 400), ({**P, "temperature": 1e-45}, 400),
    ({**P, "max_tokens": True}, 400), ({**P, "stream": "yes"}, 400),
    ({**P, "max_tokens": "5"}, 400), ({**P, "frequency_penalty": -9}, 400),
    ({**P, "model": "nope"}, 404), ({"model": MODEL, "prompt": list(range(2, 500)) * 200}, 400),
]


def _metric(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_bad_requests_do_not_touch_a_running_stream(server):
    url = server.base_url
    free0 = server.loop.call(lambda e: e.counters().kv_free_blocks).result(10)
    out: dict = {"started": threading.Event()}
    t = threading.Thread(target=_long_stream, args=(url, out))
    t.start()
    assert out["started"].wait(60)
    with httpx.Client(timeout=60) as h:
        for body, status in BAD_BODIES:
            r = h.post(url + "/v1/completions", json=body)
            assert r.status_code == status, (body, r.text)
        for raw in (b'{"prompt": "a\\ud800b"}', b'{"prompt": [1], "top_p": NaN}'):
            r = h.post(url + "/v1/completions", content=raw,
                       headers={"content-type": "application/json"})
            assert r.status_code == 400, r.text
        # a text prompt just under the body limit: tokenized off the event loop, then refused
        big = "the quick brown fox " * (server.max_request_bytes // 21)
        r = h.post(url + "/v1/completions", json={"model": MODEL, "prompt": big})
        assert r.status_code == 400 and "max_model_len" in r.text
        # failing inside a step (the sampler finds no finite distribution): this one only
        r = h.post(url + "/v1/completions", json={**P, "temperature": 1.0,
                                                   "logit_bias": POISON})
        assert r.status_code == 500 and "not finite" in r.json()["error"]["message"]
        # a fault that names no request: blamed on the request new to the failing step
        r = h.post(url + "/v1/completions", json={**P, "prompt": [9, 9, 9, 9]})
        assert r.status_code == 500 and "engine failed" in r.json()["error"]["message"]
        # a non-streamed request whose client leaves is aborted, not run to the end
        with pytest.raises(httpx.TimeoutException):
            h.post(url + "/v1/completions", timeout=0.5, json={
                "model": MODEL, "prompt": [7, 8], "max_tokens": 400, "ignore_eos": True})
    # a declared 50 MB body is refused before it is read
    head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {50 << 20}\r\n\r\n")
    assert _raw_post(server.port, head, b"[" * 65536).startswith(b"HTTP/1.1 413")
    t.join(120)
    assert out["finish"] == "length" and out["usage"]["completion_tokens"] == LONG
    assert len(out["times"]) == LONG
    gaps = [b - a for a, b in zip(out["times"], out["times"][1:], strict=False)]
    assert max(gaps) < 1.0  # NOTE: a generous bound; a stall of the engine shows as seconds
    deadline = time.monotonic() + 20
    while server.loop.num_active and time.monotonic() < deadline:
        time.sleep(0.05)
    text = httpx.get(url + "/metrics").text
    assert _metric(text, "schedlab:num_requests_running") == 0
    assert _metric(text, "schedlab:num_requests_in_flight") == 0
    assert _metric(text, "schedlab:request_errors_total", status="400") == 10
    assert _metric(text, "schedlab:request_errors_total", status="404") == 1
    assert _metric(text, "schedlab:request_errors_total", status="413") == 1
    assert _metric(text, "schedlab:request_errors_total", status="500") == 2
    assert _metric(text, "schedlab:request_success_total", finished_reason="abort") == 1
    assert server.loop.call(lambda e: e.counters().kv_free_blocks).result(10) == free0
    server.loop.call(lambda e: e.check_integrity()).result(10)


def test_a_body_sent_in_chunks_is_cut_off_at_the_limit(llama_dir):
    cfg = EngineConfig(model=llama_dir, num_kv_blocks=64)
    opts = ServerOptions(port=0, model_names=(MODEL,), log_level="warning",
                         max_request_bytes=4096)
    with Server(cfg, opts) as s:
        def chunks():
            for _ in range(64):
                yield b" " * 1024

        r = httpx.post(s.base_url + "/v1/completions", content=chunks(),
                       headers={"content-type": "application/json"})
        assert r.status_code == 413 and "4096" in r.json()["error"]["message"]
        ok = httpx.post(s.base_url + "/v1/completions", json=P)
        assert ok.status_code == 200
        assert re.search(r'request_errors_total\{model_name="tiny",status="413"\} 1\.0',
                         httpx.get(s.base_url + "/metrics").text)


def test_a_plugin_that_raises_on_add_or_abort_fails_that_request_only(monkeypatch):
    """A queue that raises taking one client's request, and a scheduler that raises aborting
    another's (its client went away): each is one failed request and a logged trace; the
    engine thread lives, a stream running meanwhile ends with all its tokens, and later
    requests are served."""
    cfg = EngineConfig(model="llama3_8b", executor="sim", executor_options={"hardware": "h100"},
                       max_model_len=2048)
    with Server(cfg, ServerOptions(port=0, model_names=(MODEL,), log_level="warning")) as s:
        sched = s.engine.scheduler
        add, abort = sched.waiting.add, sched.abort
        planted: list[str] = []

        def faulty_add(request):
            if request.client_id == "bad-add":
                planted.append("add")
                raise RuntimeError("planted in add")
            return add(request)

        def faulty_abort(request, now):
            if request.client_id == "bad-abort":
                planted.append("abort")
                raise RuntimeError("planted in abort")
            return abort(request, now)

        monkeypatch.setattr(sched.waiting, "add", faulty_add)
        monkeypatch.setattr(sched, "abort", faulty_abort)
        url = s.base_url + "/v1/completions"
        out: dict = {"started": threading.Event()}
        t = threading.Thread(target=_long_stream, args=(s.base_url, out))
        t.start()
        assert out["started"].wait(60)
        with httpx.Client(timeout=20) as h:
            r = h.post(url, json={**P, "user": "bad-add"})
            assert r.status_code == 500 and "failed to take the request" in r.text
            body = {**P, "max_tokens": 400, "ignore_eos": True, "stream": True,
                    "user": "bad-abort"}
            with h.stream("POST", url, json=body) as r:
                next(r.iter_lines())  # one chunk, then the client goes away
        t.join(120)
        assert out["finish"] == "length" and out["usage"]["completion_tokens"] == LONG
        assert planted == ["add", "abort"] and s.loop._thread.is_alive()
        ok = httpx.post(url, json=P, timeout=20)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


@pytest.mark.timeout(120)
def test_a_plugin_call_past_the_timeout_fails_the_requests_in_flight_and_serving_goes_on(
        monkeypatch):
    """A scheduler that loops in its third schedule(): past `plugin_timeout_s` the request in
    flight ends with an error naming the plugin, the method and the line; the engine thread
    lives and the next request is served."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures" / "broken_plugins"))
    cfg = EngineConfig(model="llama3_8b", executor="sim", executor_options={"hardware": "h100"},
                       max_model_len=2048, scheduler="looping_scheduler:LoopingScheduler")
    opts = ServerOptions(port=0, model_names=(MODEL,), log_level="warning",
                         plugin_timeout_s=0.5)
    with Server(cfg, opts) as s:
        url = s.base_url + "/v1/completions"
        body = {**P, "max_tokens": 8, "ignore_eos": True}
        t0 = time.monotonic()
        r = httpx.post(url, json=body, timeout=60)
        assert time.monotonic() - t0 < 20  # the planted loop runs 30 s
        assert r.status_code == 500, r.text
        msg = r.json()["error"]["message"]
        assert msg.startswith("the engine failed: scheduler "
                              "'looping_scheduler:LoopingScheduler' did not return from "
                              "schedule() in "), msg
        assert msg.endswith("; the requests in flight failed (driver.plugin_timeout_s=0.5; "
                            "null waits)")
        assert s.loop._thread.is_alive()
        ok = httpx.post(url, json=body, timeout=60)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 8
