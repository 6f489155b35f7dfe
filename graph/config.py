"""Config of the GraphRAG layer; ``daemon/settings.py`` composes it."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr


class GraphConfig(BaseModel):
    """Entity extraction, communities, staleness and the summarizer worker."""

    enabled: bool = Field(True, description="Build the entity graph and community summaries.")
    spacy_model: str = Field("en_core_web_sm", description="spaCy pipeline for named entities ('' = identifiers only).")
    llm_model: str = Field(
        "", description="litellm model for summaries and extraction (e.g. 'gpt-4o-mini'); '' = offline."
    )
    llm_api_base: str = Field(
        "",
        description=(
            "Base URL of the model's API, for a self-hosted or proxied model (e.g. 'http://127.0.0.1:4000/v1'); "
            "'' = the provider's own (litellm also reads the provider's variables, such as OPENAI_API_BASE)."
        ),
    )
    llm_api_key: SecretStr = Field(
        SecretStr(""), description="API key of the model; '' = the provider's variable (such as OPENAI_API_KEY)."
    )
    llm_extraction: bool = Field(False, description="Also extract entities with the LLM (needs llm_model).")
    llm_timeout_s: float = Field(
        60.0,
        gt=0,
        description=(
            "Timeout of one LLM call, retries included (none are made: a failed summary is retried later, "
            "a failed extraction leaves its chunks their NER entities)."
        ),
    )
    llm_concurrency: int = Field(
        4, ge=1, le=64, description="LLM extraction calls of one batch made at once (ingestion waits for them)."
    )
    max_entities_per_chunk: int = Field(40, ge=2, le=500, description="Cap on entities (and so edges) per chunk.")
    extraction_cache_chunks: int = Field(
        20_000,
        ge=0,
        description="Chunk texts whose entities are kept in memory, so an edit re-extracts only its changed chunks.",
    )
    max_entities_per_doc: int = Field(
        5_000,
        ge=1,
        le=1_000_000,
        description=(
            "Cap on one doc's entities in the graph (the most-mentioned are kept): a doc's graph change is "
            "one Redis script, which blocks Redis while it runs. Its chunks stay searchable in full."
        ),
    )
    max_edges_per_doc: int = Field(
        20_000,
        ge=1,
        le=10_000_000,
        description="Cap on one doc's co-occurrence edges (the heaviest are kept); see max_entities_per_doc.",
    )
    aliases: dict[str, str] = Field(
        default_factory=lambda: {
            "postgres": "postgresql",
            "pg": "postgresql",
            "k8s": "kubernetes",
            "mongo": "mongodb",
            "es": "elasticsearch",
        },
        description="Entity aliases: normalized name -> canonical name.",
    )
    seed: int = Field(42, description="Leiden seed: the same graph always gives the same communities.")
    resolution: float = Field(1.0, gt=0, description="Leiden resolution (higher = smaller communities).")
    max_community_size: int = Field(10, ge=2, description="Communities larger than this are split into a finer level.")
    max_levels: int = Field(3, ge=1, le=8, description="Deepest hierarchy level.")
    match_threshold: float = Field(
        0.3, gt=0, le=1, description="Jaccard overlap for a new community to keep an old community's id."
    )
    drift_threshold: int = Field(
        50, ge=1, description="Entity/edge changes since the last recompute that trigger a new one."
    )
    recompute_check_s: float = Field(2.0, gt=0, description="How often drift is checked.")
    recompute_min_interval_s: float = Field(
        30.0, ge=0, description="Least time between two drift-triggered recomputes (cluster-wide)."
    )
    summarizer_concurrency: int = Field(1, ge=0, le=32, description="Summaries written at once (0 = no worker).")
    summarizer_rate_per_min: float = Field(600.0, gt=0, description="Most summaries started per minute.")
    summarizer_quiet_s: float = Field(
        0.5, ge=0, description="A summary starts only once ingestion has been idle this long (0 = no yielding)."
    )
    summarizer_max_defer_s: float = Field(
        5.0, ge=0, description="Longest a summary waits for ingestion to go quiet before it starts anyway."
    )
    summary_token_budget: int = Field(
        1500,
        ge=100,
        description=(
            "Most input words given to one summary: an LLM's prompt names the 50 most mentioned members "
            "within a quarter of it, then excerpts."
        ),
    )
    summary_sentences: int = Field(5, ge=1, le=50, description="Sentences in an extractive summary.")
    summary_retry_initial_s: float = Field(1.0, gt=0, description="First backoff after a failed summary.")
    summary_retry_max_s: float = Field(300.0, gt=0, description="Longest backoff after failed summaries.")
    claim_ttl_s: float = Field(120.0, gt=0, description="How long a worker's claim on a community lasts.")
    queue_log_interval_s: float = Field(30.0, gt=0, description="How often queue depth and oldest age are logged.")

    @property
    def summarizer(self) -> str:
        """What writes summaries, as their records name it: the litellm model, or ``extractive``."""
        return self.llm_model or EXTRACTIVE


#: The offline summarizer's name in a summary record (``model``) and its chunk's metadata.
EXTRACTIVE = "extractive"
