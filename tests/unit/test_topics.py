"""The admin client's create-topics response, read for per-topic errors (pure)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from daemon.topics import _config_refused, _raise_topic_errors, fallback_configs
from memory.errors import BackendUnavailable


def test_created_or_already_existing_topics_pass() -> None:
    """Code 0 (created) and 36 (another daemon created it first) are both fine."""
    ok = [("a", 0, None), ("b", 36, "Topic 'b' already exists.")]
    assert _raise_topic_errors(SimpleNamespace(topic_errors=ok), 1) is None
    assert _raise_topic_errors(SimpleNamespace(topic_errors=[("a", 0)]), 1) is None  # v0 responses carry no message
    with pytest.raises(BackendUnavailable, match="c: "):  # the same response with one refusal fails
        _raise_topic_errors(SimpleNamespace(topic_errors=[*ok, ("c", 37, None)]), 1)


def test_a_topic_the_broker_refused_fails_naming_it_and_why() -> None:
    """Apache Kafka answers INVALID_REPLICATION_FACTOR (38) in the response, without raising."""
    resp = SimpleNamespace(
        topic_errors=[
            ("memory.documents", 0, None),
            ("memory.requests", 38, "Replication factor: 3 larger than available brokers: 1."),
        ]
    )
    with pytest.raises(BackendUnavailable) as exc:
        _raise_topic_errors(resp, 3)
    message = str(exc.value)
    assert "memory.requests: InvalidReplicationFactorError" in message and "larger than available brokers" in message
    assert "memory.documents" not in message and "AGENTMEM_TOPIC_REPLICATION=3" in message


def test_topics_refused_for_their_configs_are_named_with_the_reason() -> None:
    """Managed Kafka may cap max.message.bytes below what the daemon asks (the broker answers
    INVALID_CONFIG or POLICY_VIOLATION): those topics are created again without it. Topics
    refused for anything else, or asked for without configs, stay errors."""
    resp = SimpleNamespace(
        topic_errors=[
            ("docs", 40, "max.message.bytes above 8388608"),
            ("turns", 44, None),
            ("requests", 44, "policy"),  # asked for without configs: a real refusal
            ("replies", 0, None),
            ("dlq", 38, "replication factor"),
        ]
    )
    configs = {"docs": {"max.message.bytes": "9"}, "turns": {"max.message.bytes": "9"}}
    assert _config_refused(resp, configs) == {
        "docs": "InvalidConfigurationError: max.message.bytes above 8388608",
        "turns": "PolicyViolationError: ",
    }


def test_a_topic_refused_for_its_retention_is_asked_again_with_its_record_size_alone() -> None:
    """A broker that caps retention.ms keeps the record size the daemon needs; only when that
    is refused too is the topic created with the broker's defaults."""
    asked = {
        "docs": {"max.message.bytes": "9", "retention.ms": "-1"},
        "requests": {"retention.ms": "3600000", "segment.ms": "3600000"},
        "replies": {"retention.ms": "3600000"},
    }
    refused = {"docs": "PolicyViolationError: ", "requests": "PolicyViolationError: "}
    again = fallback_configs(asked, refused, ("max.message.bytes",))
    assert again == {"docs": {"max.message.bytes": "9"}, "requests": {}}
    assert fallback_configs(again, {"docs": "InvalidConfigurationError: "}, ()) == {"docs": {}}
