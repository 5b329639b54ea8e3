"""Prometheus metrics, named as vLLM names its own under ``vidsight:``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# vLLM's latency buckets, seconds.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)


class Metrics:
    """The server's counters, gauges and histograms in a registry of their own."""

    def __init__(self, model_name: str):
        self.registry = registry = CollectorRegistry()
        label = {"model_name": model_name}

        def counter(name, text, labels=()):
            return Counter(f"vidsight:{name}", text, ["model_name", *labels], registry=registry)

        def histogram(name, text):
            return Histogram(f"vidsight:{name}", text, ["model_name"], buckets=LATENCY_BUCKETS,
                             registry=registry).labels(**label)

        self.time_to_first_token = histogram("time_to_first_token_seconds", "Time to the first answer token.")
        self.e2e_latency = histogram("e2e_request_latency_seconds", "Whole request latency.")
        self.queue_time = histogram("request_queue_time_seconds", "Time model work waited for the model.")
        self.watch_lag = histogram("watch_lag_seconds", "From a watch window's last frame arriving to its verdict.")
        self.vision_batch_size = Histogram("vidsight:vision_batch_size", "Watch windows encoded in one vision call.",
                                           ["model_name"], buckets=(1, 2, 3, 4, 6, 8, 16),
                                           registry=registry).labels(**label)
        self.decode_batch_size = Histogram("vidsight:decode_batch_size", "Answers fed together in one decode step.",
                                           ["model_name"], buckets=(1, 2, 4, 8, 16, 32, 64),
                                           registry=registry).labels(**label)
        self.running = Gauge("vidsight:num_requests_running", "Model work running.", ["model_name"],
                             registry=registry).labels(**label)
        self.waiting = Gauge("vidsight:num_requests_waiting", "Model work waiting.", ["model_name"],
                             registry=registry).labels(**label)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens prefilled.").labels(**label)
        self.generation_tokens = counter("generation_tokens", "Tokens generated.").labels(**label)
        self.visual_tokens = counter("visual_tokens", "Visual tokens from the vision encoder.").labels(**label)
        self.visual_tokens_pruned = counter("visual_tokens_pruned", "Visual tokens pruned before the "
                                            "language model or from its cache.").labels(**label)
        self.visual_tokens_reused = counter("visual_tokens_reused", "Visual tokens whose KV a window "
                                            "reused.").labels(**label)
        self.frames_decoded = counter("frames_decoded", "Video frames sampled and decoded.").labels(**label)
        self.windows_judged = counter("windows_judged", "Watch windows judged.").labels(**label)
        self.windows_skipped = counter("windows_skipped", "Windows of live watches passed over to keep up "
                                       "with their streams.").labels(**label)
        self.alerts = counter("alerts", "Watch alerts raised.").labels(**label)
        self.requests = counter("requests", "Finished requests by outcome.", ["finished_reason"])
        self.kv_bytes = Gauge("vidsight:kv_cache_bytes", "KV cache bytes per tier, chat sessions summed.",
                              ["model_name", "tier"], registry=registry)
        self._label = label

    def follow(self, name: str, text: str, read, counter: bool = False) -> None:
        """``vidsight:{name}`` read from ``read()`` at each scrape (a counter's name gains ``_total``)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        label = self._label["model_name"]

        class Reading:
            def collect(self):
                family = (CounterMetricFamily if counter else GaugeMetricFamily)(f"vidsight:{name}", text,
                                                                                labels=["model_name"])
                family.add_metric([label], read())
                yield family

        self.registry.register(Reading())

    def follow_prefix_cache(self, stats) -> None:
        """The video prefix cache's counters and holdings, from ``stats()`` (a `PrefixCacheStats`)."""
        for name, text in (("hits", "Completions whose video prefix was cached."),
                           ("misses", "Completions that prefilled their video prefix."),
                           ("host_hits", "Completions whose video prefix came back up from host memory."),
                           ("waited", "Completions that waited for another's prefill of their video prefix."),
                           ("offloads", "Video prefixes moved to host memory for the device budget."),
                           ("evictions", "Video prefixes dropped for the budgets.")):
            self.follow(f"prefix_cache_{name}", text, lambda name=name: getattr(stats(), name), counter=True)
        for name, text in (("bytes", "KV bytes the prefix cache holds on the device."),
                           ("entries", "Video prefixes the cache holds on the device."),
                           ("host_bytes", "KV bytes the prefix cache holds in host memory."),
                           ("host_entries", "Video prefixes the cache holds in host memory.")):
            self.follow(f"prefix_cache_{name}", text, lambda name=name: getattr(stats(), name))

    def finished(self, reason: str) -> None:
        self.requests.labels(finished_reason=reason, **self._label).inc()

    def kv_tier(self, tier: str):
        return self.kv_bytes.labels(tier=tier, **self._label)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def merge_expositions(texts: list[str]) -> bytes:
    """Several servers' metrics as one server's: every sample summed over them (counters, gauges
    of amounts and histogram buckets all add up across replicas), creation times the earliest."""
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, Metric] = {}
    totals: dict[str, dict[tuple, float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            families.setdefault(family.name, family)
            samples = totals.setdefault(family.name, {})
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                earlier = samples.get(key)
                if earlier is None:
                    samples[key] = sample.value
                else:
                    samples[key] = min(earlier, sample.value) if sample.name.endswith("_created") else earlier + sample.value

    class Merged:
        def collect(self):
            for name, family in families.items():
                merged = Metric(name, family.documentation, family.type)
                for (sample_name, labels), value in totals[name].items():
                    merged.add_sample(sample_name, dict(labels), value)
                yield merged

    registry = CollectorRegistry()
    registry.register(Merged())
    return generate_latest(registry)
