"""Prometheus metrics with vLLM's names and labels (``model_name``, ``engine``), on a registry owned by
the server instance.

Runs in the frontend process. Per-request figures are observed as streams go: time to first token, the
gap before each later token (inter-token latency), and when a request ends its end-to-end latency, time
per output token, token counts, prefix cache hits, finish reason, and the engine's own split of its time
(queued, prefill, decode, inference: RequestOutput.metrics). Engine state (running, waiting, KV usage,
preemptions, tokens per step) is read from the scheduler by a health ping at scrape time.
"""
from __future__ import annotations

import time
from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from actorserve.runtime.engine.outputs import RequestOutput
from actorserve.runtime.engine.stats import ITERATION_TOKEN_BUCKETS

# vLLM's buckets
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0)
ENGINE = "0"  # one engine per server (vLLM numbers its data-parallel engines)
# The request token histograms are made before the engine (and its context length) is known: their
# buckets reach past any context
_MAX_TOKEN_BUCKET = 1 << 20


def _token_buckets(top: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to ``top``, as vLLM's request token histograms."""
    buckets, power = [], 1
    while True:
        for m in (1, 2, 5):
            if m * power > top:
                return buckets
            buckets.append(float(m * power))
        power *= 10


class FrontendMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = r = CollectorRegistry()
        self.model_name = model_name
        labels = ["model_name", "engine"]
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled", labels, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use", labels, registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token", labels,
                              buckets=_TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "The gap before each token after the first",
                             labels, buckets=_ITL_BUCKETS, registry=r)
        self.tpot = Histogram("vllm:time_per_output_token_seconds",
                              "Per request: time per output token after the first", labels,
                              buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency", labels,
                             buckets=_REQUEST_BUCKETS, registry=r)
        self.phases = {phase: Histogram(f"vllm:request_{phase}_time_seconds", f"Time a request spent in {phase}"
                                        if phase != "queue" else "Time a request waited for its first step",
                                        labels, buckets=_REQUEST_BUCKETS, registry=r)
                       for phase in ("queue", "prefill", "decode", "inference")}
        tokens = _token_buckets(_MAX_TOKEN_BUCKET)
        self.request_prompt = Histogram("vllm:request_prompt_tokens", "Prompt tokens of each request", labels,
                                        buckets=tokens, registry=r)
        self.request_generation = Histogram("vllm:request_generation_tokens", "Tokens generated for each request",
                                            labels, buckets=tokens, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed", labels, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated", labels, registry=r)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      labels, registry=r)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache", labels,
                                   registry=r)
        self.requests = Counter("vllm:request_success", "Finished requests by finish reason",
                                labels + ["finished_reason"], registry=r)
        self.cache_info = Gauge("vllm:cache_config_info", "The KV cache's configuration",
                                ["block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_dtype", "engine"],
                                registry=r)
        self.replica_up = Gauge("actorserve:engine_replica_up", "1 while a data-parallel replica serves, 0 once "
                                "it died", ["model_name", "engine"], registry=r)
        self._engine = _EngineCollector(model_name)
        r.register(self._engine)

    def set_replicas(self, replicas: list[dict]) -> None:
        """Each engine replica's state (``replica_states``), labelled by its rank."""
        for replica in replicas:
            self.replica_up.labels(self.model_name, str(replica["rank"])).set(1 if replica["alive"] else 0)

    def labels(self, metric, *extra):
        return metric.labels(self.model_name, ENGINE, *extra)

    def set_cache_config(self, block_size: int, num_blocks: int, prefix_caching: bool, dtype: str) -> None:
        self.cache_info.labels(str(block_size), str(num_blocks), str(prefix_caching), dtype, ENGINE).set(1)

    def request_timer(self) -> "RequestTimer":
        return RequestTimer(self)

    def render(self, pong=None) -> bytes:
        """The page, with the engine's state from a health pong (None: the engine is gone: zeros)."""
        self.labels(self.running).set(pong.num_running if pong is not None else 0)
        self.labels(self.waiting).set(pong.num_waiting if pong is not None else 0)
        self.labels(self.kv_usage).set(pong.kv_cache_usage if pong is not None else 0.0)
        if pong is not None:
            self._engine.pong = pong
        return generate_latest(self.registry)


class _EngineCollector:
    """The scheduler's own counts, as of the last health pong: preemptions, tokens per step, and
    speculative decoding's drafts."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.pong = None

    def collect(self):
        labels = [self.model_name, ENGINE]
        preemptions = CounterMetricFamily("vllm:num_preemptions", "Requests preempted (recomputed later)",
                                          labels=["model_name", "engine"])
        preemptions.add_metric(labels, self.pong.num_preemptions if self.pong is not None else 0)
        yield preemptions
        steps = HistogramMetricFamily("vllm:iteration_tokens_total", "Tokens in each engine step",
                                      labels=["model_name", "engine"])
        counts = list(self.pong.step_token_counts) if self.pong is not None else []
        counts += [0] * (len(ITERATION_TOKEN_BUCKETS) + 1 - len(counts))
        cumulative, running = [], 0
        for bound, count in zip([*map(str, ITERATION_TOKEN_BUCKETS), "+Inf"], counts):
            running += count
            cumulative.append((bound, running))
        steps.add_metric(labels, cumulative, self.pong.step_token_sum if self.pong is not None else 0)
        yield steps
        if self.pong is not None and self.pong.spec_accepted_per_pos:  # speculative decoding is on
            for name, value, text in (
                    ("num_drafts", self.pong.spec_num_drafts, "Steps that verified draft tokens"),
                    ("num_draft_tokens", self.pong.spec_num_draft_tokens, "Draft tokens proposed"),
                    ("num_accepted_tokens", self.pong.spec_num_accepted_tokens, "Draft tokens accepted")):
                family = CounterMetricFamily(f"vllm:spec_decode_{name}", text, labels=["model_name", "engine"])
                family.add_metric(labels, value)
                yield family
            per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                          "Draft tokens accepted at each position",
                                          labels=["model_name", "engine", "position"])
            for position, value in enumerate(self.pong.spec_accepted_per_pos):
                per_pos.add_metric(labels + [str(position)], value)
            yield per_pos


class RequestTimer:
    """Times one request's stream and records it when it ends."""

    def __init__(self, metrics: FrontendMetrics) -> None:
        self.m = metrics
        self.start = time.perf_counter()
        self.first: Optional[float] = None
        self.last: Optional[float] = None
        self.tokens = 0

    def tokens_seen(self, total: int) -> None:
        """The stream's tokens so far (all samples): the first is TTFT, each later one an inter-token gap
        (tokens that arrive together share their gap)."""
        new = total - self.tokens
        if new <= 0:
            return
        now = time.perf_counter()
        if self.first is None:
            self.first = now
            self.m.labels(self.m.ttft).observe(now - self.start)
            new -= 1
        elif new:
            gap = (now - self.last) / new
            for _ in range(new):
                self.m.labels(self.m.itl).observe(gap)
        self.last, self.tokens = now, total

    def finish(self, out: Optional[RequestOutput]) -> None:
        m = self.m
        end = time.perf_counter()
        m.labels(m.e2e).observe(end - self.start)
        if out is None:
            return
        prompt_tokens = len(out.prompt_token_ids)
        output_tokens = sum(len(o.token_ids) for o in out.outputs)
        if self.first is not None and output_tokens > 1:
            m.labels(m.tpot).observe((end - self.first) / (output_tokens - 1))
        m.labels(m.request_prompt).observe(prompt_tokens)
        m.labels(m.request_generation).observe(output_tokens)
        m.labels(m.prompt_tokens).inc(prompt_tokens)
        m.labels(m.generation_tokens).inc(output_tokens)
        m.labels(m.prefix_queries).inc(prompt_tokens)
        m.labels(m.prefix_hits).inc(out.num_cached_tokens)
        reason = out.outputs[0].finish_reason if out.outputs else None
        m.labels(m.requests, reason or "abort").inc()
        if out.metrics is not None:
            for phase, value in (("queue", out.metrics.queued_time), ("prefill", out.metrics.prefill_time),
                                 ("decode", out.metrics.decode_time), ("inference", out.metrics.inference_time)):
                m.labels(m.phases[phase]).observe(value)
