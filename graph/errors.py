"""The graph layer's errors, in the daemon's one tree (``memory.errors``)::

MemdError
├── LeaseLost          a singleton lease expired or changed hands     lease_lost
├── NerUnavailable     the spaCy pipeline is not installed             ner_unavailable
├── LlmFailed          a model call failed or answered unusably        llm_failed (retryable)
└── BackendUnavailable
    └── ComputeCrashed the community-detection process died            unavailable
"""

from __future__ import annotations

from memory.errors import BackendUnavailable, MemdError


class LeaseLost(MemdError):
    """A singleton lease (the recompute's) expired or changed hands before its work was stored."""

    code = "lease_lost"


class NerUnavailable(MemdError):
    """The configured spaCy pipeline is not installed."""

    code = "ner_unavailable"


class LlmFailed(MemdError):
    """The model call failed or returned something unusable."""

    code = "llm_failed"
    retryable = True


class ComputeCrashed(BackendUnavailable):
    """The compute process died mid-task (killed, out of memory); a new one serves the next."""
