"""Index generations: several physical indexes behind one alias, switched atomically.

Why: rebuilding the index (a new embedding model, a chunking change, or repairing the
BM25 statistics RediSearch 2.10 double-counts after an AOF reload) must not stop queries.
Every physical index is one *generation* ``<name>-g<N>`` with its own key prefix
``<name>:g<N>:``; the search alias ``<name>`` points at the active one, so queries never
name a generation. A small Redis hash (``<name>:generations``) records which generation is
active, which one is being built, and the spec (model, dims, chunking, schema) each was
built with. Writers read the active generation inside their WATCH transaction, so once
the switch script has run no write can land in the old generation.

A daemon whose settings do not match the active generation's spec (it still runs the old
model after a reindex, say) must neither write vectors of the wrong model nor embed
queries that mean nothing to the index: it reports ``IndexMismatch`` (an outage to it, so
ingestion backs off without committing, and nothing is lost) until it is restarted with the
new settings.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from memory.config import ChunkingConfig, IndexConfig
from memory.schema import index_schema
from memory.text import ANALYZER_VERSION

#: A build whose heartbeat is older than this is considered abandoned (seconds, Redis's clock).
STALE_BUILD_S = 60.0


class IndexSpec(BaseModel):
    """What decides the content of an index: equal specs make interchangeable vectors/chunks."""

    model_config = ConfigDict(frozen=True)

    model: str
    dims: int
    max_tokens: int
    overlap: int
    schema_digest: str
    # Specs recorded before the analyzer was versioned were built by version 1.
    analyzer: int = 1
    # Where chunks are cut besides their size. None: recorded before these were kept, so not
    # known; such a spec is compared as if it had this process's (see known()).
    strategy: str | None = None
    min_tokens: int | None = None

    def fingerprint(self) -> str:
        """A short stable digest of the spec."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]

    def same_vectors(self, other: IndexSpec) -> bool:
        """Whether ``other`` cuts the same chunks and embeds them with the same model: its
        chunk texts and vectors are this spec's, whatever its index fields and text analysis."""
        return self.chunks() == other.chunks() and (self.model, self.dims) == (other.model, other.dims)

    def known(self, current: IndexSpec) -> IndexSpec:
        """This spec, with what it did not record taken from ``current`` (a spec recorded by a
        release that kept less is compared as that release compared it)."""
        unknown = {k: getattr(current, k) for k in ("strategy", "min_tokens") if getattr(self, k) is None}
        return self.model_copy(update=unknown) if unknown else self

    def chunks(self) -> tuple[str, int, int, str | None, int | None]:
        """What decides where chunks are cut: the model's tokenizer and the chunking settings."""
        return (self.model, self.max_tokens, self.overlap, self.strategy, self.min_tokens)

    def only_analysis_differs(self, other: IndexSpec) -> bool:
        """Whether ``other`` is this spec but for the text analysis version: chunk texts and
        vectors still hold, and only BM25 terms and identifiers need analyzing again."""
        return self != other and self.model_copy(update={"analyzer": other.analyzer}) == other

    def fix_for(self, current: IndexSpec) -> str:
        """What to do when an index built with this spec meets a process of ``current`` (the
        daemon's refusal and doctor's finding say the same)."""
        if self.only_analysis_differs(current):
            # Only the text analysis differs: no settings bring the other one back.
            if self.analyzer > current.analyzer:
                return "upgrade this process to the release that built it"
            return (
                "run `agentmemd reindex` to re-analyze it (its chunks and vectors are kept, even "
                "where the broker no longer holds their events), or run the release that built it"
            )
        if self.same_vectors(current):
            # Other filter keys: a reindex sets the fields again from what is stored.
            return (
                "its index fields differ (its filter keys, HNSW settings or a release's fields). Run "
                "`agentmemd reindex` with these settings (where only the filter keys changed, every chunk "
                "and vector is kept, even where the broker no longer holds their events), or restart "
                "with the settings the index was built with"
            )
        return "restart it with the settings the index was built with (or run `agentmemd reindex` with these)"

    def describe(self) -> str:
        """The spec in words, for error messages."""
        return (
            f"model={self.model} dims={self.dims} chunking={self.max_tokens}/{self.overlap} "
            f"({self.strategy}, min {self.min_tokens}) "
            f"schema={self.schema_digest} analyzer={self.analyzer}"
        )


def schema_digest(cfg: IndexConfig, *, dims: int) -> str:
    """A short digest of the index fields these settings build (pure)."""
    schema = index_schema(cfg, dims=dims, generation=0)
    return hashlib.sha256(json.dumps(schema["fields"], sort_keys=True).encode()).hexdigest()[:12]


def index_spec(cfg: IndexConfig, *, model: str, dims: int, chunking: ChunkingConfig) -> IndexSpec:
    """The spec of an index built with these settings (pure)."""
    digest = schema_digest(cfg, dims=dims)
    return IndexSpec(
        model=model,
        dims=dims,
        max_tokens=chunking.max_tokens,
        overlap=chunking.overlap,
        schema_digest=digest,
        analyzer=ANALYZER_VERSION,
        strategy=chunking.strategy,
        min_tokens=chunking.min_tokens,
    )


@dataclass(frozen=True)
class GenerationState:
    """A read of the registry: the active generation (0 = none yet) and its spec."""

    active: int
    spec: IndexSpec | None
    building: int = 0
    building_owner: str = ""
    building_heartbeat: float = 0.0
    held: int = 0

    def build_alive(self, now: float) -> bool:
        """A reindex holds the build slot and beat within ``STALE_BUILD_S``
        of ``now`` (in Redis's clock, which the heartbeats are on)."""
        return bool(self.building) and now - self.building_heartbeat <= STALE_BUILD_S

    @property
    def hold_recorded(self) -> bool:
        """The registry names a hold on unversioned writes to the active generation, whether
        or not its reindex still lives (``unversioned_held`` says that)."""
        return self.held != 0 and self.held == self.active

    def unversioned_held(self, now: float) -> bool:
        """A live reindex holds unversioned writes to the active generation (its last catch-up,
        ``memory.index.GenerationRegistry.hold_unversioned``). A hold outlives its reindex by at
        most ``STALE_BUILD_S``."""
        return self.hold_recorded and self.build_alive(now)
