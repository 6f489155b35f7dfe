"""Clients built from settings, with credentials and TLS passed through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis.asyncio as aredis

from consumers.client import MemoryClient
from daemon.settings import Settings


def redis_client(settings: Settings) -> aredis.Redis:
    """A Redis client for ``settings.redis_url`` with the configured user, password and TLS files."""
    kwargs: dict[str, Any] = {"socket_timeout": 10, "socket_connect_timeout": 5, "health_check_interval": 15}
    if settings.redis_username:
        kwargs["username"] = settings.redis_username
    if settings.redis_password.get_secret_value():
        kwargs["password"] = settings.redis_password.get_secret_value()
    if settings.redis_url.startswith("rediss://"):
        for key in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            value = getattr(settings, f"redis_{key}")
            if value:
                kwargs[key] = value
    return aredis.from_url(settings.redis_url, **kwargs)


def kafka_options(settings: Settings) -> dict[str, Any]:
    """aiokafka keyword arguments for the configured Kafka security."""
    return settings.kafka_security.aiokafka_kwargs()


def memory_client(settings: Settings | None = None, *, tenant: str | None = None, **options: Any) -> MemoryClient:
    """A ``MemoryClient`` of the daemon the settings describe (``AGENTMEM_*`` variables, a ``.env``
    in the working directory, the config file: as the CLI reads them), with its broker, topics,
    Kafka security, content limit and tenancy. ``tenant`` and ``options`` (``timeout_s``,
    ``reply_partition``, ...) as for ``MemoryClient``.

    Raises:
        ValidationError: the settings are invalid (``agentmemd config show`` says which).
        ConfigError: ``AGENTMEM_CONFIG_FILE`` names a file that cannot be read as settings.
        InvalidRequest: ``tenant`` names one in single tenancy, or is no valid tenant name.
    """
    settings = Settings() if settings is None else settings
    return MemoryClient(
        unreachable_hint=_default_broker_hint(settings),
        bootstrap=settings.kafka_bootstrap,
        topics=settings.topics,
        tenant=tenant,
        kafka_options=kafka_options(settings),
        max_content_bytes=settings.ingest.max_content_bytes,
        max_future_s=settings.ingest.max_future_s,
        tenancy=settings.consumer.tenancy,
        **options,
    )


def _default_broker_hint(settings: Settings) -> str:
    """Where the broker's address would have come from, when it is the default ('' if set)."""
    if "kafka_bootstrap" in settings.model_fields_set:
        return ""
    return (
        f"{settings.kafka_bootstrap} is the default: AGENTMEM_KAFKA_BOOTSTRAP is not set, and no "
        f".env in {Path.cwd()} sets it; set it, or run where the daemon's .env is"
    )
