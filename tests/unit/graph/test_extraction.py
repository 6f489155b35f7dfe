"""Identifier extraction, normalization and co-occurrence (pure)."""

from __future__ import annotations

from collections import Counter

import pytest

from graph.extraction import (
    cap_contribution,
    chunk_entities,
    contribution_parts,
    cooccurrence,
    extract_identifiers,
    merge_entities,
    ner_pairs,
    normalize,
)


@pytest.mark.parametrize(
    "text",
    [
        "Rejected Batch 100 From Northwind",  # a number before a capitalized word: no reason phrase
        "[ Return 429 Error ] -> [ Allow Request ]",  # a diagram's box
        "2024-05-01 ERROR: pool exhausted; EVENT queued; EXIT code 3",  # log levels and words in capitals
    ],
)
def test_numbers_and_capitals_that_read_as_codes_are_none(text: str) -> None:
    assert not [e for e in merge_entities(extract_identifiers(text)) if e.type in ("http_status", "error_code")]


@pytest.mark.parametrize(
    ("text", "name", "typ"),
    [
        ("clients got HTTP 504 from the gateway", "HTTP 504", "http_status"),
        ("returned status code 503 twice", "HTTP 503", "http_status"),
        ("the 502 Bad Gateway page", "HTTP 502", "http_status"),
        ("nginx: 504 Gateway Time-out", "HTTP 504", "http_status"),
        ("a 429 Too Many Requests reply", "HTTP 429", "http_status"),
        ("got 414 Request-URI Too Long here", "HTTP 414", "http_status"),
        ("requests: 503 Server Error: Service Unavailable for url", "HTTP 503", "http_status"),
        ("flask says 404 NOT FOUND", "HTTP 404", "http_status"),
        ("nginx logged 499 Client Closed Request", "HTTP 499", "http_status"),
        ("a 200 OK at last", "HTTP 200", "http_status"),
        ("read EWOULDBLOCK: try again", "EWOULDBLOCK", "error_code"),
        ("queryA ESERVFAIL (coredns)", "ESERVFAIL", "error_code"),
        ("Error: write EPIPE", "EPIPE", "error_code"),
        ("read: ECONNREFUSED (the pool)", "ECONNREFUSED", "error_code"),
        ("getaddrinfo ENOTFOUND db.internal", "ENOTFOUND", "error_code"),
        ("failed with ERR_CONN_RESET_4F2A at noon", "ERR_CONN_RESET_4F2A", "error_code"),
        ("psql said SQLSTATE 08006 and quit", "SQLSTATE 08006", "sqlstate"),
        ("raised PoolTimeoutError in the worker", "PoolTimeoutError", "exception"),
        ("see requests.exceptions.ConnectionError", "ConnectionError", "exception"),
        ("call db.pool.acquire() first", "db.pool.acquire()", "function"),
        ("edit /etc/pgbouncer/pgbouncer.ini now", "/etc/pgbouncer/pgbouncer.ini", "file_path"),
        ("in src/billing/retry.py we", "src/billing/retry.py", "file_path"),
        ("import billing.adapters.stripe today", "billing.adapters.stripe", "module"),
        ("the billing-service pods", "billing-service", "service"),
        ("ping db-01.prod.internal", "db-01.prod.internal", "host"),
        ("raise max_connections to 400", "max_connections", "config_key"),
        ("SELECT id FROM invoices WHERE", "invoices", "sql_table"),
        # a hyphen spelling is the same error code as the underscore one: one node
        ("the proxy logged ERR-CONN-RESET again", "ERR_CONN_RESET", "error_code"),
        ("then ERR-LOCK-9C1 twice", "ERR_LOCK_9C1", "error_code"),
        ("got PG-E42 back", "PG_E42", "error_code"),
        ("paged for INC-4411 at 3am", "INC-4411", "ticket"),
        ("rolled back DEPLOY-77.", "DEPLOY-77", "ticket"),
        ("patched CVE-2024-3094 in xz", "CVE-2024-3094", "ticket"),
    ],
)
def test_identifiers_are_found_with_their_type(text: str, name: str, typ: str) -> None:
    """Each kind of technical identifier is recognized, with the most specific type."""
    ents = merge_entities(extract_identifiers(text))
    assert (name.lower().rstrip("()"), typ) in {(e.key, e.type) for e in ents}


@pytest.mark.parametrize(
    "text",
    [
        "an X-RAY of the IL-6-induced state-of-the-art e-mail",  # short parts, lower case
        "saw HTTP-504 and UTF-8 on 2024-01-15",  # labels and dates are no tickets
        "ABC-123abc and INC-4411x",  # glued to a word
        "hashed with SHA-256 and AES-256, keys RSA-2048, per PEP-503 and ISO-8601",  # standards
        "moved from US-EAST to EU-WEST, a LOW-RISK change",  # two plain words
    ],
)
def test_hyphenated_words_that_are_no_error_code_or_ticket(text: str) -> None:
    """Hyphen-joined words name an error code or a ticket only in their upper-case, whole form."""
    assert {t for _, t in extract_identifiers(text)} <= {"http_status"}


def test_a_run_too_long_for_any_identifier_is_skipped_and_its_neighbours_kept() -> None:
    """A run of identifier characters over 256 long (a chunk of "xxx…-xxx…-", which the dotted
    and hyphenated patterns scanned quadratically) yields nothing; around it, everything is
    found as before, and a run of 256 is still read."""
    run = ("x" * 300 + "-") * 3 + "payments-service"
    text = f"ECONNRESET: {run} then see /etc/nginx/nginx.conf on billing-service"
    names = {n for n, _ in extract_identifiers(text)}
    assert names == {"ECONNRESET", "/etc/nginx/nginx.conf", "billing-service"}
    edge = "a" * (256 - len("-service")) + "-service"
    assert (edge, "service") in extract_identifiers(f"on {edge} now")
    assert extract_identifiers(f"on a{edge} now") == []


def test_a_hosts_name_is_no_service() -> None:
    found = extract_identifiers("payments-db-01.internal and redis-cache-03 failed; billing-service. auth-api")
    assert ("payments-db", "service") not in found and ("redis-cache", "service") not in found
    assert ("payments-db-01.internal", "host") in found and ("redis-cache-03", "host") in found
    assert ("billing-service", "service") in found and ("auth-api", "service") in found
    for named, service in (
        ("checkout-service-7d9f8b6c-xk2pq restarted", "checkout-service"),  # a pod
        ("auth-api.svc.cluster.local timed out", "auth-api"),  # a DNS name
        ("user-service-v2 is out", "user-service"),
        ("payments-db.internal is slow", "payments-db"),
    ):
        assert (service, "service") in extract_identifiers(named), named


def test_plain_prose_has_no_identifiers() -> None:
    """Ordinary words and numbers are not entities."""
    assert merge_entities(extract_identifiers("We met at 10 and talked about the weather for 45 minutes.")) == []


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("The Billing-Service", "billing-service"),
        ("Postgres", "PostgreSQL"),
        ("pg", "postgresql"),
        ("  K8s ", "kubernetes"),
    ],
)
def test_normalize_makes_one_thing_one_key(a: str, b: str) -> None:
    """Case, spacing, articles and aliases collapse to one key."""
    aliases = {"postgres": "postgresql", "pg": "postgresql", "k8s": "kubernetes"}
    assert normalize(a, aliases) == normalize(b, aliases)


def test_merge_keeps_the_most_specific_type_and_limit() -> None:
    """Duplicates merge, the more specific type wins, and the cap bounds entities per chunk."""
    ents = merge_entities([("billing-service", "org"), ("Billing-Service", "service"), ("x1", "concept")], limit=5)
    assert [(e.key, e.type) for e in ents] == [("billing-service", "service"), ("x1", "concept")]
    assert len(merge_entities([(f"name{i}", "concept") for i in range(100)], limit=7)) == 7


def test_ner_pairs_keep_useful_labels() -> None:
    """spaCy labels map to our types; cardinal numbers and dates are dropped."""
    assert ner_pairs([("Stripe", "ORG"), ("504", "CARDINAL"), ("Tuesday", "DATE"), ("Kafka", "PRODUCT")]) == [
        ("Stripe", "org"),
        ("Kafka", "product"),
    ]


def test_cooccurrence_counts_chunks_per_pair() -> None:
    """An edge's weight is the number of chunks holding both ends."""
    edges = cooccurrence([["a", "b", "c"], ["b", "a"], ["c"], ["a", "a", "b"]])
    assert edges == {("a", "b"): 3, ("a", "c"): 1, ("b", "c"): 1}


@pytest.mark.parametrize(
    ("texts", "ner", "entities", "edges"),
    [
        ([], [], {}, {}),
        (
            ["billing-service hit HTTP 504", "billing-service raised max_connections"],
            [[], []],
            {
                "billing-service": ("billing-service", "service", ["d_p0", "d_p1"]),
                "http 504": ("HTTP 504", "http_status", ["d_p0"]),
                "max_connections": ("max_connections", "config_key", ["d_p1"]),
            },
            {("billing-service", "http 504"): 1, ("billing-service", "max_connections"): 1},
        ),
        (
            ["Stripe called billing-service", "Stripe again"],
            [[("Stripe", "ORG"), ("two", "CARDINAL")], [("Stripe", "ORG")]],
            {
                "stripe": ("Stripe", "org", ["d_p0", "d_p1"]),
                "billing-service": ("billing-service", "service", ["d_p0"]),
            },
            {("billing-service", "stripe"): 1},
        ),
    ],
)
def test_contribution_parts_list_chunk_ids_per_entity_and_count_edges_per_chunk(
    texts: list[str],
    ner: list[list[tuple[str, str]]],
    entities: dict[str, tuple[str, str, list[str]]],
    edges: dict[tuple[str, str], int],
) -> None:
    """Each entity lists the chunks naming it; each edge counts the chunks holding both ends."""
    ids = [f"d_p{i}" for i in range(len(texts))]
    got_entities, got_edges = contribution_parts(ids, texts, ner, [[] for _ in texts])
    assert got_entities == entities
    assert dict(got_edges) == edges


def test_a_capped_contribution_keeps_the_most_mentioned_entities_and_heaviest_edges() -> None:
    ids = [f"c{i}" for i in range(6)]
    # a in every chunk, b in four, c in three, d and e in one each (d < e by key)
    per_chunk = [["a", "b", "c"], ["a", "b", "c"], ["a", "b", "c"], ["a", "b"], ["a", "d"], ["a", "e"]]
    entities = {k: (k.upper(), "X", [cid for cid, ks in zip(ids, per_chunk, strict=True) if k in ks]) for k in "abcde"}
    edges = cooccurrence(per_chunk)
    assert cap_contribution(entities, edges, max_entities=10, max_edges=100) == (entities, edges)  # under the caps

    kept, kept_edges = cap_contribution(entities, edges, max_entities=4, max_edges=100)
    assert list(kept) == ["a", "b", "c", "d"]  # e ties d on one mention and loses on key; order kept
    assert kept_edges == Counter({("a", "b"): 4, ("a", "c"): 3, ("b", "c"): 3, ("a", "d"): 1})

    _, heaviest = cap_contribution(entities, edges, max_entities=4, max_edges=2)
    assert heaviest == Counter({("a", "b"): 4, ("a", "c"): 3})  # (a, c) ties (b, c) and wins on key


def test_an_entity_across_a_line_break_is_dropped() -> None:
    """spaCy may run a heading into the paragraph below it; such a span names nothing."""
    assert ner_pairs([("GDPR\n\nData", "ORG"), ("DocuSign", "ORG"), (" Stripe\n", "ORG")]) == [
        ("DocuSign", "org"),
        (" Stripe\n", "org"),
    ]


def test_a_urls_parts_are_no_paths_modules_or_hosts() -> None:
    """A link names a page: "/github.com/someone" was a file path of every README linking there."""
    found = extract_identifiers(
        "See https://github.com/adityagiri3600/repo and <https://anaconda.org/conda-forge/cymem>, "
        "or www.example.com/docs; the config lives in /etc/pgbouncer/pgbouncer.ini."
    )
    assert all("github" not in n and "anaconda" not in n and "example" not in n for n, _ in found), found
    assert ("/etc/pgbouncer/pgbouncer.ini", "file_path") in found


def test_numbered_steps_are_no_hosts() -> None:
    found = extract_identifiers("In step-3 restart web-01 and db-7; see part-2 and section-10.")
    assert ("web-01", "host") in found and ("db-7", "host") in found
    assert all(n not in {"step-3", "part-2", "section-10"} for n, _ in found), found


def test_a_span_of_code_or_markup_is_no_named_entity() -> None:
    """spaCy's labels on technical Markdown: comments, link syntax, box drawing and a man
    page's title line are not names; real names are kept."""
    spans = [
        ("// Default", "ORG"),
        ("// ./a-module.js", "PERSON"),
        ("Yahoo Answers](https://www.kaggle.com", "ORG"),
        ("┌──────────────", "ORG"),
        ("pg_upgradecluster - Migrate", "PRODUCT"),
        ("Acme Corporation", "ORG"),
        ("Alice Johnson", "PERSON"),
        ("3M", "ORG"),
    ]
    assert ner_pairs(spans) == [("Acme Corporation", "org"), ("Alice Johnson", "person"), ("3M", "org")]


def test_a_capitalized_common_word_is_no_name() -> None:
    """A word capitalized only where a sentence, line or table cell starts, and written in
    lower case elsewhere in the chunk, is a word, not a name; a name used mid-sentence stays."""
    text = (
        "| Setting | Default |\n|---|---|\n| timeout | 5 |\n"
        "Restart the worker. If it fails, restart the pod; the default timeout is set in Redis.\n"
        "Redis listens on redis://127.0.0.1 and redis-server logs to the journal. Kafka holds the log."
    )
    ents = [("Setting", "ORG"), ("Default", "ORG"), ("Restart", "ORG"), ("Redis", "ORG"), ("Kafka", "ORG")]
    assert [n for n, _ in ner_pairs(ents, text)] == ["Setting", "Redis", "Kafka"]
    # Units and time zones are never names; a tool written in lower case is one.
    assert ner_pairs([("pgbouncer", "ORG"), ("MiB", "ORG"), ("UTC", "ORG"), ("iPhone", "PRODUCT")]) == [
        ("pgbouncer", "org"),
        ("iPhone", "product"),
    ]


def test_a_possessive_names_the_same_entity() -> None:
    assert normalize("Apache Kafka's") == normalize("Apache Kafka\u2019s") == normalize("apache kafka")
    (ent,) = merge_entities([("Apache Kafka's", "product"), ("Apache Kafka", "product")])
    assert (ent.key, ent.name) == ("apache kafka", "Apache Kafka")


def test_an_identifier_spacy_also_labels_is_one_node() -> None:
    """The hyphen spelling of an error code is its underscore node, whatever spaCy calls it."""
    text = "Alert REDIS-PRIMARY-DOWN fired; see the Redis runbook."
    ents = chunk_entities(text, [("REDIS-PRIMARY-DOWN", "ORG"), ("Redis", "ORG")], [])
    assert sorted((e.key, e.type) for e in ents) == [("redis", "org"), ("redis_primary_down", "error_code")]


def test_a_lower_case_name_is_no_capitalized_word() -> None:
    """Only a capitalized word can be a sentence's first word: a tool's lower-case name stays."""
    text = "pgbouncer reached max_connections. Restart pgbouncer."
    assert ner_pairs([("pgbouncer", "PERSON")], text) == [("pgbouncer", "person")]
