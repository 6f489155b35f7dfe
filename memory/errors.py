"""One error hierarchy for the whole daemon, and the errors of the ``memory`` package.

``code`` values are part of the reply contract (``docs/contract.md``): adding one is an
API change, renaming one breaks callers. The tree (each package keeps its own in one
module: ``memory.index.errors``, ``graph.errors``, ``consumers.errors``)::

    MemdError                                   internal
    ├── InvalidRequest                          invalid_request
    │   └── UnknownReplyTopic (consumers)
    ├── InvalidEvent                            invalid_event      (dead-lettered)
    ├── NotFound                                not_found
    ├── BackendUnavailable (retryable)          unavailable
    │   ├── EmbedderUnavailable ── WorkerCrashed
    │   ├── IndexMismatch
    │   ├── WritesHeld
    │   ├── WriteInProgress (memory.index)
    │   └── ComputeCrashed (graph)
    ├── Unauthorized                            unauthorized
    ├── EmbedderError                           embedding_failed
    │   ├── InputCrashesWorker
    │   └── QueryRefused                        invalid_request
    ├── ReindexConflict ── ReindexWouldLose     conflict
    ├── IndexError_ ── QuerySyntaxError (memory.index)   index_error
    ├── LeaseLost, NerUnavailable, LlmFailed (graph)
    ├── QueryFailed, WriteRejected (consumers: the client's view of a reply or an ack)
    ├── RequestExpired (consumers)              expired            (a request past its age)
    ├── LauncherError (daemon.launcher)         launcher
    └── ConfigError (daemon.settings_check)     invalid_config     (at start, never in a reply)
"""

from __future__ import annotations

from typing import ClassVar


class MemdError(Exception):
    """Base of every error the daemon raises on purpose."""

    code: ClassVar[str] = "internal"
    retryable: ClassVar[bool] = False


class InvalidRequest(MemdError):
    """The caller sent something we cannot act on (bad JSON, schema, filter key, top_k)."""

    code = "invalid_request"


class InvalidEvent(MemdError):
    """An ingested event is malformed; it goes to the DLQ with this message."""

    code = "invalid_event"


class NotFound(MemdError):
    """A named thing (index, document) does not exist."""

    code = "not_found"


class BackendUnavailable(MemdError):
    """Redis or Kafka cannot be reached right now; the operation may succeed later."""

    code = "unavailable"
    retryable = True


class Unauthorized(MemdError):
    """A backend refused our credentials: a configuration problem, not an outage."""

    code = "unauthorized"


class EmbedderError(MemdError):
    """The embedding model could not be loaded or failed on an input."""

    code = "embedding_failed"


class EmbedderUnavailable(BackendUnavailable):
    """The worker is gone or cannot be started: an outage, retried (never a dead letter)."""


class WorkerCrashed(EmbedderUnavailable):
    """The worker process died while it was encoding a request: retried like any outage.

    ``attributable`` says whether the input may be the cause: the worker died of a crash
    signal (SIGSEGV, SIGABRT, ...; not SIGKILL, which is the OOM killer or an operator) and
    this request was the only one in flight. Ingestion counts only those against an input.
    """

    def __init__(self, message: str, *, attributable: bool = False, signalled: bool = False) -> None:
        super().__init__(message)
        self.attributable = attributable
        #: Died of a crash signal: the input may be the cause (if it was alone in there).
        self.signalled = signalled


class InputCrashesWorker(EmbedderError):
    """The worker died every time it was given this input: a verdict on the input."""


class QueryRefused(EmbedderError):
    """A query text known to crash the worker: refused without reaching it. Asking again
    would be refused again, so the asker is told to change the text, not to retry."""

    code = "invalid_request"


class IndexMismatch(BackendUnavailable):
    """The active index generation was built with other settings than this process has."""


class WritesHeld(BackendUnavailable):
    """A reindex is replaying the last events of unversioned docs (transcript turns) into the
    active generation, and holds their live writes meanwhile (``GenerationRegistry.
    hold_unversioned``). Not retried where it is raised: the ingestor applies the whole batch
    again once the hold ends, since what it read meanwhile (a forget's turns, a turn's
    neighbours) may be the replay's passing state. Nothing is committed in between."""


class ReindexConflict(MemdError):
    """Another reindex holds the build slot, or the build in progress is not ours."""

    code = "conflict"


class ReindexWouldLose(ReindexConflict):
    """The new generation failed docs that the live one serves: switching would lose them."""
