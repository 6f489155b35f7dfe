"""The records of one graph's community summaries, under the graph's hash tag:

- ``summary:<cid>``: the summary record (its text, the generation it read, …);
- ``summary_token``: per community, the fencing token of its last stored summary or drop;
- ``pending_drop``: removed communities whose summary chunks may still be in the index;
- ``withdraw``: communities whose summary quotes a removed document, awaiting withdrawal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aredis

from graph import scripts
from memory import keys
from memory.index import translate_errors
from memory.schema import as_str


class SummaryRecords:
    """The summary records of one graph (``prefix``: its keys' prefix and hash tag)."""

    def __init__(self, *, client: aredis.Redis, prefix: str) -> None:
        self._r = client
        self.prefix = prefix
        self._commit = client.register_script(scripts.COMMIT_SUMMARY)

    def _k(self, suffix: str) -> str:
        return keys.graph_key(self.prefix, suffix)

    async def commit(self, cid: str, token: int, gen: str, summary: dict[str, Any] | None) -> tuple[bool, bool]:
        """Store a summary record (``None``: drop it) and clear the mark, fenced by ``token``.

        Nothing is stored when the community no longer exists or a summary of a later token
        is already stored; the mark is cleared only if the community was not marked again
        since ``gen``.

        Returns:
            (written, cleared).
        """
        fields: list[str] = []
        for k, v in (summary or {}).items():
            fields += [k, json.dumps(v)]
        async with translate_errors("summary write"):
            res = await self._commit(keys=[self._k(f"summary:{cid}")], args=[self.prefix, cid, token, gen, *fields])
        return bool(int(res[0])), bool(int(res[1]))

    async def pending_drops(self) -> list[str]:
        """Removed communities whose summary chunks may still be in the index."""
        async with translate_errors("graph read"):
            return sorted(as_str(c) for c in await self._r.smembers(self._k("pending_drop")))

    async def dropped(self, cid: str) -> None:
        """A removed community's summary chunk is gone from the index."""
        async with translate_errors("graph write"):
            await self._r.srem(self._k("pending_drop"), cid)

    async def token(self, cid: str) -> int | None:
        """The fencing token of the community's last stored summary or drop, if any."""
        async with translate_errors("summary read"):
            raw = await self._r.hget(self._k("summary_token"), cid)
        return int(raw) if raw is not None else None

    async def withdrawn(self, cid: str) -> None:
        """The community's summary is out of the index: no longer awaiting withdrawal."""
        async with translate_errors("graph write"):
            await self._r.srem(self._k("withdraw"), cid)

    async def writers(self, cids: Sequence[str]) -> dict[str, str | None]:
        """What wrote each community's summary (a litellm model, or ``extractive``); ``None``
        for a community with no summary record."""
        if not cids:
            return {}
        async with translate_errors("summary read"), self._r.pipeline(transaction=False) as pipe:
            for cid in cids:
                pipe.hget(self._k(f"summary:{cid}"), "model")
            raw = await pipe.execute()
        return {cid: None if m is None else json.loads(m) for cid, m in zip(cids, raw, strict=True)}

    async def get(self, cid: str) -> dict[str, Any] | None:
        """A community's summary record, if written."""
        async with translate_errors("summary read"):
            raw = await self._r.hgetall(self._k(f"summary:{cid}"))
        return {as_str(k): json.loads(v) for k, v in raw.items()} if raw else None


async def record_summarizer(client: aredis.Redis, name: str, summarizer: str) -> None:
    """Record what this daemon's summary workers write with (``GraphConfig.summarizer``): the
    one ``graph resummarize`` compares summaries against, whatever its own settings say."""
    async with translate_errors("summarizer record"):
        await client.set(keys.summarizer_key(name), json.dumps({"summarizer": summarizer, "at": time.time()}))


async def recorded_summarizer(client: aredis.Redis, name: str) -> tuple[str, float] | None:
    """What the daemons last started their summary workers with, and when; ``None`` if none did."""
    async with translate_errors("summarizer read"):
        raw = await client.get(keys.summarizer_key(name))
    if raw is None:
        return None
    d = json.loads(raw)
    return str(d["summarizer"]), float(d["at"])
