"""The directory: per tenant, its documents and its agents, kept with the chunks.

The explorer lists a tenant's documents and agents a page at a time. Grouping the chunks
(``FT.AGGREGATE``) costs what the tenant holds (~150 ms at 100,000 chunks, measured); the
directory costs what the page holds. It changes in the same transaction as a doc's chunk set
(a write, the last step of a sliced write, a reindex's copy), so it is exact whenever the
chunks are, after a kill -9 too.

What a doc is listed under follows from its id alone (the prefixes are reserved by kind):
a turn (``transcript:<agent>/…``) under its agent, a community summary (``community:…``)
nowhere, anything else as a document. Only a generation created empty keeps a whole
directory (``directory_flag``); an older one is listed by aggregation until a reindex.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memory import keys
from memory.conversation import agent_of
from memory.records import COMMUNITY_PREFIX, ChunkRecord

# One turn's change to its agent's entry, atomic (an agent leaves the listing with its last
# chunk, which only the count, read in the transaction, can tell).
# KEYS: the agents set, the chunk counts, the agent's turns. ARGV: the agent, the turn's doc
# id, the change in its chunk count, its latest time ("" when it has no chunks left).
_TURN_SCRIPT = """
if ARGV[4] == '' then
  redis.call('ZREM', KEYS[3], ARGV[2])
else
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[2])
end
local n = redis.call('HINCRBY', KEYS[2], ARGV[1], ARGV[3])
if n > 0 then
  redis.call('ZADD', KEYS[1], 0, ARGV[1])
else
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[3])
end
return n
"""


@dataclass(frozen=True, slots=True)
class DocChange:
    """A doc's chunk set before and after one write: what its directory entry needs."""

    doc_id: str
    was: int  # chunks it held before
    now: int  # chunks it holds after
    last: float | None  # its latest chunk time after (None: no chunks)

    @classmethod
    def of(cls, doc_id: str, was: int, chunks: Sequence[ChunkRecord]) -> DocChange:
        """The change a write of ``chunks`` over ``was`` stored chunks makes."""
        return cls(doc_id, was, len(chunks), max((c.timestamp for c in chunks), default=None))


def queue_change(pipe: Any, name: str, gen: int, tenant: str, change: DocChange) -> None:
    """Queue, in a doc's write transaction, its directory entry's change."""
    if change.doc_id.startswith(COMMUNITY_PREFIX):  # never listed: the graph view shows them
        return
    agent = agent_of(change.doc_id)
    stamp = "" if change.now == 0 or change.last is None else repr(float(change.last))
    if agent is not None:
        script_keys = (
            keys.dir_agents_key(name, gen, tenant),
            keys.dir_chunks_key(name, gen, tenant),
            keys.dir_turns_key(name, gen, tenant, agent),
        )
        pipe.eval(_TURN_SCRIPT, 3, *script_keys, agent, change.doc_id, change.now - change.was, stamp)
        return
    docs, last = keys.dir_docs_key(name, gen, tenant), keys.dir_last_key(name, gen, tenant)
    if stamp:
        pipe.zadd(docs, {change.doc_id: 0})
        pipe.hset(last, change.doc_id, stamp)
    else:
        pipe.zrem(docs, change.doc_id)
        pipe.hdel(last, change.doc_id)
