"""The peers' virtualenvs under ``bench/.peers``: found or installed, and mem0's probe."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from _common import BENCH_DIR, ROOT

PEERS_DIR = BENCH_DIR / ".peers"
SHARED = ROOT.parent / "shared"
AMS_CONSTRAINTS = SHARED / "peers" / "ams-0.15.2-constraints.txt"
AMS_VERSION = "0.15.2"
MEM0_VERSION = "2.2.1"


def find_python(version: str) -> str | None:
    """An interpreter of this minor version: on PATH, else under pyenv's versions."""
    candidates = [shutil.which(f"python{version}") or ""]
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates += sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"), reverse=True)
    for c in candidates:
        if c and subprocess.run([c, "--version"], capture_output=True).returncode == 0:
            return c
    return None


def pip_install(venv: Path, *args: str) -> None:
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *args], check=True)


def ensure_venv(name: str, python_version: str, steps: list[list[str]]) -> dict[str, Any]:
    """``bench/.peers/<name>``, created and installed by ``steps`` (pip arguments) when missing."""
    venv = PEERS_DIR / name
    marker = venv / ".installed"
    if marker.exists():
        return {"venv": str(venv.relative_to(ROOT)), "installed_now": False, **json.loads(marker.read_text())}
    python = find_python(python_version)
    if python is None:
        raise RuntimeError(f"no Python {python_version} here (PATH or pyenv)")
    shutil.rmtree(venv, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    for step in steps:
        pip_install(venv, *step)
    info = {"python": python, "install_s": round(time.perf_counter() - t0, 1), "steps": steps}
    marker.write_text(json.dumps(info))
    return {"venv": str(venv.relative_to(ROOT)), "installed_now": True, **info}


def ensure_ams() -> dict[str, Any]:
    # A plain install resolves to 0.15.0 with mcp 2.x and fails at import; 0.15.2 asks for an
    # agent-memory-client the registry lacks (see ../shared/peers/README.md).
    return ensure_venv(
        "ams",
        "3.12",
        [
            ["-c", str(AMS_CONSTRAINTS), "agent-memory-server==0.15.0"],
            ["--no-deps", f"agent-memory-server=={AMS_VERSION}"],
        ],
    )


def ensure_mem0() -> dict[str, Any]:
    # Python 3.11: the CPU build of torch the daemon uses is on this machine's disk for 3.11.
    # redisvl 0.12 / redis 5: mem0's Redis store calls SearchIndex.set_client, gone from later
    # redisvl, and mem0 asks for redis<6. [nlp]: spaCy, for its BM25 lemmatizer and entity
    # boosts. nltk: redisvl's TextQuery, which mem0's keyword search builds, loads NLTK's
    # English stopwords with it.
    return ensure_venv(
        "mem0",
        "3.11",
        [
            ["torch==2.13.0+cpu", f"mem0ai[nlp]=={MEM0_VERSION}", "sentence-transformers", "redisvl==0.12.1"],
            ["redis>=5,<6", "nltk"],
        ],
    )


MEM0_PROBE = """
import json, os, sys, time
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OPENAI_API_KEY="unused", MEM0_TELEMETRY="False")
from mem0 import Memory
redis_url, model = sys.argv[1], sys.argv[2]
m = Memory.from_config({
    "vector_store": {"provider": "redis", "config": {"redis_url": redis_url, "collection_name": "probe",
                                                     "embedding_model_dims": 384}},
    "embedder": {"provider": "huggingface", "config": {"model": model, "embedding_dims": 384}},
})
m.add([{"role": "user", "content": "Caroline: I went to the support group yesterday."}], user_id="conv", infer=False)
print(json.dumps(m.search("When did Caroline go to the support group?", top_k=10, filters={"user_id": "conv"})))
"""


def probe_mem0(redis_url: str) -> dict[str, Any]:
    """One add (infer=False) and one search through mem0's own API; what failed, if anything."""
    from memory.embedder import PACKAGED_MINILM, resolve_model_path

    python = PEERS_DIR / "mem0" / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HTTP_PROXY", "HTTPS_PROXY"))}
    proc = subprocess.run(
        [str(python), "-c", MEM0_PROBE, redis_url, resolve_model_path(PACKAGED_MINILM)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "Loading weights" not in line]
    errors = [line for line in lines if "Error" in line or "error" in line.split(":", 1)[0]]
    return {"returncode": proc.returncode, "stdout": proc.stdout[-2000:], "errors": errors[-8:], "tail": lines[-12:]}
