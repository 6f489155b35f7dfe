"""The litellm path against a real OpenAI-compatible HTTP server on this machine: the
settings' base URL and key reach it, a call is made once (no retry by litellm or the
provider's client), and a model that does not answer in time is a failure, not a stall."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from pydantic import SecretStr

from graph.config import GraphConfig
from graph.errors import LlmFailed
from graph.extractor import Extractor
from graph.llm import complete, endpoint

pytestmark = pytest.mark.integration


@dataclass
class FakeModel:
    """What the server saw, and how it answers."""

    delay_s: float = 0.0
    seen: list[dict[str, Any]] = field(default_factory=list)
    base: str = ""


@pytest.fixture
async def model() -> AsyncIterator[FakeModel]:
    fake = FakeModel()

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        fake.seen.append({"auth": request.headers.get("Authorization"), "body": body})
        await asyncio.sleep(fake.delay_s)
        user = body["messages"][-1]["content"]
        reply = json.dumps({"entities": [{"name": w, "type": "service"} for w in user.split() if "-" in w]})
        return web.json_response(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    fake.base = f"http://127.0.0.1:{port}/v1"
    try:
        yield fake
    finally:
        await runner.cleanup()


def cfg(fake: FakeModel, **kw: Any) -> GraphConfig:
    return GraphConfig(llm_model="openai/team-model", llm_api_base=fake.base, llm_api_key=SecretStr("sk-team"), **kw)


async def test_the_settings_base_url_and_key_reach_the_model(model: FakeModel) -> None:
    res = await complete("openai/team-model", "sys", "ledger-service fails", timeout_s=10, **endpoint(cfg(model)))
    assert json.loads(res.text)["entities"] == [{"name": "ledger-service", "type": "service"}]
    assert (res.prompt_tokens, res.completion_tokens) == (7, 5)
    assert [s["auth"] for s in model.seen] == ["Bearer sk-team"]


async def test_a_model_that_does_not_answer_in_time_fails_once_without_retries(
    model: FakeModel, capfd: pytest.CaptureFixture[str]
) -> None:
    model.delay_s = 3.0
    with pytest.raises(LlmFailed):
        await complete("openai/team-model", "sys", "x", timeout_s=0.5, **endpoint(cfg(model)))
    await asyncio.sleep(1.0)  # a retry, had one been made, would have reached the server by now
    assert len(model.seen) == 1
    # litellm printed banners on a failure ("Give Feedback / Get Help"), into the JSON log.
    with pytest.raises(LlmFailed):
        await complete("openai/team-model", "sys", "x", timeout_s=5, api_base=model.base + "/nowhere", api_key="k")
    printed = capfd.readouterr()
    assert printed.out == "" and "LiteLLM" not in printed.err and "Give Feedback" not in printed.err, printed


async def test_extraction_calls_run_at_once_and_a_slow_model_leaves_ner_entities(model: FakeModel) -> None:
    extractor = Extractor(ner=None, cfg=cfg(model, llm_extraction=True, llm_concurrency=4))
    docs = [[(f"d{i}_p0", f"auth-service{i} talks to ledger-service")] for i in range(4)]
    made = await extractor.extract_chunks(docs)
    assert len(model.seen) == 4 and extractor.llm_tokens == 4 * 12
    assert all(made), made  # each doc's contribution holds the model's entities
    # A model too slow for the timeout: every chunk keeps what NER (here none) and the
    # identifier rules found, and the batch goes on.
    model.seen.clear()
    model.delay_s = 3.0
    slow = Extractor(ner=None, cfg=cfg(model, llm_extraction=True, llm_concurrency=4, llm_timeout_s=0.5))
    assert len(await slow.extract_chunks([[("x_p0", "billing-api calls ERR_LEDGER_LOCK_9C1")]])) == 1
