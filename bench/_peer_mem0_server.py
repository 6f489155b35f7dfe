"""mem0 OSS behind the two endpoints of its own REST server, run in mem0's virtual environment.

mem0's server (``server/main.py`` in its repository, not in the ``mem0ai`` wheel) answers
``POST /memories`` with ``Memory.add`` and ``POST /search`` with ``Memory.search``, each request on
a worker thread. This is the same, on the standard library's threading HTTP server, so that
nothing but mem0 and its own dependencies is installed beside it.

Usage (``bench/peers.py`` starts it): ``python _peer_mem0_server.py PORT REDIS_URL MODEL_DIR HISTORY_DB``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OPENAI_API_KEY="unused", MEM0_TELEMETRY="False")

from mem0 import Memory  # after the offline switches


def build(redis_url: str, model: str, history: str) -> Memory:
    """No LLM (every add is ``infer=False``), the Redis vector store, the packaged MiniLM; its
    history database in the run's own folder."""
    return Memory.from_config(
        {
            "history_db_path": history,
            "vector_store": {
                "provider": "redis",
                "config": {"redis_url": redis_url, "collection_name": "bench", "embedding_model_dims": 384},
            },
            "embedder": {"provider": "huggingface", "config": {"model": model, "embedding_dims": 384}},
        }
    )


def check_offline_data() -> None:
    """Refuse to serve a degraded mem0: without these it falls back silently (no lemmas, no
    entity extraction) or fails every search (no stopwords)."""
    import nltk
    from mem0.utils.spacy_models import get_nlp_full, get_nlp_lemma

    if get_nlp_lemma() is None or get_nlp_full() is None:
        raise SystemExit("spaCy's en_core_web_sm did not load: mem0 would run without lemmas and entities")
    if len(nltk.corpus.stopwords.words("english")) < 100:
        raise SystemExit("NLTK's English stopwords are missing: every mem0 keyword search would fail")


class Server(ThreadingHTTPServer):
    # The standard library's backlog is 5: the benchmark's 16 askers connect at once, and a
    # full accept queue makes the kernel drop their handshakes.
    request_queue_size = 128
    daemon_threads = True


class Handler(BaseHTTPRequestHandler):
    memory: Memory
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn serves mem0's FastAPI server
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # one line per request is noise here
        return

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._reply(200 if self.path == "/health" else 404, {"ok": self.path == "/health"})

    def do_POST(self) -> None:
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            if self.path == "/memories":
                out = self.memory.add(
                    body["messages"], user_id=body["user_id"], metadata=body.get("metadata"), infer=False
                )
            elif self.path == "/search":
                out = self.memory.search(body["query"], top_k=body["top_k"], filters={"user_id": body["user_id"]})
            else:
                self._reply(404, {"detail": f"no route {self.path}"})
                return
        except Exception as exc:
            traceback.print_exc()
            self._reply(500, {"detail": f"{type(exc).__name__}: {exc}"})
            return
        self._reply(200, out)


def main() -> None:
    port, redis_url, model, history = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    check_offline_data()
    Handler.memory = build(redis_url, model, history)
    server = Server(("127.0.0.1", port), Handler)
    print(f"mem0 serving on {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
