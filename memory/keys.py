"""The Redis key layout: every key and search index an index name owns, named in one place.

Under an index name ``<name>`` (it holds no ``:``)::

    <name>                          alias of the active generation's search index
    <name>-g<N>                     the search index of generation N            physical_name
    <name>:generations              hash: the generation registry               registry_key
    <name>:writing                  set: every write marker key set (and a
                                    sentinel once complete)                    writing_key
    <name>:g<N>:                    root of every key of generation N            key_root
        chunk:<tenant>:<chunk_id>   hash: one chunk (the search index's prefix)  chunk_key
        ver:<tenant>:<doc_id>       the doc's last applied version (kept after
                                    a delete, as a tombstone)                    ver_key
        doc:<tenant>:<doc_id>       set: the doc's chunk ids                     doc_key
        wr:<tenant>:<doc_id>        a sliced write's marker (memory.visibility)  marker_key
        hist:<tenant>:<doc_id>      list: the doc's earlier versions, newest
                                    first (memory.index.history)                history_key
        dir                         set when the generation was created empty:
                                    its directory is whole                       directory_flag
        dir:docs:<tenant>           sorted set (scores 0: code point order): the
                                    tenant's documents                           dir_docs_key
        dir:last:<tenant>           hash: a document's latest chunk time         dir_last_key
        dir:agents:<tenant>         sorted set (scores 0): agents with turns     dir_agents_key
        dir:chunks:<tenant>         hash: an agent's turn chunk count            dir_chunks_key
        dir:turns:<tenant>:<agent>  sorted set: an agent's turn doc ids by time  dir_turns_key
    <name>:poison                   sorted set: refused query digests            poison_key
    <name>:poison:version           bumped on every change of that set           poison_version_key
    <name>:<kind>:<topic>:<partition>:<offset>:<stamp>
                                    a record's attempts / dead-letter mark       attempt_key
    <name>:tenants                  set: every tenant a daemon has seen          tenants_key
    <name>:erased                   hash: each erased tenant -> its erasure      erased_key
    <name>:summarizer               the summarizer the daemons last started with summarizer_key
    <name>:daemons                  hash: each running daemon's standing         daemons_key
    <name>:dlq:replayed             hash: each dead letter sent again            replayed_key
    <name>:lengthprobe:<token>      a scratch search index and its one key, for
                                    doctor's probe of BM25's lengths, dropped
                                    after it (the colon: no index or alias's)  length_probe
    {<name>:<tenant>}:g:            root of one tenant's entity graph (one hash
                                    slot: its Lua scripts touch many keys)       graph_prefix
        nodes, edges, comms, ent_comm   hashes: entities, co-occurrence weights,
                                    communities, entity -> its communities
        contrib:<doc_id>            a doc's contribution (JSON, versioned)
        docs                        sorted set: the docs with a contribution, by id (a forget's listing)
        ent_docs:<key>, ent_chunks:<key>  sets: the docs and chunks naming an entity
        stale, stale_q, stale_first, stale_docs:<cid>, gen, fence
                                    the stale-summary queue and its fencing (graph.stale_queue)
        summary:<cid>, summary_token, summary_failures, failures, claim:<cid>, lock:<name>
                                    summaries, their claims and leases (graph.leases)
        drift, last_recompute, pending_drop, events  recompute bookkeeping

Tenants never share a key: the tenant (no ``:`` allowed) leads every per-doc key, and the
search legs read a chunk's tenant and id back from its key (``chunk_key_parts``). Dropping
a generation is deleting its search index and every key under its root.
"""

from __future__ import annotations

import re

# Names hold no colon, so the generation is the first ``:g<N>:`` of a chunk's key.
_KEY_GENERATION = re.compile(r"^[^:]+:g(\d+):chunk:")
# Neither names nor tenants hold a colon, so a chunk's key splits exactly (see chunk_key_parts).
_CHUNK_KEY = re.compile(r"^([^:]+:g(\d+):chunk:)([^:]*):(.*)$", re.DOTALL)


def physical_name(name: str, generation: int) -> str:
    """The RediSearch index of one generation (the alias ``name`` points at the active one)."""
    return f"{name}-g{generation}"


def generation_of(name: str, physical: str) -> int | None:
    """The generation whose index ``physical`` is (``physical_name``'s inverse); None if it is
    not one of ``name``'s."""
    found = re.fullmatch(re.escape(name) + r"-g([0-9]+)", physical)
    return int(found.group(1)) if found else None


def registry_key(name: str) -> str:
    """The hash that records the active and building generations and their specs."""
    return f"{name}:generations"


def writing_key(name: str) -> str:
    """The set that lists the write marker keys set in the index's generations (those gone
    are pruned now and then), and a sentinel once complete: a query whose winners' read finds
    none of them standing skips reading the markers of its candidates' docs."""
    return f"{name}:writing"


def key_root(name: str, generation: int) -> str:
    """Prefix of every key (chunks, versions, chunk sets) that belongs to one generation."""
    return f"{name}:g{generation}:"


def chunk_prefix(name: str, generation: int) -> str:
    """Prefix of a generation's chunk hashes: the prefix its search index covers."""
    return f"{key_root(name, generation)}chunk:"


def ver_prefix(name: str, generation: int) -> str:
    """Prefix of a generation's stored doc versions."""
    return f"{key_root(name, generation)}ver:"


def doc_prefix(name: str, generation: int) -> str:
    """Prefix of a generation's per-doc chunk sets."""
    return f"{key_root(name, generation)}doc:"


def writing_sentinel(name: str) -> str:
    """The member that says the list at ``writing_key`` is complete (never a key)."""
    return f"{name}:writing:complete"


def marker_pattern(name: str) -> str:
    """A SCAN pattern that matches the write markers of every generation of ``name`` (and
    more: its ``*`` matches ``:`` too; see :func:`is_marker_key`)."""
    return f"{name}:g*:wr:*"


def is_marker_key(name: str, key: str) -> bool:
    """Whether ``key`` is a write marker of one of ``name``'s generations."""
    return re.match(rf"{re.escape(name)}:g\d+:wr:", key) is not None


def marker_prefix(name: str, generation: int) -> str:
    """Prefix of a generation's write markers."""
    return f"{key_root(name, generation)}wr:"


def check_tenant(tenant: str) -> str:
    """``tenant``, if it can lead a key: not empty, no colon.

    Tenants are checked where they come in (``consumers.decoding``); every write checks again
    before its first key, as the search legs read the tenant back from a chunk's key
    (``chunk_key_parts``) and two tenants must never share one.

    Raises:
        ValueError: an empty tenant or one holding a colon.
    """
    if not tenant or ":" in tenant:
        raise ValueError(f"tenant {tenant!r} cannot lead a key (empty, or holds a colon)")
    return tenant


def chunk_key(name: str, generation: int, tenant: str, chunk_id: str) -> str:
    """The hash of one chunk.

    Raises:
        ValueError: a tenant that cannot lead a key (``check_tenant``).
    """
    return f"{chunk_prefix(name, generation)}{check_tenant(tenant)}:{chunk_id}"


def chunk_key_parts(key: str) -> tuple[str, int, str, str] | None:
    """A chunk's key read back: its generation's chunk prefix, the generation, the tenant and
    the chunk id; None for another key. Exact: neither a name nor a tenant holds a colon."""
    found = _CHUNK_KEY.match(key)
    if found is None:
        return None
    return found.group(1), int(found.group(2)), found.group(3), found.group(4)


def ver_key(name: str, generation: int, tenant: str, doc_id: str) -> str:
    """The doc's last applied version."""
    return f"{ver_prefix(name, generation)}{tenant}:{doc_id}"


def doc_key(name: str, generation: int, tenant: str, doc_id: str) -> str:
    """The set of the doc's chunk ids."""
    return f"{doc_prefix(name, generation)}{tenant}:{doc_id}"


def marker_key(name: str, generation: int, tenant: str, doc_id: str) -> str:
    """The doc's write marker (``memory.visibility``): only while (or just after) it was
    written in slices."""
    return f"{marker_prefix(name, generation)}{tenant}:{doc_id}"


def history_key(name: str, generation: int, tenant: str, doc_id: str) -> str:
    """The doc's earlier versions (a list, newest first)."""
    return f"{key_root(name, generation)}hist:{tenant}:{doc_id}"


def directory_flag(name: str, generation: int) -> str:
    """Set when the generation was created empty: every write to it kept its directory."""
    return f"{key_root(name, generation)}dir"


def dir_docs_key(name: str, generation: int, tenant: str) -> str:
    """The tenant's documents (a sorted set, every score 0: read in code point order)."""
    return f"{key_root(name, generation)}dir:docs:{tenant}"


def dir_last_key(name: str, generation: int, tenant: str) -> str:
    """Hash: each of the tenant's documents -> its latest chunk time."""
    return f"{key_root(name, generation)}dir:last:{tenant}"


def dir_agents_key(name: str, generation: int, tenant: str) -> str:
    """The tenant's agents that have turns (a sorted set, every score 0)."""
    return f"{key_root(name, generation)}dir:agents:{tenant}"


def dir_chunks_key(name: str, generation: int, tenant: str) -> str:
    """Hash: each of the tenant's agents -> how many turn chunks it has."""
    return f"{key_root(name, generation)}dir:chunks:{tenant}"


def dir_turns_key(name: str, generation: int, tenant: str, agent_id: str) -> str:
    """Sorted set: an agent's turn doc ids, scored by their latest chunk time."""
    return f"{key_root(name, generation)}dir:turns:{tenant}:{agent_id}"


def chunk_pattern(name: str) -> str:
    """A SCAN pattern matching the chunk hashes of every generation of ``name``."""
    return f"{name}:g*:chunk:*"


def key_generation(key: str) -> int | None:
    """The generation a chunk's key belongs to (``<name>:g<N>:chunk:…``); None for another key."""
    found = _KEY_GENERATION.search(key)
    return int(found.group(1)) if found else None


def poison_key(name: str) -> str:
    """The sorted set of the group's refused query digests."""
    return f"{name}:poison"


def poison_version_key(name: str) -> str:
    """The counter bumped on every change of the poison set (readers skip re-reading it)."""
    return f"{poison_key(name)}:version"


def attempt_key(name: str, kind: str, topic: str, partition: int, offset: int, stamp: int) -> str:
    """A record's counter (``kind`` ``attempts``) or dead-letter mark (``dead``); ``stamp``: its
    Kafka timestamp, so a record at a reused offset counts afresh."""
    return f"{name}:{kind}:{topic}:{partition}:{offset}:{stamp}"


def attempt_patterns(name: str, topic: str) -> list[str]:
    """The SCAN patterns of the counters and dead-letter marks of ``topic``'s records."""
    return [f"{_glob(name)}:{kind}:{_glob(topic)}:*" for kind in ("attempts", "dead")]


def tenants_key(name: str) -> str:
    """The set of every tenant a daemon has seen (what graph work iterates over)."""
    return f"{name}:tenants"


def erased_key(name: str) -> str:
    """The hash of erased tenants, each with when it was erased and whether it started anew
    since (``memory.tenants.Erasure``, as JSON): daemons neither record nor apply an event of
    one until its topics are created again, nor ever one recorded before the erase."""
    return f"{name}:erased"


def summarizer_key(name: str) -> str:
    """What the last daemon to start its summary workers writes summaries with, and when."""
    return f"{name}:summarizer"


def length_probe(name: str, token: str) -> tuple[str, str]:
    """The scratch search index of one probe of BM25's lengths (``memory.server_policies``),
    and the prefix of its keys: no index name nor alias holds a colon, so dropping it with
    its keys never reaches another deployment's."""
    return f"{name}:lengthprobe:{token}", f"{name}:lengthprobe:{token}:"


def _glob(text: str) -> str:
    """``text`` matched literally in a SCAN pattern."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def generation_pattern(name: str) -> str:
    """The SCAN pattern of every key of every generation of index ``name``."""
    return f"{_glob(name)}:g*"


def tenant_key(name: str, tenant: str) -> re.Pattern[str]:
    """Matches every key ``tenant`` owns in any generation of index ``name`` (among those of
    ``generation_pattern``): its chunks (community summaries among them), versions, chunk
    lists, write markers, histories and directory. One pattern: a sweep of a large index
    then reads its keys once, not once per kind."""
    t = re.escape(tenant)
    return re.compile(
        rf"{re.escape(name)}:g\d+:(?:(?:chunk|ver|doc|wr|hist):{t}:.*|dir:(?:docs|last|agents|chunks):{t}|dir:turns:{t}:.*)",
        re.DOTALL,
    )


def graph_pattern(name: str, tenant: str) -> str:
    """The SCAN pattern of every key of ``tenant``'s entity graph."""
    return _glob(graph_prefix(name, tenant)) + ":*"


def graph_prefix(name: str, tenant: str) -> str:
    """The root of one tenant's entity graph: ``{<name>:<tenant>}:g`` (its keys are ``<root>:<suffix>``;
    the braces keep a tenant's graph in one cluster hash slot, as its Lua scripts need)."""
    return "{" + f"{name}:{tenant}" + "}:g"


def graph_key(prefix: str, suffix: str) -> str:
    """One key of the graph rooted at ``prefix`` (``graph_prefix``): ``<prefix>:<suffix>``."""
    return f"{prefix}:{suffix}"


def graph_lock_key(prefix: str, name: str) -> str:
    """The key of a named singleton lease of the graph rooted at ``prefix`` (``graph.leases``)."""
    return graph_key(prefix, f"lock:{name}")


def daemons_key(name: str) -> str:
    """The hash of the daemons running on the index, by instance: each one's host, pid, consumer
    groups, whether it can use the active generation (and why not), and when it said so."""
    return f"{name}:daemons"


def replayed_key(name: str) -> str:
    """The hash of the dead letters sent again (``agentmemd dlq replay``), by their DLQ topic,
    partition and offset: when, where to, and what the ack said (``daemon.dlq_marks``)."""
    return f"{name}:dlq:replayed"
