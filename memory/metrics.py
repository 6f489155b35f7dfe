"""Prometheus metrics, defined once (the lowest layer, so every layer can record).

Names follow Prometheus conventions: ``agentmemd_`` prefix, ``_total`` counters,
``_seconds`` durations. The daemon serves them on ``/metrics``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

EVENTS_CONSUMED = Counter("agentmemd_events_consumed_total", "Events read from Kafka.", ["topic"], registry=REGISTRY)
EVENTS_KEYED_APART = Counter(
    "agentmemd_events_keyed_apart_total",
    "Events applied that came under another Kafka key than their own (their order is not kept).",
    ["topic"],
    registry=REGISTRY,
)
EVENTS_FAILED = Counter(
    "agentmemd_events_failed_total", "Event handling attempts that failed (retried).", ["topic"], registry=REGISTRY
)
EVENTS_DEAD_LETTERED = Counter(
    "agentmemd_events_dead_lettered_total", "Events sent to the DLQ.", ["topic", "code"], registry=REGISTRY
)
CHUNKS_EMBEDDED = Counter(
    "agentmemd_chunks_embedded_total", "Chunks sent to the embedding model.", ["topic"], registry=REGISTRY
)
CHUNKS_REUSED = Counter(
    "agentmemd_chunks_reused_total",
    "Chunks that kept a vector already stored for the same text (no model call).",
    ["topic"],
    registry=REGISTRY,
)
ACKS_SENT = Counter(
    "agentmemd_acks_sent_total", "Write acknowledgements published, by status.", ["topic", "status"], registry=REGISTRY
)
CONSUMER_LAG = Gauge(
    "agentmemd_consumer_lag",
    "Records behind the end of each partition.",
    ["group", "topic", "partition"],
    registry=REGISTRY,
)
INGEST_LANES = Gauge(
    "agentmemd_ingest_lanes",
    "Large batches being applied beside the poll, one partition each (consumers.lanes).",
    ["subscriber"],
    registry=REGISTRY,
)
INDEX_CHUNKS = Gauge(
    "agentmemd_index_chunks",
    "Entries in the search index: document and transcript chunks, and community summaries.",
    registry=REGISTRY,
)
INDEX_WRITES_PER_CHUNK = Gauge(
    "agentmemd_index_writes_per_chunk",
    "Writes the search index has counted per entry it holds (a Redis restart replays those its AOF "
    "logged since its last rewrite): on a RediSearch "
    "that never takes a rewritten entry's length back (2.10), how far BM25's average length has drifted.",
    registry=REGISTRY,
)
EMBEDDED_BROKER_RSS = Gauge(
    "agentmemd_embedded_broker_rss_bytes",
    "Resident memory of the embedded broker (tansu) that `agentmemd up` runs: it keeps every event "
    "and reply until it restarts (0 where none runs).",
    registry=REGISTRY,
)
QUERY_SECONDS = Histogram(
    "agentmemd_query_seconds",
    "Query handling time (parse to reply).",
    ["scope", "outcome"],
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
)
# Per tenant, counters rather than a histogram: a tenant is a topic, and there may be thousands.
TENANT_QUERIES = Counter(
    "agentmemd_tenant_queries_total",
    "Queries answered, per tenant and outcome.",
    ["tenant", "outcome"],
    registry=REGISTRY,
)
TENANT_QUERY_SECONDS = Counter(
    "agentmemd_tenant_query_seconds_total",
    "Query handling time summed per tenant (over the tenant's queries: its mean).",
    ["tenant"],
    registry=REGISTRY,
)
LEG_SECONDS = Histogram(
    "agentmemd_query_leg_seconds",
    "Time of each retrieval leg.",
    ["leg"],
    registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
)
STALE_DEPTH = Gauge("agentmemd_stale_queue_depth", "Communities waiting for a summary.", ["tenant"], registry=REGISTRY)
STALE_OLDEST = Gauge(
    "agentmemd_stale_queue_oldest_age_seconds", "Age of the oldest stale mark.", ["tenant"], registry=REGISTRY
)
SLICED_WRITES = Counter(
    "agentmemd_sliced_writes_total",
    "Large documents written in slices (memory.visibility), by outcome: finished, superseded "
    "(another write took the document over), restarted (a generation switch), waited (another "
    "process was writing the same version).",
    ["outcome"],
    registry=REGISTRY,
)
SUMMARIES_WRITTEN = Counter("agentmemd_summaries_written_total", "Community summaries written.", registry=REGISTRY)
SUMMARIES_FAILED = Counter("agentmemd_summaries_failed_total", "Community summaries that failed.", registry=REGISTRY)
LLM_TOKENS = Counter("agentmemd_llm_tokens_total", "Tokens spent on LLM calls.", ["purpose"], registry=REGISTRY)
LLM_EXTRACTION_SKIPPED = Counter(
    "agentmemd_llm_extraction_skipped_total",
    "Chunks whose LLM entity extraction failed (they keep identifier and NER entities).",
    registry=REGISTRY,
)
