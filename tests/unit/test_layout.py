"""Package layout rules from STYLE.md: our `daemon`, public names, import direction."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["daemon", "consumers", "graph", "memory"]
# daemon -> consumers -> graph -> memory: a package may import only those after it.
ORDER = {name: i for i, name in enumerate(PACKAGES)}


def test_daemon_package_is_ours() -> None:
    """`import daemon` resolves to this repo, not python-daemon's package of the same name."""
    import daemon

    assert Path(daemon.__file__).resolve().is_relative_to(ROOT)


@pytest.mark.parametrize("package", PACKAGES)
def test_all_exports_exist(package: str) -> None:
    """Every name in a package's __all__ is importable and listed once."""
    mod = importlib.import_module(package)
    names = list(mod.__all__)
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(mod, name), f"{package}.{name}"


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_one_way(package: str) -> None:
    """memory imports none of the others, nothing imports daemon, and so on down the chain."""
    for path in (ROOT / package).rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module]
            for target in targets:
                top = target.split(".")[0]
                if top in ORDER and top != package:
                    assert ORDER[top] > ORDER[package], f"{path.relative_to(ROOT)} imports {target}"


def test_the_client_imports_none_of_the_daemon() -> None:
    """`from consumers import MemoryClient` loads neither FastStream nor Redis search, the model, spaCy or the graph."""
    import subprocess
    import sys

    code = (
        "import sys; from consumers import MemoryClient; "
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert "consumers" in loaded and "aiokafka" in loaded
    heavy = {"faststream", "redis", "redisvl", "torch", "spacy", "sentence_transformers", "networkx", "cdlib", "graph"}
    heavy |= {"langgraph", "langchain_core"}  # the integrations' own modules import them, nothing else
    assert not loaded & heavy, loaded & heavy
