"""Authenticated connections: Redis AUTH/ACL for real; Kafka SASL/TLS settings reach the clients.

The embedded Redis build has no TLS and the embedded broker speaks neither SASL nor TLS to
aiokafka, so those two are checked at the settings -> client-arguments boundary only.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aredis
from faststream.security import BaseSecurity, SASLPlaintext, SASLScram512
from pydantic import SecretStr
from structlog.testing import capture_logs

from consumers.config import KafkaSecurity
from daemon.connections import redis_client
from daemon.launcher import free_port, start_redis
from memory.errors import Unauthorized
from tests.conftest import unique
from tests.helpers import daemon_and_client, eventually, isolated_settings, read_dlq, start_daemon

pytestmark = pytest.mark.integration


async def test_redis_acl_user_works_and_bad_credentials_fail_fast(kafka_bootstrap: str, tmp_path: Path) -> None:
    """With an ACL user the daemon runs end to end; a wrong or missing password is `unauthorized`
    at once; a refusal mid-run is waited out and logged as an error; no password is ever logged."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = start_redis(url, data_dir=tmp_path / "redis", password="admin-secret")
    try:
        admin = aredis.from_url(url, password="admin-secret")
        await admin.execute_command("ACL", "SETUSER", "agentmem", "on", ">agent-secret", "~*", "&*", "+@all")
        await admin.aclose()
        with capture_logs() as logs:
            name = unique("redis-acl")
            for username, password in (("agentmem", "wrong-pw-7Q"), ("", "")):
                bad = isolated_settings(
                    name, kafka_bootstrap, url, redis_username=username, redis_password=SecretStr(password)
                )
                with pytest.raises(Unauthorized):
                    await start_daemon(bad, ready_timeout_s=20)
            settings = isolated_settings(
                name, kafka_bootstrap, url, redis_username="agentmem", redis_password=SecretStr("agent-secret")
            )
            assert "agent-secret" not in json.dumps(settings.model_dump(mode="json"))  # secrets never serialize
            async with daemon_and_client(settings) as (daemon, client):
                await client.send(
                    settings.topics.documents,
                    {
                        "event_id": "e",
                        "op": "upsert",
                        "doc_id": "acl.md",
                        "version": 1,
                        "content": "stored through an ACL user",
                    },
                )

                async def stored() -> bool:
                    return bool(await daemon.index.chunk_ids("acl.md"))

                await eventually(stored, what="doc stored through the ACL user")
                _, reply = await client.ask({"query_id": uuid.uuid4().hex, "search_text": "ACL user", "top_k": 1})
                assert reply["results"][0]["doc_id"] == "acl.md"

                # The ACL loses the transaction commands mid-run: the next doc waits (it is the
                # deployment's fault, not the doc's), and is stored once access is back.
                admin = aredis.from_url(url, password="admin-secret")
                await admin.execute_command("ACL", "SETUSER", "agentmem", "-@transaction")
                await client.send(
                    settings.topics.documents,
                    {
                        "event_id": "e2",
                        "op": "upsert",
                        "doc_id": "acl2.md",
                        "version": 1,
                        "content": "after the refusal",
                    },
                )
                await asyncio.sleep(3)
                assert await daemon.index.versions(["acl2.md"]) == {}
                await admin.execute_command("ACL", "SETUSER", "agentmem", "+@all")
                await admin.aclose()

                async def stored_after() -> bool:
                    return bool(await daemon.index.chunk_ids("acl2.md"))

                await eventually(stored_after, timeout=30, what="doc stored once access is back")
                assert [
                    d for d in await read_dlq(client, 1, timeout=3) if "acl2.md" in (d["original_text"] or "")
                ] == []
        # No password reaches a log line, not even a refusal's; the refusal mid-run is an error.
        logged = json.dumps(logs, default=str)
        assert "agent-secret" not in logged and "wrong-pw-7Q" not in logged and "admin-secret" not in logged
        assert any(e["event"] == "ingest.backend_retried" and e["log_level"] == "error" for e in logs)
        probe = redis_client(settings)
        assert await probe.acl_whoami() == "agentmem"
        await probe.aclose()
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("protocol", "mechanism", "cls", "tls"),
    [
        ("SASL_PLAINTEXT", "PLAIN", SASLPlaintext, False),
        ("SASL_SSL", "SCRAM-SHA-512", SASLScram512, True),
        ("SSL", "PLAIN", BaseSecurity, True),
    ],
)
def test_kafka_security_settings_reach_aiokafka_and_faststream(
    protocol: str, mechanism: str, cls: type, tls: bool
) -> None:
    """SASL user/password and TLS context are handed to aiokafka and FastStream exactly as configured."""
    sec = KafkaSecurity(
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        sasl_username="svc",
        sasl_password=SecretStr("pw"),
        ssl_check_hostname=False,
    )
    kwargs = sec.aiokafka_kwargs()
    assert kwargs["security_protocol"] == protocol
    assert isinstance(kwargs.get("ssl_context"), ssl.SSLContext) is tls
    if protocol.startswith("SASL"):
        assert (kwargs["sasl_mechanism"], kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == (
            mechanism,
            "svc",
            "pw",
        )
    fs = sec.faststream_security()
    assert type(fs) is cls and fs.use_ssl is tls
    assert KafkaSecurity().faststream_security() is None and KafkaSecurity().aiokafka_kwargs() == {
        "security_protocol": "PLAINTEXT"
    }
