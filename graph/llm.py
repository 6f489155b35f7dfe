"""The litellm path: community summaries and (optionally) entity extraction by an LLM.

Only used when ``graph.llm_model`` is set. Tests drive it with litellm's own
``mock_response``, so the prompt and the parsing are the real ones.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from graph.config import GraphConfig
from graph.errors import LlmFailed
from memory.errors import BackendUnavailable

log = structlog.get_logger()

SUMMARY_SYSTEM = (
    "You write the summary of one community of an entity graph built from an engineering "
    "team's documents and agent transcripts. Say what the entities have in common, the "
    "incidents, errors and fixes that connect them, and the identifiers (error codes, "
    "services, config keys) exactly as written. At most 150 words. No preamble."
)

EXTRACT_SYSTEM = (
    'Extract the named technical entities from the text. Reply with JSON only: {"entities": '
    '[{"name": "...", "type": "service|error_code|http_status|exception|config_key|host|'
    'file_path|function|sql_table|org|product|person|concept"}]}'
)


@dataclass(frozen=True, slots=True)
class LlmResult:
    """Text from the model and the tokens it cost."""

    text: str
    prompt_tokens: int
    completion_tokens: int


def summary_prompt(community_id: str, members: Sequence[str], excerpts: Sequence[str], *, of: int | None = None) -> str:
    """The user message for one community: its members (``of``: how many it has in all, when
    ``members`` are only the most mentioned), then source excerpts."""
    total = len(members) if of is None else of
    head = f"Community {community_id} has {total} entities" + (
        ":" if total == len(members) else f"; the {len(members)} most mentioned:"
    )
    lines = [head, ", ".join(members), "", "Source excerpts:"]
    lines += [f"- {e}" for e in excerpts]
    return "\n".join(lines)


def endpoint(cfg: GraphConfig) -> dict[str, Any]:
    """The model's API base and key as litellm takes them, where the settings give them."""
    out: dict[str, Any] = {}
    if cfg.llm_api_base:
        out["api_base"] = cfg.llm_api_base
    if key := cfg.llm_api_key.get_secret_value():
        out["api_key"] = key
    return out


async def complete(
    model: str, system: str, user: str, *, timeout_s: float, mock_response: str | None = None, **extra: Any
) -> LlmResult:
    """One chat completion through litellm, within ``timeout_s`` in all: neither litellm nor the
    provider's client retries (an OpenAI client's two retries made a 12 s timeout take 37 s).

    Raises:
        LlmFailed: the call failed, timed out or returned no text (retryable).
    """
    import litellm

    # Its banner and "LiteLLM.Info" lines are printed, not logged: they broke the JSON log.
    litellm.suppress_debug_info = True
    kwargs: dict[str, Any] = {"timeout": timeout_s, "num_retries": 0, "max_retries": 0, **extra}
    if mock_response is not None:
        kwargs["mock_response"] = mock_response
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    try:
        resp = await asyncio.wait_for(litellm.acompletion(model=model, messages=messages, **kwargs), timeout_s)
    except TimeoutError as exc:
        raise LlmFailed(f"LLM {model} failed: no reply within {timeout_s:g} s") from exc
    except Exception as exc:  # litellm raises many provider-specific types; all mean "failed"
        if "connect" in str(exc).lower():
            raise BackendUnavailable(f"LLM {model} unreachable: {exc}") from exc
        raise LlmFailed(f"LLM {model} failed: {type(exc).__name__}: {exc}") from exc
    try:
        text = (resp.choices[0].message.content or "").strip()
    except (AttributeError, IndexError, TypeError) as exc:  # a proxy that answers with no choice
        raise LlmFailed(f"LLM {model} returned no choice: {type(exc).__name__}: {exc}") from exc
    if not text:
        raise LlmFailed(f"LLM {model} returned no text")
    usage = getattr(resp, "usage", None)
    return LlmResult(
        text=text,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
    )


def parse_entities(text: str) -> list[tuple[str, str]]:
    """``(name, type)`` pairs from an extraction reply; anything malformed is skipped.

    Raises:
        LlmFailed: the reply is not the JSON object asked for.
    """
    start, end = text.find("{"), text.rfind("}")
    try:
        data = json.loads(text[start : end + 1]) if start >= 0 else None
    except ValueError as exc:
        raise LlmFailed(f"extraction reply is not JSON: {text[:80]!r}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("entities"), list):
        raise LlmFailed("extraction reply has no 'entities' list")
    pairs = []
    for ent in data["entities"]:
        if isinstance(ent, dict) and isinstance(ent.get("name"), str) and ent["name"].strip():
            typ = ent["type"] if isinstance(ent.get("type"), str) else "concept"
            pairs.append((ent["name"], typ))
    return pairs
