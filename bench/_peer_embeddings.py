"""The embedding server AMS calls: ``peers.py --serve-embeddings PORT`` runs it."""

from __future__ import annotations

import asyncio
import socket


async def serve_embeddings(port: int) -> None:
    """OpenAI-compatible ``POST /v1/embeddings`` on the daemon's own embedder (worker process,
    length batching, same precision); one input is embedded as the daemon embeds a query."""
    from aiohttp import web

    from memory.config import EmbeddingConfig
    from memory.embedder import SentenceTransformerEmbedder

    embedder = await SentenceTransformerEmbedder.load(EmbeddingConfig(query_cache_size=0))  # type: ignore[call-arg]

    async def embeddings(request: web.Request) -> web.Response:
        sock = request.transport.get_extra_info("socket") if request.transport else None
        if sock is not None:
            # Nagle's algorithm against the client's delayed ACK cost ~40 ms per request.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = await request.json()
        raw = body["input"]
        texts = [raw] if isinstance(raw, str) else list(raw)
        if len(texts) == 1:
            vectors = [await embedder.embed_query(texts[0])]
        else:
            vectors = list(await embedder.embed_documents(texts))
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        usage = {"prompt_tokens": 0, "total_tokens": 0}
        return web.json_response({"object": "list", "model": body.get("model"), "data": data, "usage": usage})

    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_post("/v1/embeddings", embeddings)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        embedder.close()
