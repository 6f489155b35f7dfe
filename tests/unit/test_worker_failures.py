"""How the embedding worker reports an encode failure (pure): the input's fault, or the machine's."""

from __future__ import annotations

import pytest

from memory.embed_child import _failure_status


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (MemoryError(), "unavailable"),
        (
            RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8589934592 bytes."),
            "unavailable",
        ),
        (
            RuntimeError("[enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: not enough memory"),
            "unavailable",
        ),
        (RuntimeError("The size of tensor a (300) must match the size of tensor b (256)"), "error"),
        (ValueError("text input must be of type str"), "error"),
    ],
)
def test_out_of_memory_is_an_outage_and_the_rest_the_inputs_fault(exc: Exception, status: str) -> None:
    """An allocation failure says nothing of the input: the doc is retried like an outage,
    not dead-lettered as embedding_failed."""
    assert _failure_status(exc) == status
