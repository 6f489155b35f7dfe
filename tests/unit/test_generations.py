"""Pure parts of index generations and reindexing: specs, names, which topics are replayed."""

from __future__ import annotations

import json
import re
import time

import pytest
from pydantic import ValidationError

from daemon.reindex import Carry, carry_mode, source_topics
from daemon.reindex.completeness import fields_only_change
from daemon.settings import Settings
from memory.config import ChunkingConfig, IndexConfig
from memory.filters import BASE_FILTER_KEYS
from memory.generations import GenerationState, IndexSpec, index_spec
from memory.schema import filter_keys_of, index_schema, key_root, physical_name


def test_spec_changes_with_what_changes_the_index_content() -> None:
    base = index_spec(IndexConfig(), model="m", dims=384, chunking=ChunkingConfig())
    assert base == index_spec(IndexConfig(name="other"), model="m", dims=384, chunking=ChunkingConfig())
    assert base.fingerprint() == index_spec(IndexConfig(), model="m", dims=384, chunking=ChunkingConfig()).fingerprint()
    variants = [
        index_spec(IndexConfig(), model="m2", dims=384, chunking=ChunkingConfig()),
        index_spec(IndexConfig(), model="m", dims=768, chunking=ChunkingConfig()),
        index_spec(IndexConfig(), model="m", dims=384, chunking=ChunkingConfig(max_tokens=128)),
        index_spec(IndexConfig(extra_filter_keys=["team"]), model="m", dims=384, chunking=ChunkingConfig()),
        index_spec(IndexConfig(hnsw_m=32), model="m", dims=384, chunking=ChunkingConfig()),
    ]
    variants.append(base.model_copy(update={"analyzer": base.analyzer + 1}))
    assert all(v != base and v.fingerprint() != base.fingerprint() for v in variants)
    assert "chunking=128/32" in variants[2].describe()
    assert f"analyzer={base.analyzer + 1}" in variants[-1].describe()


def test_a_spec_recorded_before_the_analyzer_was_versioned_reads_as_version_1() -> None:
    spec = index_spec(IndexConfig(), model="m", dims=384, chunking=ChunkingConfig())
    old = spec.model_dump(exclude={"analyzer"})
    assert IndexSpec.model_validate_json(json.dumps(old)).analyzer == 1


def test_each_generation_has_its_own_index_and_key_prefix() -> None:
    cfg = IndexConfig(name="mem")
    one, two = (index_schema(cfg, dims=4, generation=g)["index"] for g in (1, 2))
    assert (one["name"], one["prefix"]) == ("mem-g1", "mem:g1:chunk:")
    assert (two["name"], two["prefix"]) == ("mem-g2", "mem:g2:chunk:")
    assert physical_name("mem", 3) == "mem-g3" and key_root("mem", 3) == "mem:g3:"
    # g1's prefix is not a prefix of g10's keys
    assert not key_root("mem", 10).startswith(key_root("mem", 1))


def test_replayed_topics_single_and_per_tenant() -> None:
    existing = {
        "memory.documents",
        "memory.transcripts",
        "memory.requests",
        "memory.documents.acme",
        "memory.transcripts.acme",
        "memory.documents.bad name",
        "memory.dlq",
    }
    single = source_topics(Settings(), existing)
    assert single == {
        "memory.documents": ("document", "memory.documents"),
        "memory.transcripts": ("transcript", "memory.transcripts"),
    }
    per_tenant = source_topics(Settings(consumer={"tenancy": "topic"}), existing)
    assert per_tenant == {
        "memory.documents.acme": ("document", "memory.documents"),
        "memory.transcripts.acme": ("transcript", "memory.transcripts"),
    }


def test_docs_carry_over_only_when_their_chunks_and_vectors_still_hold() -> None:
    """What a reindex may copy from the old generation when the broker no longer holds a
    doc's events: with the same model and chunking, the stored chunks, their terms analyzed
    again under a new text analysis and their filter fields set again under other filter
    keys (when the old schema is known to differ only there); under another model, chunking
    or schema, nothing."""
    spec = index_spec(IndexConfig(name="m"), model="a", dims=384, chunking=ChunkingConfig())
    keyed = index_spec(
        IndexConfig(name="m", extra_filter_keys=["user_id"]), model="a", dims=384, chunking=ChunkingConfig()
    )
    older = spec.model_copy(update={"analyzer": spec.analyzer - 1})
    assert carry_mode(spec, spec) == Carry()
    assert carry_mode(older, spec) == Carry(reanalyze=True)
    assert carry_mode(spec, keyed) is None  # a schema not known to differ in its keys alone
    assert carry_mode(spec, keyed, fields_only=True) == Carry(refield=True)
    assert carry_mode(keyed, spec, fields_only=True) == Carry(refield=True)
    assert carry_mode(older, keyed, fields_only=True) == Carry(reanalyze=True, refield=True)
    assert carry_mode(older.model_copy(update={"model": "b"}), spec) is None
    assert carry_mode(spec.model_copy(update={"max_tokens": 64}), spec) is None
    assert carry_mode(spec.model_copy(update={"overlap": spec.overlap + 1}), spec) is None
    assert carry_mode(spec.model_copy(update={"strategy": "windows"}), spec) is None
    assert carry_mode(spec.model_copy(update={"min_tokens": 16}), spec, fields_only=True) is None
    assert carry_mode(spec.model_copy(update={"schema_digest": "x"}), spec) is None
    assert carry_mode(None, spec) is None


def test_a_schema_differs_only_in_its_filter_keys_when_this_release_builds_it_from_them() -> None:
    """The old index's keys, read from it, rebuild its digest with this release's schema: a
    release that changed the schema itself (a new field) or other HNSW settings does not."""
    cfg = IndexConfig(name="m", extra_filter_keys=["user_id", "role"])
    old = index_spec(IndexConfig(name="m"), model="a", dims=384, chunking=ChunkingConfig())
    assert fields_only_change(old, cfg, BASE_FILTER_KEYS)
    keyed = index_spec(
        IndexConfig(name="m", extra_filter_keys=["team"]), model="a", dims=384, chunking=ChunkingConfig()
    )
    assert fields_only_change(keyed, cfg, (*BASE_FILTER_KEYS, "team"))
    assert not fields_only_change(keyed, cfg, BASE_FILTER_KEYS)  # keys read wrong: digests differ
    assert not fields_only_change(old.model_copy(update={"schema_digest": "fe45906b9971"}), cfg, BASE_FILTER_KEYS)
    hnsw = index_spec(IndexConfig(name="m", hnsw_m=32), model="a", dims=384, chunking=ChunkingConfig())
    assert not fields_only_change(hnsw, cfg, BASE_FILTER_KEYS)
    assert not fields_only_change(old, cfg, None) and not fields_only_change(old, cfg, ("team",))


def test_an_index_tells_its_filter_keys_by_their_hashed_twins() -> None:
    attrs = {
        name: {"type": typ, "dim": None}
        for name, typ in [("terms", "text"), ("vkey", "tag"), ("tenant", "tag"), ("h_tenant", "numeric")]
        + [(k, "tag") for k in ("environment", "team")]
        + [(f"h_{k}", "numeric") for k in ("environment", "team")]
    }
    assert filter_keys_of(attrs) == ("environment", "team")


def test_only_a_live_build_makes_reads_follow_the_registry_fresh() -> None:
    """While a reindex beats, the generation is read fresh (it may switch any moment); an idle
    registry and a build abandoned long ago are read from the cache."""
    now = time.time()
    assert GenerationState(1, None, building=2, building_heartbeat=now - 5).build_alive(now)
    assert GenerationState(2, None, building=2, building_heartbeat=now - 5).build_alive(now)  # switched, catching up
    assert not GenerationState(1, None, building=2, building_heartbeat=now - 3600).build_alive(now)
    assert not GenerationState(1, None).build_alive(now)


def test_a_refused_switch_names_each_reason_once_with_its_docs() -> None:
    """29 docs gone from the topics are one reason followed by ten of their names, not the
    same sentence 29 times; a doc the new settings failed on keeps its own reason."""
    from daemon.reindex.completeness import NOT_CARRIED, NOT_REPLAYED, losses_refused, why_missing

    keys = [("default", f"doc/{i:02d}") for i in range(30)]
    failed = {("default", "doc/29"): "the model failed: too long"}
    message = str(losses_refused(why_missing(keys, failed), old=3))
    assert message.startswith("30 doc(s) served by generation 3 are not in the new build")
    assert message.count(NOT_REPLAYED) == 1 and "default/doc/09 and 19 more" in message
    assert "default/doc/10" not in message and "the model failed: too long: default/doc/29" in message
    assert NOT_CARRIED not in message
    # New chunking, say, on a broker that lost the events: the refusal says why no copy helped.
    assert NOT_CARRIED in str(losses_refused(why_missing(keys, failed), old=3, carried=False))


def test_a_spec_recorded_before_its_chunking_strategy_was_kept_reads_as_this_processs() -> None:
    """A generation recorded by a release that kept no strategy or min_tokens is compared as
    that release compared it: a deployment running `windows` is not refused on upgrade."""
    windows = index_spec(IndexConfig(name="m"), model="a", dims=384, chunking=ChunkingConfig(strategy="windows"))
    recorded = IndexSpec.model_validate_json(windows.model_dump_json(exclude={"strategy", "min_tokens"}))
    assert (recorded.strategy, recorded.min_tokens) == (None, None) and recorded != windows
    assert recorded.known(windows) == windows and carry_mode(recorded.known(windows), windows) == Carry()
    stable = index_spec(IndexConfig(name="m"), model="a", dims=384, chunking=ChunkingConfig())
    assert stable.known(windows) == stable and carry_mode(stable, windows) is None  # recorded: compared


@pytest.mark.parametrize(
    ("keys", "why"),
    [
        (["team-id"], "'team-id': not an identifier"),
        (["service"], "'service': a built-in filter key already"),
        (["text"], "'text': a field of every chunk"),
        (["chunk_gap"], "'chunk_gap': a field of every chunk"),  # where a doc's chunks join: never a tag's
        (["chunk_tail"], "'chunk_tail': a field of every chunk"),
        (["section"], "'section': a field of every chunk"),  # a document chunk's headings, in its results
        (["chunk_fence"], "'chunk_fence': a field of every chunk"),
        (["h_team"], "'h_team': reserved: h_"),
        (["team", "Team"], "'Team': listed twice"),
    ],
)
def test_an_extra_filter_key_that_cannot_be_one_says_why(keys: list[str], why: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(why)):
        IndexConfig(name="m", extra_filter_keys=keys)
    assert IndexConfig(name="m", extra_filter_keys=["team", "role"]).filter_keys[-2:] == ("team", "role")
