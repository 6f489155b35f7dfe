"""The contract's field names told in a caller's words (daemon.wording)."""

from __future__ import annotations

import pytest

from daemon.wording import CLI_NAMES, in_words


@pytest.mark.parametrize(
    ("message", "want"),
    [
        ("unknown metadata_filter key 'team'", "unknown --filter key 'team'"),
        ("time_range.since is after time_range.until", "--since is after --until"),
        (
            "search_text: String should have at least 1 character",
            "the question: String should have at least 1 character",
        ),
        ("hybrid_params.rrf_k must be >= 0", "--rrf-k must be >= 0"),
        ("unknown metadata_filter key 'metadata_filter'", "unknown --filter key 'metadata_filter'"),
        ("my_top_k is no field", "my_top_k is no field"),
    ],
)
def test_a_command_line_error_names_its_options(message: str, want: str) -> None:
    """Fields become the options that set them; a quoted value or a longer name is left alone."""
    assert in_words(message, CLI_NAMES) == want
