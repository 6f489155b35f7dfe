"""The reply_partition header, parsed (pure)."""

from __future__ import annotations

import pytest

from consumers.replies import parse_reply_partition
from memory.errors import InvalidRequest


@pytest.mark.parametrize(
    ("headers", "want"),
    [
        (None, None),
        ([], None),
        ([("reply_to", b"memory.replies")], None),
        ([("reply_partition", b"0")], 0),
        ([("reply_partition", b" 12 ")], 12),
        ([("reply_to", b"x"), ("reply_partition", b"3")], 3),
    ],
)
def test_parses_a_partition_number(headers: list[tuple[str, bytes]] | None, want: int | None) -> None:
    assert parse_reply_partition(headers) == want


@pytest.mark.parametrize("value", [b"", b"-1", b"1.0", b"one", b"\xff\xfe", b"\xd9\xa3", b"9" * 10, b"1 2"])
def test_garbage_is_an_invalid_request(value: bytes) -> None:
    with pytest.raises(InvalidRequest, match="reply_partition header"):
        parse_reply_partition([("reply_partition", value)])
