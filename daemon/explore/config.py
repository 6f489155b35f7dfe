"""The explorer's config section (``Settings.explore``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ExploreConfig(BaseModel):
    """``/explore``: the read-only memory explorer on the daemon's HTTP server."""

    enabled: bool = Field(
        True,
        description="Serve /explore (off by itself on a non-loopback http_host without http_token).",
    )
    page_size: int = Field(100, ge=1, le=500, description="Rows of one explorer page (turns, chunks, groups).")
    dlq_records: int = Field(50, ge=1, le=1000, description="Most recent DLQ records the explorer reads.")
    dlq_wait_s: float = Field(3.0, gt=0, le=30, description="Longest the explorer waits for the DLQ's records.")
    concurrent_pages: int = Field(
        2,
        ge=1,
        le=64,
        description=(
            "Explorer pages read and rendered at once; the rest wait their turn. Pages share the event loop "
            "with every tenant's queries, which a page's reads and rendering hold."
        ),
    )
