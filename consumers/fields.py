"""The constrained field types that the contract's events and requests share."""

from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

MAX_VERSION = 2**63 - 1
#: Where the default versions (the time in microseconds, ``client_writes.default_version``)
#: begin for any writer now, in 2001; a counter of a writer's own stays far below it.
CLOCK_VERSIONS_FROM = 10**15
#: Longest doc id (and other id or source string) an event or request may carry.
MAX_DOC_ID_CHARS = 1024
NonEmpty = Annotated[str, StringConstraints(min_length=1, max_length=MAX_DOC_ID_CHARS)]
# Ids become Redis key parts, and RediSearch reads a key only up to a NUL: a chunk under such
# a key is indexed but comes back without fields, so it would never be found and a forget of
# its session would delete nothing. Refused at the door, with a reason.
NO_NUL = r"^[^\x00]*$"
DocId = Annotated[str, StringConstraints(min_length=1, max_length=MAX_DOC_ID_CHARS, pattern=NO_NUL)]
AgentPart = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=NO_NUL)]
#: The longest metadata string value.
MAX_META_CHARS = 4096
MetaValue = Annotated[str, StringConstraints(max_length=MAX_META_CHARS)] | int | float | bool
