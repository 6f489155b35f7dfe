"""Settings for test daemons: isolated names, fast group joins, and the environment a subprocess reads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from consumers.config import ConsumerConfig
from daemon.settings import Settings, namespaced

if TYPE_CHECKING:
    pass


# tansu holds a group's first join for half the session timeout: 2 s instead of 5 s for every
# daemon the suite starts, and a killed daemon's partitions move in 4 s instead of 10 (the
# heartbeat follows: a third of it).
TEST_SESSION_MS = 4000


def isolated_settings(name: str, kafka_bootstrap: str, redis_url: str, **over: Any) -> Settings:
    """``daemon.settings.namespaced`` with test defaults: 2 partitions, no HTTP server, the
    short consumer session of ``TEST_SESSION_MS`` unless the given ``consumer`` sets its own."""
    consumer = over.pop("consumer", ConsumerConfig(group_id=name)).with_default_session(TEST_SESSION_MS)
    return namespaced(
        name,
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        topic_partitions=over.pop("topic_partitions", 2),
        http_port=over.pop("http_port", 0),
        consumer=consumer,
        **over,
    )


def settings_env(settings: Settings) -> dict[str, str]:
    """The same settings as AGENTMEM_ environment variables, for a daemon subprocess."""
    env = {
        "AGENTMEM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "AGENTMEM_REDIS_URL": settings.redis_url,
        "AGENTMEM_TOPIC_PARTITIONS": str(settings.topic_partitions),
        "AGENTMEM_CONSUMER__GROUP_ID": settings.consumer.group_id,
        "AGENTMEM_INDEX__NAME": settings.index.name,
        "AGENTMEM_LOG_FORMAT": "json",
        "AGENTMEM_HTTP_PORT": str(settings.http_port),
        "AGENTMEM_CONSUMER__SESSION_TIMEOUT_MS": str(settings.consumer.session_timeout_ms),
    }
    if settings.consumer.heartbeat_interval_ms is not None:
        env["AGENTMEM_CONSUMER__HEARTBEAT_INTERVAL_MS"] = str(settings.consumer.heartbeat_interval_ms)
    for field, value in settings.topics.model_dump().items():
        env[f"AGENTMEM_TOPICS__{field.upper()}"] = value
    return env
