"""Create the contract's topics when they are missing (standard Kafka admin API only)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAlreadyExistsError, for_code

from memory.errors import BackendUnavailable

log = structlog.get_logger()


def _raise_topic_errors(resp: Any, replication: int) -> None:
    """The admin client returns a topic's creation error in the response instead of raising
    it: without this, a topic the broker refused (a replication factor above its brokers, no
    CREATE permission) was logged as created, and the daemon started without it."""
    failed = []
    for name, code, *message in getattr(resp, "topic_errors", ()):
        if code in (0, TopicAlreadyExistsError.errno):  # created, or another daemon won the race
            continue
        detail = (message[0] if message else None) or ""
        failed.append(f"{name}: {for_code(code).__name__}{f' ({detail})' if detail else ''}")
    if failed:
        raise BackendUnavailable(
            f"kafka refused to create topic(s) {'; '.join(failed)} (AGENTMEM_TOPIC_REPLICATION={replication}; "
            "create them by hand, or fix the setting or the ACL)"
        )


async def ensure_topics(
    bootstrap: str,
    topics: list[str],
    *,
    partitions: int,
    replication: int,
    timeout_s: float = 30.0,
    options: dict[str, Any] | None = None,
    configs: dict[str, dict[str, str]] | None = None,
) -> list[str]:
    """Create each missing topic (with its ``configs``, if any); returns the ones created.

    Existing topics keep their configs: operators own them once they exist.

    Raises:
        BackendUnavailable: the broker cannot be reached within ``timeout_s``.
    """
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000, **(options or {}))
        try:
            await admin.start()
            existing = set(await admin.list_topics())
            missing = [t for t in dict.fromkeys(topics) if t not in existing]
            if missing:
                with contextlib.suppress(TopicAlreadyExistsError):  # another daemon won the race
                    resp = await admin.create_topics(
                        [
                            NewTopic(
                                t,
                                num_partitions=partitions,
                                replication_factor=replication,
                                topic_configs=(configs or {}).get(t, {}),
                            )
                            for t in missing
                        ]
                    )
                    _raise_topic_errors(resp, replication)
                log.info("daemon.topics_created", topics=missing, partitions=partitions)
            return missing
        except (KafkaConnectionError, KafkaError, OSError) as exc:
            if asyncio.get_running_loop().time() > deadline:
                raise BackendUnavailable(f"kafka at {bootstrap} unreachable: {exc}") from exc
            log.warning("daemon.broker_waited", bootstrap=bootstrap, error=str(exc))
            await asyncio.sleep(0.5)
        finally:
            await admin.close()
