"""Create the contract's topics when they are missing (standard Kafka admin API only), at
start-up and again whenever the broker has lost them, with every seen tenant's in topic
tenancy, and a tenant's on an operator's command."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import structlog
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    InvalidConfigurationError,
    KafkaConnectionError,
    KafkaError,
    PolicyViolationError,
    TopicAlreadyExistsError,
    for_code,
)

from consumers.topic_names import tenant_topic
from daemon.connections import kafka_options
from daemon.settings import Settings
from memory.errors import BackendUnavailable, MemdError

log = structlog.get_logger()


#: What a broker answers when it will not take a topic config (managed Kafka caps
#: max.message.bytes, e.g. at 8 MiB): the topic is created without it instead.
_CONFIG_REFUSED = (InvalidConfigurationError.errno, PolicyViolationError.errno)


def _config_refused(resp: Any, configs: dict[str, dict[str, str]]) -> dict[str, str]:
    """Topics of ``resp`` refused for their configs: name -> the broker's reason."""
    refused = {}
    for name, code, *message in getattr(resp, "topic_errors", ()):
        if code in _CONFIG_REFUSED and configs.get(name):
            refused[name] = f"{for_code(code).__name__}: {(message[0] if message else None) or ''}"
    return refused


def fallback_configs(
    asked: dict[str, dict[str, str]], refused: dict[str, str], keep: tuple[str, ...]
) -> dict[str, dict[str, str]]:
    """The configs to ask again for the ``refused`` topics: of what was ``asked``, only the
    ``keep`` keys (pure)."""
    return {t: {k: v for k, v in asked[t].items() if k in keep} for t in refused}


def _raise_topic_errors(resp: Any, replication: int) -> None:
    """Raise the topic creation errors the admin client returns in its response instead of
    raising them, so a topic the broker refused (a replication factor above its brokers, no
    CREATE permission) is never taken for created."""
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
    wanted = configs or {}
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000, **(options or {}))
        try:
            await admin.start()
            existing = set(await admin.list_topics())
            missing = [t for t in dict.fromkeys(topics) if t not in existing]
            if missing:
                with contextlib.suppress(TopicAlreadyExistsError):  # another daemon won the race

                    def new(t: str, topic_configs: dict[str, str]) -> NewTopic:
                        return NewTopic(
                            t, num_partitions=partitions, replication_factor=replication, topic_configs=topic_configs
                        )

                    asked = {t: wanted.get(t, {}) for t in missing}
                    resp = await admin.create_topics([new(t, asked[t]) for t in missing])
                    # A broker that caps retention (a managed one) may refuse only that: the
                    # record size is worth keeping, so it is asked for alone first.
                    for keep in (("max.message.bytes",), ()):
                        refused = _config_refused(resp, asked)
                        if not refused:
                            break
                        # Better the topic with the broker's own limits than no daemon at all.
                        log.warning(
                            "daemon.topic_config_refused",
                            topics=refused,
                            configs={t: asked[t] for t in refused},
                            fix=f"asked again with {' '.join(keep) or 'the broker defaults'}: raise "
                            "max.message.bytes as far as the broker allows (larger events are refused by the "
                            "broker, the client says so), keep the documents and transcripts topics' events "
                            "(retention.ms -1, or as long as the broker allows: a reindex with a new model replays "
                            "them), and give the requests and replies topics a short retention.ms",
                        )
                        asked = fallback_configs(asked, refused, keep)
                        resp = await admin.create_topics([new(t, asked[t]) for t in refused])
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


async def ensure_contract_topics(settings: Settings, *, timeout_s: float) -> list[str]:
    """Create the contract's missing topics as configured; returns those created."""
    return await ensure_topics(
        settings.kafka_bootstrap,
        settings.topics.all(),
        partitions=settings.topic_partitions,
        replication=settings.topic_replication,
        timeout_s=timeout_s,
        options=kafka_options(settings),
        configs=settings.topics.configs(
            settings.ingest.max_content_bytes, settings.topic_exchange_retention_ms, settings.topic_event_retention_ms
        ),
    )


def tenant_topics(settings: Settings, tenant: str) -> list[str]:
    """A tenant's topics in topic tenancy: its documents, transcripts and requests, which the
    daemon reads, and its replies, where a request without ``reply_to`` is answered.

    Raises:
        InvalidRequest: ``tenant`` is no valid tenant name.
    """
    t = settings.topics
    return [tenant_topic(base, tenant) for base in (t.documents, t.transcripts, t.requests, t.replies)]


@contextlib.asynccontextmanager
async def _tenant_admin(
    settings: Settings, tenant: str, *, timeout_s: float, failing: str
) -> AsyncIterator[tuple[AIOKafkaAdminClient, list[str]]]:
    """An admin client and those of ``tenant``'s topics the broker has; a broker error in the
    block is ``BackendUnavailable`` ("topics ``failing``").

    Raises:
        InvalidRequest: ``tenant`` is no valid tenant name.
        BackendUnavailable: the broker cannot be reached within ``timeout_s``.
    """
    wanted = tenant_topics(settings, tenant)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.kafka_bootstrap,
        request_timeout_ms=int(timeout_s * 1000),
        **kafka_options(settings),
    )
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        there = set(await admin.list_topics())
        yield admin, [t for t in wanted if t in there]
    except (KafkaConnectionError, KafkaError, OSError, TimeoutError) as exc:
        raise BackendUnavailable(f"kafka at {settings.kafka_bootstrap}: topics {failing}: {exc}") from exc
    finally:
        await admin.close()


async def existing_tenant_topics(settings: Settings, tenant: str, *, timeout_s: float = 10.0) -> list[str]:
    """Those of ``tenant``'s topics the broker has.

    Raises:
        InvalidRequest: ``tenant`` is no valid tenant name.
        BackendUnavailable: the broker cannot be reached within ``timeout_s``.
    """
    async with _tenant_admin(settings, tenant, timeout_s=timeout_s, failing="unread") as (_, there):
        return there


async def ensure_tenant_topics(settings: Settings, tenant: str, *, timeout_s: float) -> list[str]:
    """Create ``tenant``'s missing topics, the event ones with the daemon's record size; returns
    those created.

    Raises:
        InvalidRequest: ``tenant`` is no valid tenant name.
        BackendUnavailable: the broker cannot be reached within ``timeout_s``.
    """
    return await ensure_tenants_topics(settings, [tenant], timeout_s=timeout_s)


async def ensure_tenants_topics(settings: Settings, tenants: Sequence[str], *, timeout_s: float) -> list[str]:
    """``ensure_tenant_topics`` for each of ``tenants``, in one listing of the broker's topics."""
    if not tenants:
        return []
    configs = settings.topics.configs(
        settings.ingest.max_content_bytes, settings.topic_exchange_retention_ms, settings.topic_event_retention_ms
    )
    return await ensure_topics(
        settings.kafka_bootstrap,
        [name for tenant in tenants for name in tenant_topics(settings, tenant)],
        partitions=settings.topic_partitions,
        replication=settings.topic_replication,
        timeout_s=timeout_s,
        options=kafka_options(settings),
        configs={tenant_topic(base, t): config for t in tenants for base, config in configs.items()},
    )


async def ensure_daemon_topics(
    settings: Settings, tenants: Callable[[], Awaitable[Sequence[str]]], *, timeout_s: float
) -> list[str]:
    """The contract's topics and, in topic tenancy, those of every tenant seen (``tenants``,
    ``TenantRegistry.with_topics``): the missing ones created; returns those."""
    created = await ensure_contract_topics(settings, timeout_s=timeout_s)
    if settings.consumer.tenancy == "topic":
        created += await ensure_tenants_topics(settings, await tenants(), timeout_s=timeout_s)
    return created


async def watch_topics(
    settings: Settings, tenants: Callable[[], Awaitable[Sequence[str]]], halt: asyncio.Event
) -> None:
    """Every ``topic_check_s`` until ``halt``, recreate the topics the broker lost: the
    contract's and, in topic tenancy, every seen tenant's (``tenants``)."""
    # A broker that comes back empty (tansu keeps its log in memory) has lost our topics;
    # recreating them lets the consumers rejoin by themselves, and a tenant's clients find
    # their topics again. Real Kafka keeps them.
    while not halt.is_set():
        await asyncio.sleep(settings.topic_check_s)
        try:
            created = await ensure_daemon_topics(settings, tenants, timeout_s=settings.topic_check_s)
        except MemdError as exc:  # the broker, or Redis for the tenant list
            log.warning("daemon.broker_check_failed", error=str(exc))
            continue
        if created:
            log.warning("daemon.topics_recreated", topics=created)


async def delete_tenant_topics(settings: Settings, tenant: str, *, timeout_s: float) -> list[str]:
    """Delete ``tenant``'s topics (``tenant_topics``) where they exist, with every event and
    reply they hold; returns those deleted.

    Raises:
        InvalidRequest: ``tenant`` is no valid tenant name.
        BackendUnavailable: the broker cannot be reached within ``timeout_s``, or refused.
    """
    async with _tenant_admin(settings, tenant, timeout_s=timeout_s, failing="not deleted") as (admin, there):
        if there:
            resp = await admin.delete_topics(there, timeout_ms=int(timeout_s * 1000))
            failed = [f"{name}: {for_code(code).__name__}" for name, code, *_ in resp.topic_error_codes if code]
            if failed:
                raise BackendUnavailable(f"kafka refused to delete topic(s) {'; '.join(failed)}")
            log.info("daemon.topics_deleted", topics=there)
        return there
