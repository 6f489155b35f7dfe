"""The constrained field types that the contract's events and requests share."""

from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

MAX_VERSION = 2**63 - 1
NonEmpty = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
# Ids become Redis key parts, and RediSearch reads a key only up to a NUL: a chunk under such
# a key was indexed but came back without fields, so it was never found and a forget of its
# session deleted nothing (found by fuzzing). Refused at the door, with a reason.
NO_NUL = r"^[^\x00]*$"
DocId = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=NO_NUL)]
AgentPart = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=NO_NUL)]
MetaValue = Annotated[str, StringConstraints(max_length=4096)] | int | float | bool
