"""Prometheus metrics for /metrics: requests, tokens in/out, time to first token, per-token latency, and
(read at scrape time) the engine's batch size, queue depth and time per step phase, and the grammar compiler's
counters.

One registry per app, so several apps in one process never collide. Never records prompt text or keys.
"""

from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, disable_created_metrics, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

disable_created_metrics()  # the *_created series only add noise to every scrape

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _read(stats: Any, name: str, default: float = 0.0) -> float:
    if stats is None:
        return default
    value = stats.get(name, default) if isinstance(stats, dict) else getattr(stats, name, default)
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _read_dict(stats: Any, name: str) -> dict[str, float]:
    value = stats.get(name) if isinstance(stats, dict) else getattr(stats, name, None)
    return {str(k): float(v) for k, v in value.items()} if isinstance(value, dict) else {}


class _LiveStats:
    """Collector that asks the engine and the compiler for their numbers when Prometheus scrapes."""

    def __init__(self, engine_stats: Callable[[], Any], compiler_stats: Callable[[], Any]):
        self.engine_stats = engine_stats
        self.compiler_stats = compiler_stats

    def collect(self):
        engine = self.engine_stats()
        compiler = self.compiler_stats()
        yield GaugeMetricFamily("structgen_batch_size", "Rows in the engine's running batch",
                                value=_read(engine, "batch_size"))
        yield GaugeMetricFamily("structgen_queue_depth", "Requests waiting to join the batch",
                                value=_read(engine, "queue_depth"))
        yield CounterMetricFamily("structgen_engine_steps", "Decode steps run by the engine",
                                  value=_read(engine, "steps"))
        yield CounterMetricFamily("structgen_engine_tokens_generated", "Tokens sampled by the engine",
                                  value=_read(engine, "tokens_generated"))
        yield CounterMetricFamily("structgen_engine_prefill_tokens", "Prompt positions prefilled (padding included)",
                                  value=_read(engine, "prefill_tokens"))
        yield CounterMetricFamily("structgen_engine_prefill_chunks",
                                  "Chunks of the prompts prefilled over several steps (longer than "
                                  "--max-prefill-tokens, or scored for prompt logprobs)",
                                  value=_read(engine, "prefill_chunks"))
        yield GaugeMetricFamily("structgen_engine_mask_threads", "Threads that fill the constraints' token masks "
                                "(--mask-threads)", value=_read(engine, "mask_threads"))
        yield GaugeMetricFamily("structgen_engine_alive", "1 while the engine serves requests; 0 once a failure "
                                "stopped it (/health answers 503, the server must be restarted)",
                                value=_read(engine, "alive"))
        phases = CounterMetricFamily("structgen_engine_step_seconds",
                                     "Seconds the engine thread spent in each phase of its decode steps "
                                     "(on a GPU, 'sample' includes waiting for the device)", labels=["phase"])
        for phase, seconds in _read_dict(engine, "step_seconds").items():
            phases.add_metric([phase], seconds)
        yield phases
        yield CounterMetricFamily("structgen_grammar_compiles", "Grammars compiled (cache misses)",
                                  value=_read(compiler, "compiles"))
        yield CounterMetricFamily("structgen_grammar_cache_hits", "Grammar requests served from a cache",
                                  value=_read(compiler, "cache_hits"))
        yield CounterMetricFamily("structgen_grammar_disk_hits", "Grammars loaded from the on-disk cache",
                                  value=_read(compiler, "disk_hits"))
        yield CounterMetricFamily("structgen_grammar_compile_seconds", "Seconds requests' grammar compiles took "
                                  "(a wait on an outlines build included)",
                                  value=_read(compiler, "compile_seconds_total"))
        yield CounterMetricFamily("structgen_grammar_outlines_builds", "Outlines automata builds started, in the "
                                  "background (for a schema's repeats: the auto policy) or not",
                                  value=_read(compiler, "outlines_builds"))
        yield CounterMetricFamily("structgen_grammar_outlines_build_seconds", "Seconds those outlines automaton "
                                  "builds took (failed and timed-out ones included)",
                                  value=_read(compiler, "build_seconds_total"))
        yield CounterMetricFamily("structgen_grammar_outlines_build_failures", "Outlines builds that failed or ran "
                                  "past the time limit (their schemas stay on llguidance: never built again)",
                                  value=_read(compiler, "outlines_failures"))


class Metrics:
    def __init__(self, engine_stats: Callable[[], Any], compiler_stats: Callable[[], Any]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("structgen_requests", "HTTP API requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.in_flight = Gauge("structgen_requests_in_flight", "Generation requests being served", registry=r)
        self.prompt_tokens = Counter("structgen_prompt_tokens", "Prompt tokens received", registry=r)
        self.completion_tokens = Counter("structgen_completion_tokens", "Completion tokens returned", registry=r)
        self.ttft = Histogram("structgen_time_to_first_token_seconds", "Request start to first token",
                              registry=r, buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
        self.token_latency = Histogram("structgen_time_per_output_token_seconds",
                                       "Mean time between output tokens, per request", registry=r,
                                       buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
        self.grammar_wait = Histogram("structgen_grammar_wait_seconds",
                                      "Time a request waited for its grammar (compile or cache hit)",
                                      registry=r, buckets=(.0005, .001, .005, .01, .05, .1, .5, 1, 5, 30, 120))
        r.register(_LiveStats(engine_stats, compiler_stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)
