"""Prometheus metrics, one registry per app (so two servers in one process never collide):
request counts and latencies, TTFT and inter-token histograms, token counters, and the
engine's cache and queue state read from `engine.stats()` at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agentkv.cache.disk_tier import IGNORED_REASONS, DiskStats
from agentkv.server.serving_lora import lora_metrics

PREFIX = "agentkv"
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class EngineCollector(Collector):
    """Reads the engine's counters and gauges when scraped; nothing while it is loading."""

    def __init__(self, get_engine: Callable[[], Any]) -> None:
        self._get_engine = get_engine

    def collect(self) -> Iterator[Any]:
        engine = self._get_engine()
        if engine is None:
            return
        stats = engine.stats()  # the snapshot the engine thread published: no tree walk here
        counters = {
            "prefix_cache_queried_tokens": ("prefix_queried_tokens", "Prompt tokens looked up in the prefix cache"),
            "prefix_cache_hit_tokens": ("prefix_hit_tokens", "Prompt tokens served from the prefix cache"),
            "kv_evicted_blocks": ("evicted_blocks", "KV blocks evicted from the prefix cache"),
            "preemptions": ("preemptions", "Requests preempted for lack of KV blocks"),
            "spec_drafted_tokens": ("spec_drafted_tokens", "Draft tokens verified by speculative decoding"),
            "spec_accepted_tokens": ("spec_accepted_tokens", "Draft tokens accepted (what the sampler picked)"),
        }
        for name, (field, doc) in counters.items():
            yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=getattr(stats, field))
        gauges = {
            "kv_blocks_used": ("kv_blocks_used", "KV blocks in use"),
            "kv_blocks_free": ("kv_blocks_free", "KV blocks free"),
            "kv_blocks_cached": ("kv_blocks_cached", "KV blocks held only by the prefix cache (evictable)"),
            "num_requests_running": ("num_running", "Requests being stepped"),
            "num_requests_waiting": ("num_waiting", "Requests queued for admission"),
        }
        for name, (field, doc) in gauges.items():
            yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=getattr(stats, field))
        if stats.disk is not None:
            yield from disk_metrics(stats.disk)
        yield from lora_metrics(engine)


DISK_COUNTERS = {
    "hit_blocks": "KV blocks served from the disk tier",
    "hit_tokens": "Prompt tokens whose KV came from the disk tier",
    "loads": "Admissions that loaded at least one block from the disk tier",
    "written_blocks": "KV blocks written to the disk tier",
    "bytes_written": "Bytes of block files written",
    "bytes_read": "Bytes of block files read (and verified)",
    "write_errors": "Failed block-file writes (the tier turns read-only)",
    "dropped_writes": "Blocks not written: the write queue was full or the tier read-only",
}
DISK_GAUGES = {
    "num_files": ("files", "Block files in the disk tier's index"),
    "used_bytes": ("used_bytes", "Bytes of block files on disk"),
    "read_only": ("read_only", "1 after a write error: the disk tier only serves what it has"),
}


def disk_metrics(disk: DiskStats) -> Iterator[Any]:
    """The KV disk tier's counters and gauges (`agentkv_kv_disk_*`); ignored files by reason,
    every reason listed (zero included) so a dashboard sees the series before the first one."""
    for field, doc in DISK_COUNTERS.items():
        yield CounterMetricFamily(f"{PREFIX}_kv_disk_{field}", doc, value=getattr(disk, field))
    ignored = CounterMetricFamily(
        f"{PREFIX}_kv_disk_ignored_files", "Block files ignored (never served) by reason", labels=["reason"]
    )
    counts = dict(disk.ignored)
    for reason in IGNORED_REASONS:
        ignored.add_metric([reason], counts.get(reason, 0))
    yield ignored
    for field, (name, doc) in DISK_GAUGES.items():
        yield GaugeMetricFamily(f"{PREFIX}_kv_disk_{name}", doc, value=float(getattr(disk, field)))


class ServerMetrics:
    """The app's instruments. Methods only record; thread-safe (prometheus-client locks)."""

    def __init__(self, get_engine: Callable[[], Any]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.latency = Histogram(
            f"{PREFIX}_request_latency_seconds",
            "End-to-end request latency",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Time to first generated token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds", "Time between generated tokens", buckets=_TOKEN_BUCKETS, registry=r
        )
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated", registry=r)
        self.cached_tokens = Counter(
            f"{PREFIX}_cached_prompt_tokens", "Prompt tokens whose KV came from the prefix cache", registry=r
        )
        self.finished = Counter(f"{PREFIX}_request_finished", "Finished generations by reason", ["reason"], registry=r)
        r.register(EngineCollector(get_engine))

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()
        self.latency.labels(endpoint=endpoint).observe(seconds)

    def observe_generation(
        self, prompt_len: int, cached_len: int, num_generated: int, finish_reason: str | None
    ) -> None:
        self.prompt_tokens.inc(prompt_len)
        self.cached_tokens.inc(cached_len)
        self.generation_tokens.inc(num_generated)
        self.finished.labels(reason=finish_reason or "none").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class TokenTimer:
    """Per-choice timing: the first token's delay goes to TTFT, each later gap to ITL."""

    def __init__(self, metrics: ServerMetrics, start: float) -> None:
        self._metrics, self._last, self._first = metrics, start, True

    def tokens(self, now: float, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        if self._first:
            self._metrics.ttft.observe(now - self._last)
            self._first = False
        else:
            self._metrics.itl.observe((now - self._last) / num_tokens)
        self._last = now
