"""Prometheus metrics with vLLM's names, on a registry owned by the server instance.

Runs in the frontend process. Per-request figures (TTFT, TPOT, end-to-end latency, token counts, prefix
cache hits) are observed as streams finish; engine state (running, waiting, KV usage) is read from the
scheduler by a health ping at scrape time.
"""
from __future__ import annotations

import time
from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)


class FrontendMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled", labels, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use", labels, registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token", labels,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Time per output token after the first",
                              labels, buckets=_TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency", labels,
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed", labels, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated", labels, registry=r)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      labels, registry=r)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache", labels,
                                   registry=r)
        self.requests = Counter("vllm:request_success", "Finished requests by finish reason",
                                labels + ["finished_reason"], registry=r)
        self.model_name = model_name

    def request_timer(self) -> "RequestTimer":
        return RequestTimer(self)

    def render(self, running: int, waiting: int, kv_usage: float) -> bytes:
        name = self.model_name
        self.running.labels(name).set(running)
        self.waiting.labels(name).set(waiting)
        self.kv_usage.labels(name).set(kv_usage)
        return generate_latest(self.registry)


class RequestTimer:
    """Times one request's stream and records it when it ends."""

    def __init__(self, metrics: FrontendMetrics) -> None:
        self.m = metrics
        self.start = time.perf_counter()
        self.first: Optional[float] = None

    def token(self) -> None:
        if self.first is None:
            self.first = time.perf_counter()
            self.m.ttft.labels(self.m.model_name).observe(self.first - self.start)

    def finish(self, prompt_tokens: int, output_tokens: int, cached_tokens: int, reasons: list[str]) -> None:
        end = time.perf_counter()
        name = self.m.model_name
        self.m.e2e.labels(name).observe(end - self.start)
        if self.first is not None and output_tokens > 1:
            self.m.tpot.labels(name).observe((end - self.first) / (output_tokens - 1))
        self.m.prompt_tokens.labels(name).inc(prompt_tokens)
        self.m.generation_tokens.labels(name).inc(output_tokens)
        self.m.prefix_queries.labels(name).inc(prompt_tokens)
        self.m.prefix_hits.labels(name).inc(cached_tokens)
        for reason in reasons:
            self.m.requests.labels(name, reason or "abort").inc()
