"""`agentmemd dlq`: dead letters listed with their cause, and sent again once it is fixed, each
to its own topic under its own key, through a real broker, daemon and Redis."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from consumers.client import MemoryClient
from consumers.errors import WriteRejected
from memory.config import IngestConfig
from tests.conftest import unique
from tests.helpers import isolated_settings, settings_env, start_daemon

pytestmark = pytest.mark.integration

AGENTMEMD = str(Path(sys.executable).parent / "agentmemd")


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENTMEMD, *args], env={**os.environ, "COLUMNS": "200", **env}, capture_output=True, text=True, timeout=120
    )


async def test_a_dead_letter_is_listed_and_sent_again_once_its_cause_is_fixed(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    name = unique("dlq-cli")
    tight = isolated_settings(name, kafka_bootstrap, redis_url, ingest=IngestConfig(max_content_bytes=1024))
    env = settings_env(tight)
    big = "The ledger close moved to the 3rd business day. " * 40  # ~2 KB: over the tight limit
    daemon = await start_daemon(tight)
    try:
        async with MemoryClient(bootstrap=kafka_bootstrap, topics=tight.topics, timeout_s=30) as c:
            with pytest.raises(WriteRejected, match="content larger than 1024 bytes"):
                await c.publish_document("dlq/ledger.md", big, version=1, wait=True)
        listed = await asyncio.to_thread(_cli, env, "dlq", "list", "--json")
        assert listed.returncode == 0, listed
        (letter,) = [json.loads(line) for line in listed.stdout.splitlines()]
        assert "content larger than 1024 bytes" in letter["reason"] and letter["topic"] == tight.topics.documents
        where = f"{letter['partition']}:{letter['offset']}"
        shown = await asyncio.to_thread(_cli, env, "dlq", "list")
        assert shown.returncode == 0 and where in shown.stdout and "content larger" in shown.stdout, shown
        mine = await asyncio.to_thread(_cli, env, "dlq", "list", "--json", "--tenant", "default")
        assert [json.loads(line)["offset"] for line in mine.stdout.splitlines()] == [letter["offset"]], mine
        # Another tenant in single tenancy: refused, not "no dead letters" (every one is default's).
        other = await asyncio.to_thread(_cli, env, "dlq", "list", "--tenant", "globex")
        assert other.returncode == 1 and "needs AGENTMEM_CONSUMER__TENANCY=topic" in other.stderr, other
        # The cause still stands: refused again, and the command says so.
        again = await asyncio.to_thread(_cli, env, "dlq", "replay", where, "--wait", "--timeout", "60")
        assert again.returncode == 1 and "dead-lettered again: content larger than 1024 bytes" in again.stdout, again
    finally:
        await daemon.stop()

    # Sent once already and refused: marked, listed as such.
    marked = await asyncio.to_thread(_cli, env, "dlq", "list", "--json")
    (shown_again,) = [d for d in map(json.loads, marked.stdout.splitlines()) if d["offset"] == letter["offset"]]
    assert shown_again["replayed"]["to"] == tight.topics.documents, shown_again
    assert shown_again["replayed"]["said"].startswith("dead-lettered again: content larger"), shown_again
    listed_text = " ".join((await asyncio.to_thread(_cli, env, "dlq", "list")).stdout.split())
    assert f"replayed {shown_again['replayed']['at']} to {tight.topics.documents}: dead-lettered again" in listed_text
    fixed = tight.model_copy(update={"ingest": IngestConfig(max_content_bytes=4096)})
    daemon = await start_daemon(fixed)
    try:
        # A send that was refused applied nothing: the letter is sent again without --again.
        sent = await asyncio.to_thread(_cli, env, "dlq", "replay", where, "--wait", "--timeout", "60")
        assert sent.returncode == 0, sent
        assert f"{where}: sent to {tight.topics.documents} under key 'dlq/ledger.md': indexed" in sent.stdout
        relisted = await asyncio.to_thread(_cli, env, "dlq", "list", "--json")
        (now,) = [d for d in map(json.loads, relisted.stdout.splitlines()) if d["offset"] == letter["offset"]]
        assert now["replayed"]["said"].startswith("indexed"), now
        # Applied once: not sent a second time unless asked.
        twice = await asyncio.to_thread(_cli, env, "dlq", "replay", where, "--wait", "--timeout", "60")
        said = " ".join(twice.stdout.split())
        assert twice.returncode == 1 and f"{where}: not sent: sent again already" in said and "--again" in said, twice
        thrice = await asyncio.to_thread(_cli, env, "dlq", "replay", where, "--again", "--wait", "--timeout", "60")
        assert thrice.returncode == 0 and f"{where}: sent to {tight.topics.documents}" in thrice.stdout, thrice
        async with MemoryClient(bootstrap=kafka_bootstrap, topics=tight.topics, timeout_s=30) as c:
            found = await c.get(["dlq/ledger.md"])
        assert (found.items[0].status, found.items[0].content) == ("found", big)
        missing = await asyncio.to_thread(_cli, env, "dlq", "replay", "0:999999", "1:x")
        assert missing.returncode == 2 and "PARTITION:OFFSET" in missing.stderr, missing
        missing = await asyncio.to_thread(_cli, env, "dlq", "replay", "0:999999")
        assert missing.returncode == 1 and "0:999999: no such record" in missing.stdout, missing
        # An event that was itself wrong (over even the larger limit): its original, byte for
        # byte, corrected as a file and sent in its place, under its own key.
        async with MemoryClient(bootstrap=kafka_bootstrap, topics=tight.topics, timeout_s=30) as c:
            with pytest.raises(WriteRejected, match="content larger than 4096 bytes"):
                await c.publish_document("dlq/huge.md", big * 3, version=1, wait=True)
        listed = await asyncio.to_thread(_cli, env, "dlq", "list", "--json")
        (huge,) = [d for d in map(json.loads, listed.stdout.splitlines()) if "4096" in d["reason"]]
        at = f"{huge['partition']}:{huge['offset']}"
        original = await asyncio.to_thread(
            subprocess.run, [AGENTMEMD, "dlq", "original", at], env={**os.environ, **env}, capture_output=True
        )
        assert original.returncode == 0, original
        event = json.loads(original.stdout)
        assert (event["doc_id"], event["content"]) == ("dlq/huge.md", big * 3)
        short = tmp_path / "huge.json"
        short.write_text(json.dumps({**event, "content": big[:500]}))
        two = (at, at.replace(":", ":9"))
        both = await asyncio.to_thread(_cli, env, "dlq", "replay", *two, "--with", str(short))
        assert both.returncode == 2 and "one PARTITION:OFFSET" in both.stderr, both
        elsewhere = tmp_path / "elsewhere.json"
        elsewhere.write_text(json.dumps({**event, "doc_id": "dlq/other.md", "content": big[:500]}))
        moved = await asyncio.to_thread(_cli, env, "dlq", "replay", at, "--with", str(elsewhere))
        assert moved.returncode == 1 and "keyed 'dlq/other.md'" in " ".join(moved.stdout.split()), moved
        # A "fix" that is still wrong is refused again, and the real one needs no --again.
        still = tmp_path / "still.json"
        still.write_text(json.dumps({**event, "content": big * 3 + "!"}))
        wrong = await asyncio.to_thread(
            _cli, env, "dlq", "replay", at, "--with", str(still), "--wait", "--timeout", "60"
        )
        assert wrong.returncode == 1 and "dead-lettered again: content larger than 4096" in wrong.stdout, wrong
        fixed_up = await asyncio.to_thread(
            _cli, env, "dlq", "replay", at, "--with", str(short), "--wait", "--timeout", "60"
        )
        assert fixed_up.returncode == 0 and "under key 'dlq/huge.md': indexed" in fixed_up.stdout, fixed_up
        async with MemoryClient(bootstrap=kafka_bootstrap, topics=tight.topics, timeout_s=30) as c:
            found = await c.get(["dlq/huge.md"])
        assert (found.items[0].status, found.items[0].content) == ("found", big[:500])
    finally:
        await daemon.stop()


async def test_an_event_on_a_bare_topic_is_refused_and_sent_to_its_tenant(kafka_bootstrap: str, redis_url: str) -> None:
    """In topic tenancy an event published on the bare topic names no tenant: its writer is
    told (an ack saying why), it is dead-lettered, and `dlq replay --tenant` sends it to the
    tenant's topic, where it is applied."""
    from tests.helpers import topic_tenancy_daemon

    name = unique("dlq-bare")
    async with topic_tenancy_daemon(name, kafka_bootstrap, redis_url, ["acme"]) as (_, _client, settings):
        env = {**settings_env(settings), "AGENTMEM_CONSUMER__TENANCY": "topic"}
        async with MemoryClient(bootstrap=kafka_bootstrap, topics=settings.topics, timeout_s=30) as bare:
            with pytest.raises(WriteRejected, match="names no tenant") as refused:
                await bare.publish_document("kb/bare.md", "The bare topic names no tenant.", version=1, wait=True)
        assert refused.value.ack.error_code == "invalid_event"
        listed = await asyncio.to_thread(_cli, env, "dlq", "list", "--json")
        (letter,) = [json.loads(line) for line in listed.stdout.splitlines()]
        assert letter["topic"] == settings.topics.documents, letter
        where = f"{letter['partition']}:{letter['offset']}"
        # Sent back to the bare topic it would be refused again: not sent, and told why.
        back = await asyncio.to_thread(_cli, env, "dlq", "replay", where)
        said = " ".join(back.stdout.split())
        assert back.returncode == 1 and "names no tenant" in said and "--tenant NAME" in said, back
        moved = await asyncio.to_thread(
            _cli, env, "dlq", "replay", where, "--tenant", "acme", "--wait", "--timeout", "60"
        )
        assert moved.returncode == 0, moved
        assert f"sent to {settings.topics.documents}.acme under key 'kb/bare.md': indexed" in moved.stdout, moved
        async with MemoryClient(
            bootstrap=kafka_bootstrap, topics=settings.topics, tenant="acme", tenancy="topic", timeout_s=30
        ) as acme:
            found = await acme.get(["kb/bare.md"])
        assert (found.items[0].status, found.items[0].content) == ("found", "The bare topic names no tenant.")
        # A name that is no tenant's: refused, nothing sent.
        again = await asyncio.to_thread(_cli, env, "dlq", "replay", where, "--again", "--tenant", "bad.name")
        assert again.returncode == 1 and "is not" in again.stdout, again
