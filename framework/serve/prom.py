"""Prometheus metrics of a server, named after vLLM's `vllm:` metrics under `schedlab:`.

Load (running / waiting requests, KV usage, prefix-cache hits, preemptions) is read from the
engine loop's last counters at scrape time; latencies (TTFT, ITL, E2E, queue time) are observed
on the engine clock as each request finishes. Each server has its own registry, so several can
live in one process (tests).
"""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from schedlab.serve.events import FinishedRequest
from schedlab.serve.loop import EngineLoop

PREFIX = "schedlab:"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's buckets, with millisecond ones added below for small models
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
               40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class _LoadCollector(Collector):
    """Gauges and counters from the engine's counters, read when scraped."""

    def __init__(self, loop: EngineLoop, model_name: str) -> None:
        self.loop = loop
        self.labels = {"model_name": model_name}

    def collect(self):
        c = self.loop.counters
        names = list(self.labels)
        values = list(self.labels.values())

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(PREFIX + name, doc, labels=names)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            m = CounterMetricFamily(PREFIX + name, doc, labels=names)
            m.add_metric(values, value)
            return m

        queried = c.num_prefix_query_tokens
        yield gauge("num_requests_running", "Requests in the running batch.", c.num_running)
        yield gauge("num_requests_waiting", "Requests waiting to be scheduled.", c.num_waiting)
        yield gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).",
                    c.kv_usage)
        yield gauge("prefix_cache_hit_rate",
                    "Prompt tokens served from the prefix cache / tokens looked up (cumulative).",
                    c.num_prefix_hit_tokens / queried if queried else 0.0)
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      queried)
        yield counter("prefix_cache_hits", "Prompt tokens served from the prefix cache.",
                      c.num_prefix_hit_tokens)
        yield counter("num_preemptions", "Preemptions (recompute and swap).", c.num_preemptions)
        yield gauge("num_requests_in_flight", "Requests accepted by the server and not finished.",
                    self.loop.num_active)


class ServerMetrics:
    """The server's Prometheus registry. `observe` is called on the engine thread."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name"]
        r = self.registry
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds",
                              "Time to first token (arrival to first token).", labels,
                              registry=r, buckets=TTFT_BUCKETS)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds",
                             "Time between consecutive output tokens.", labels, registry=r,
                             buckets=ITL_BUCKETS)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds",
                             "Arrival to finish of a request.", labels, registry=r,
                             buckets=E2E_BUCKETS)
        self.queue = Histogram(PREFIX + "request_queue_time_seconds",
                               "Arrival to first scheduled.", labels, registry=r,
                               buckets=TTFT_BUCKETS)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens of finished "
                                     "requests.", labels, registry=r)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Output tokens of "
                                         "finished requests.", labels, registry=r)
        self.success = Counter(PREFIX + "request_success", "Finished requests by reason.",
                               [*labels, "finished_reason"], registry=r)
        self.errors = Counter(PREFIX + "request_errors", "Requests answered with an error (or "
                              "failed mid-stream), by HTTP status.", [*labels, "status"],
                              registry=r)

    def watch(self, loop: EngineLoop) -> None:
        """Report the loop's load gauges (once). Changes state."""
        self.registry.register(_LoadCollector(loop, self.model_name))

    def observe(self, f: FinishedRequest) -> None:
        """Record one finished request (latencies on the engine clock). Changes state."""
        m, name = f.request.metrics, self.model_name
        self.success.labels(name, f.finish_reason).inc()
        self.prompt_tokens.labels(name).inc(f.request.num_prompt_tokens)
        self.generation_tokens.labels(name).inc(f.num_output_tokens)
        if m.first_scheduled_time is not None:
            self.queue.labels(name).observe(m.first_scheduled_time - m.arrival_time)
        if m.first_token_time is None:
            return
        self.ttft.labels(name).observe(m.first_token_time - m.arrival_time)
        if m.finished_time is not None:
            self.e2e.labels(name).observe(m.finished_time - m.arrival_time)
        itl = self.itl.labels(name)
        for gap in np.diff(m.token_times[:f.num_output_tokens]):
            itl.observe(float(gap))

    def count_error(self, status: int) -> None:
        """Count one error answer (any thread). Changes state."""
        self.errors.labels(self.model_name, str(status)).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
