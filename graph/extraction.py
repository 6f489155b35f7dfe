"""Entity extraction tuned for technical text, and co-occurrence relations (pure).

Identifiers carry the meaning of ops prose: ``HTTP 504``, ``ERR_CONN_RESET_4F2A``,
``SQLSTATE 08006``, ``PoolTimeoutError``, ``db.pool.acquire()``, ``/etc/pgbouncer.ini``,
``billing-service``, ``max_connections``, ``FROM invoices``, ``INC-4411``. Regexes find those; named
entities (spaCy) are passed in from outside, so this module stays pure.
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import itertools
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

#: Type priority when two extractors name the same thing: the more specific wins.
TYPE_PRIORITY = (
    "http_status",
    "sqlstate",
    "error_code",
    "ticket",
    "exception",
    "function",
    "file_path",
    "module",
    "service",
    "host",
    "config_key",
    "sql_table",
    "org",
    "product",
    "person",
    "place",
    "event",
    "concept",
)

# A status named as one ("HTTP 504", "status 404"), or by a reason phrase after it ("503
# Service Unavailable", "404 NOT FOUND", "404 Client Error: Not Found"): its first word must
# open one (``_REASON_WORDS``), or "Batch 100 From" and a diagram's "429 Error" would be statuses too.
_HTTP = re.compile(r"\b(?:HTTP|http|status(?: code)?)[ /-]?([1-5]\d\d)\b|\b([1-5]\d\d) ([A-Z][A-Za-z']*)")
#: The first words of reason phrases: the standard ones under their old and new names (Python
#: 3.13 renamed some), requests' "Client Error"/"Server Error", and those of common
#: non-standard codes (nginx's 499, Cloudflare's 52x). A fixed list, not ``http.HTTPStatus``:
#: daemons on different Pythons must find the same entities.
_REASON_WORDS = frozenset(
    "continue switching processing early ok created accepted non no reset partial multi already im "
    "multiple moved found see not use temporary permanent bad unauthorized payment forbidden method "
    "proxy request conflict gone length precondition payload content uri unsupported requested range "
    "expectation i'm misdirected unprocessable locked failed too upgrade unavailable internal gateway "
    "service http variant insufficient loop network client server unknown web connection origin "
    "bandwidth invalid site".split()
)
_SQLSTATE = re.compile(r"\bSQLSTATE[ :=]*([0-9A-Z]{5})\b")
# errno names (ECONNRESET) stand alone: the EAST of US-EAST is none, and only errno's own
# names are codes (a log's ERROR, EVENT or EXIT is none).
_ERROR_CODE = re.compile(r"\b(?:[A-Z][A-Z0-9]*_){1,}[A-Z0-9]+\b|(?<![\w-])E[A-Z]{3,}\b(?=[:\s)]|$)")
#: errno's names (every alias: EWOULDBLOCK is EAGAIN's number), other systems' that logs show,
#: and Node's resolver's and HTTP clients' that read as they do.
_ERRNO = frozenset(n for n in dir(errno) if n.startswith("E") and n.isupper()) | {
    *"EFTYPE EAUTH ENEEDAUTH ENOATTR EPROCLIM EBADRPC ERPCMISMATCH".split(),
    *"ENOTFOUND ESERVFAIL ETIMEOUT EREFUSED ENODATA ECONNREFUSED ESOCKETTIMEDOUT".split(),
}
# Upper-case words joined by hyphens (ERR-CONN-RESET): the error code ERR_CONN_RESET spelled
# another way, so it is named with underscores and both spellings are one node (as they are
# one identifier in the identifier leg). Each part has two characters or more (not X-RAY),
# and three parts or a digit make it a code rather than a pair of words (US-EAST, LOW-RISK).
_SEG = r"(?:[A-Z][A-Z0-9]+|[0-9]+[A-Z][A-Z0-9]*)"  # two characters or more, a letter among them
# (The three-parts-or-a-digit rule is checked in code: a lookahead for the digit scanned a
# megabyte-long upper-case run once per split of it, quadratic.)
_ERROR_CODE_HYPHEN = re.compile(rf"(?<![\w-])[A-Z][A-Z0-9]+(?:-{_SEG})+(?!\w|-[A-Z0-9])")
# Tickets, incidents, deploys, CVEs: INC-4411, DEPLOY-77, CVE-2024-3094. They link the
# postmortem, the chat turns and the runbook that name one incident.
_TICKET = re.compile(r"(?<![\w-])([A-Z][A-Z0-9]{1,9})((?:-\d{2,})+)(?!\w|-[A-Z0-9])")
# Labels, standards and algorithms that take a number the way tickets do: as hubs they would
# link every doc that mentions SHA-256 or ISO-8601.
_NOT_TICKETS = frozenset(
    "HTTP HTTPS SQLSTATE ERRNO UTF UCS ISO IEC IEEE RFC PEP SHA MD AES DES RSA ECDSA HMAC CRC TLS SSL "
    "IPV BASE AVX SSE ARM FIPS NIST CWE OWASP WCAG UUID GPT".split()
)
_EXCEPTION = re.compile(r"\b(?:[a-z_][\w]*\.)*([A-Z][A-Za-z0-9]*(?:Error|Exception|Timeout|Failure|Fault))\b")
_FUNCTION = re.compile(r"\b([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*)\(\)")
_FILE_PATH = re.compile(r"(?<![\w.])((?:/[\w.-]+){2,}|(?:[\w-]+/)+[\w-]+\.[a-z]{1,5})\b")
_MODULE = re.compile(r"\b([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*){2,})\b")
_SERVICE = re.compile(r"\b([a-z][a-z0-9]*(?:-[a-z0-9]+)*-(?:service|svc|api|worker|gateway|db|cache|queue|proxy))\b")
_HOST = re.compile(r"\b([a-z][a-z0-9-]*\d+(?:\.[a-z][a-z0-9-]*)+|[a-z][a-z0-9-]*-\d+)\b")
_CONFIG_KEY = re.compile(r"\b([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\b")
_SQL_TABLE = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE|TABLE)\s+([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)?)\b")

_NER_TYPES = {
    "ORG": "org",
    "PRODUCT": "product",
    "PERSON": "person",
    "GPE": "place",
    "FAC": "place",
    "LOC": "place",
    "EVENT": "event",
}
_LEADING = re.compile(r"^(?:the|a|an)\s+", re.IGNORECASE)
_POSSESSIVE = re.compile(r"['\u2019]s$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Entity:
    """An entity as found in text: its canonical key, display name and type."""

    key: str
    name: str
    type: str


def normalize(name: str, aliases: Mapping[str, str] | None = None) -> str:
    """The canonical key of a name: lowercase, single spaces, no article or possessive ending,
    aliases applied.

    ``"The  Billing-Service"`` and ``"billing-service"`` are one node, and ``"Kafka's"`` and
    ``"Kafka"``; with the alias
    ``postgres -> postgresql``, so are ``Postgres`` and ``PostgreSQL``.
    """
    key = " ".join(name.strip().strip(".,;:'\"`()[]{}").split())
    key = _POSSESSIVE.sub("", _LEADING.sub("", key)).lower()
    if aliases:
        key = aliases.get(key, key)
    return key


# A run of identifier characters this long is no entity (no path, module or code is), and
# the dotted, slashed and hyphenated patterns below try every segment of a run as a start:
# quadratic in the run. Chunks are cut by tokens, and a word over 100 characters is one
# [UNK] token, so a chunk can hold a megabyte of "xxx…-xxx…-": 3.6 s of GIL-held regex
# work per chunk measured here. Blanked first (one linear pass: only a run's start can
# match), every pattern below scans runs of at most this length, so the whole is linear.
_LONGEST_RUN = 256
_LONG_RUN = re.compile(rf"(?<![\w./+-])[\w./+-]{{{_LONGEST_RUN + 1},}}")


# A URL names a page, not a file path, module or host of ours: its parts were read as
# "/github.com/someone" paths and "docs.python.org"-like modules, hubs linking every README.
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s<>()\[\]\"'`]*|\bwww\.[^\s<>()\[\]\"'`]+")
# A word and a number that number steps, parts and sections ("step-3"), not a host.
_NOT_HOSTS = frozenset(
    "step part section phase chapter page item figure fig table option level stage round day week month "
    "year version rev note example line row column col case test task point slide lesson exercise question "
    "appendix unit rule tier type class grade size top".split()
)


def _found(text: str) -> Iterable[tuple[str, str]]:
    text = _URL.sub(" ", _LONG_RUN.sub(" ", text))
    for m in _HTTP.finditer(text):
        code = m.group(1) or m.group(2)
        if m.group(1) or m.group(3).lower() in _REASON_WORDS:
            yield f"HTTP {code}", "http_status"
    for m in _SQLSTATE.finditer(text):
        yield f"SQLSTATE {m.group(1)}", "sqlstate"
    for m in _ERROR_CODE.finditer(text):
        if "_" in m.group(0) or m.group(0) in _ERRNO:
            yield m.group(0), "error_code"
    for m in _ERROR_CODE_HYPHEN.finditer(text):
        code = m.group(0)
        if code.count("-") >= 2 or any(c.isdigit() for c in code):
            yield code.replace("-", "_"), "error_code"
    for m in _TICKET.finditer(text):
        if m.group(1) not in _NOT_TICKETS:
            yield m.group(0), "ticket"
    for m in _EXCEPTION.finditer(text):
        yield m.group(1), "exception"
    for m in _FUNCTION.finditer(text):
        yield m.group(1) + "()", "function"
    for m in _FILE_PATH.finditer(text):
        yield m.group(1), "file_path"
    for m in _MODULE.finditer(text):
        yield m.group(1), "module"
    hosts = list(_HOST.finditer(text))
    # A host's first part is no service: "payments-db-01.internal" is a host, not the service
    # "payments-db". A pod's (checkout-service-7d9f8b6c-xk2pq) or a DNS name's
    # (auth-api.svc.cluster.local) is: neither is a host here.
    starts, ends = [m.start(1) for m in hosts], [m.end(1) for m in hosts]  # disjoint, in order
    for m in _SERVICE.finditer(text):
        i = bisect.bisect_right(starts, m.start(1)) - 1
        if i < 0 or m.end(1) > ends[i]:
            yield m.group(1), "service"
    for m in hosts:
        host = m.group(1)
        if "." in host or host.rsplit("-", 1)[0] not in _NOT_HOSTS:
            yield host, "host"
    for m in _CONFIG_KEY.finditer(text):
        yield m.group(1), "config_key"
    for m in _SQL_TABLE.finditer(text):
        yield m.group(1), "sql_table"


def extract_identifiers(text: str) -> list[tuple[str, str]]:
    """``(name, type)`` of every technical identifier in ``text``, in order found."""
    return list(_found(text))


def merge_entities(
    found: Iterable[tuple[str, str]],
    *,
    aliases: Mapping[str, str] | None = None,
    limit: int = 40,
) -> list[Entity]:
    """Normalize and deduplicate ``(name, type)`` pairs into entities, most specific type first.

    Args:
        found: names and types from the identifier regexes, NER or an LLM.
        aliases: normalized name -> canonical name.
        limit: keep at most this many (by first appearance), which bounds edges per chunk.

    Returns:
        One entity per key, in first-seen order.
    """
    rank = {t: i for i, t in enumerate(TYPE_PRIORITY)}
    best: dict[str, Entity] = {}
    for name, typ in found:
        key = normalize(name, aliases)
        if len(key) < 2 or key.isdigit():
            continue
        cur = best.get(key)
        if cur is None:
            if len(best) >= limit:
                continue
            best[key] = Entity(key, _POSSESSIVE.sub("", name.strip()), typ)
        elif rank.get(typ, len(rank)) < rank.get(cur.type, len(rank)):
            best[key] = Entity(key, cur.name, typ)
    return list(best.values())


def ner_pairs(ents: Iterable[tuple[str, str]], text: str = "") -> list[tuple[str, str]]:
    """spaCy ``(text, label)`` pairs mapped to our types; labels we don't use are dropped, and so
    is a span that is no name (``_a_name``), and a capitalized word that ``text``, the chunk
    they were found in, also writes in lower case and capitalizes only where a sentence, line or
    cell starts (``_only_at_starts``)."""
    lower: set[str] | None = None
    out: list[tuple[str, str]] = []
    for span, label in ents:
        name = span.strip()
        if label not in _NER_TYPES or not _a_name(name):
            continue
        if " " not in name and name[:1].isupper() and name[1:].islower():
            # A sentence's, a heading's or a table cell's first word ("Restart", "Default").
            lower = _lower_words(text) if lower is None else lower
            if name.lower() in lower and _only_at_starts(name, text):
                continue
        out.append((span, _NER_TYPES[label]))
    return out


# A word in lower case on its own: not part of a path, URL, host or identifier ("redis" in
# "redis://" or "redis-server" is no use of the word "redis").
_LOWER_WORD = re.compile(r"(?<![\w./:@-])[a-z]+(?![\w/:@-]|\.\w)")


# Units and time zones spaCy reads as organizations: hubs that say nothing of what links them.
_NOT_NAMES = frozenset("KB MB GB TB KiB MiB GiB TiB ms UTC GMT".split())

# Markdown's and code's punctuation inside a span: "Yahoo Answers](https://…", "// Default",
# "pg_upgradecluster - Migrate" (a man page's title line).
_NOT_IN_A_NAME = ("](", "://", "//", " - ", " | ", "`", "=", "{", "}", "<", ">")


def _lower_words(text: str) -> set[str]:
    return set(_LOWER_WORD.findall(text))


#: What may stand between a start (a line's, a sentence's, a table cell's) and its first word.
_MARKUP = " \t*#>+-_`\"'(["


def _only_at_starts(word: str, text: str) -> bool:
    """Whether every occurrence of ``word`` in ``text`` opens a line, a sentence or a table cell."""
    for m in re.finditer(rf"(?<!\w){re.escape(word)}(?!\w)", text):
        i = m.start() - 1
        while i >= 0 and text[i] in _MARKUP:
            i -= 1
        if i >= 0 and text[i] not in "\n.!?:;|":
            return False
    return True


def _a_name(text: str) -> bool:
    """Whether a span spaCy labelled reads as a name: on one line (not a heading run into the
    paragraph under it: "GDPR\n\nData"), starting with a letter or digit, mostly letters and
    digits (not "┌──────"), and holding none of the code and markup punctuation a name does not."""
    if len(text) < 2 or "\n" in text or not text[0].isalnum() or text in _NOT_NAMES:
        return False
    if any(mark in text for mark in _NOT_IN_A_NAME):
        return False
    chars = [c for c in text if not c.isspace()]
    return sum(c.isalnum() for c in chars) * 2 >= len(chars) and any(c.isalpha() for c in chars)


def cooccurrence(chunks: Sequence[Sequence[str]]) -> Counter[tuple[str, str]]:
    """Edge weights: for each pair of entity keys, the number of chunks holding both.

    Args:
        chunks: the entity keys of each chunk.

    Returns:
        ``(a, b) -> count`` with ``a < b``.
    """
    edges: Counter[tuple[str, str]] = Counter()
    for keys in chunks:
        for a, b in itertools.combinations(sorted(set(keys)), 2):
            edges[(a, b)] += 1
    return edges


def chunk_entities(
    text: str,
    ner: Iterable[tuple[str, str]],
    llm: Iterable[tuple[str, str]],
    *,
    aliases: Mapping[str, str] | None = None,
    limit: int = 40,
) -> list[Entity]:
    """One chunk's entities: its identifiers, then spaCy's ``(text, label)`` pairs, then an LLM's
    ``(name, type)`` pairs, merged (:func:`merge_entities`). A function of the text alone for
    fixed settings, so a chunk whose text did not change need not be extracted again."""
    found = extract_identifiers(text)
    # An identifier spaCy also labels (REDIS-PRIMARY-DOWN as an ORG) is the identifier's node,
    # which the hyphen form names with underscores: not a second node of another type.
    idents = {normalize(n) for n, _ in found}
    named = [(n, t) for n, t in ner_pairs(ner, text) if normalize(n.replace("-", "_")) not in idents]
    return merge_entities(found + named + list(llm), aliases=aliases, limit=limit)


def contribution_from(
    chunk_ids: Sequence[str], per_chunk: Sequence[Sequence[Entity]]
) -> tuple[dict[str, tuple[str, str, list[str]]], Counter[tuple[str, str]]]:
    """One doc's entities (key -> name, type, chunk ids) and co-occurrence edges, from each
    chunk's entities (:func:`chunk_entities`)."""
    entities: dict[str, tuple[str, str, list[str]]] = {}
    for cid, ents in zip(chunk_ids, per_chunk, strict=True):
        for e in ents:
            name, typ, ids = entities.get(e.key, (e.name, e.type, []))
            ids.append(cid)
            entities[e.key] = (name, typ, ids)
    return entities, cooccurrence([[e.key for e in ents] for ents in per_chunk])


def contribution_parts(
    chunk_ids: Sequence[str],
    texts: Sequence[str],
    ner: Sequence[Iterable[tuple[str, str]]],
    llm: Sequence[Iterable[tuple[str, str]]],
    *,
    aliases: Mapping[str, str] | None = None,
    limit: int = 40,
) -> tuple[dict[str, tuple[str, str, list[str]]], Counter[tuple[str, str]]]:
    """One doc's entities and edges from its chunks' texts and NER / LLM pairs.

    Args:
        chunk_ids: the doc's chunk ids, in order.
        texts: the chunks' texts.
        ner: spaCy ``(text, label)`` pairs of each chunk.
        llm: ``(name, type)`` pairs an LLM found in each chunk (empty when off).
        aliases: normalized name -> canonical name.
        limit: most entities per chunk.
    """
    per_chunk = [
        chunk_entities(text, named, found, aliases=aliases, limit=limit)
        for text, named, found in zip(texts, ner, llm, strict=True)
    ]
    return contribution_from(chunk_ids, per_chunk)


def fingerprints(entities: Mapping[str, tuple[str, str, Sequence[str]]], texts: Mapping[str, str]) -> dict[str, str]:
    """Each entity's digest of the texts of the chunks that name it (``texts``: chunk id -> text).

    Where the digest is unchanged by an edit, what the graph knows of the entity is unchanged
    (the same passages name it), whatever the chunk ids: its communities need no new summary.
    """
    own = {cid: hashlib.blake2b(t.encode(), digest_size=8).hexdigest() for cid, t in texts.items()}
    return {
        key: hashlib.blake2b("".join(sorted(own.get(c, c) for c in ids)).encode(), digest_size=8).hexdigest()
        for key, (_, _, ids) in entities.items()
    }


def cap_contribution(
    entities: dict[str, tuple[str, str, list[str]]],
    edges: Counter[tuple[str, str]],
    *,
    max_entities: int,
    max_edges: int,
) -> tuple[dict[str, tuple[str, str, list[str]]], Counter[tuple[str, str]]]:
    """One doc's contribution cut to its ``max_entities`` most-mentioned entities and its
    ``max_edges`` heaviest edges among them (ties by key: the same doc always keeps the same).

    Why: the graph store applies a contribution in one Redis script, which blocks Redis for
    its length; a doc dense in identifiers (12,481 entities, 121,861 edges in 1,200 chunks)
    held it 1.2 s, and the largest allowed could hold it past Redis's busy-script limit.
    The cut keeps what a doc says most; its chunks stay searchable in full.
    """
    if len(entities) > max_entities:
        ranked = sorted(entities, key=lambda k: (-len(entities[k][2]), k))
        kept = set(ranked[:max_entities])
        entities = {k: v for k, v in entities.items() if k in kept}
        edges = Counter({e: w for e, w in edges.items() if e[0] in kept and e[1] in kept})
    if len(edges) > max_edges:
        edges = Counter(dict(sorted(edges.items(), key=lambda kv: (-kv[1], kv[0]))[:max_edges]))
    return entities, edges
