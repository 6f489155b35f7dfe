"""Importing: one lock for the heavy, torch-adjacent libraries imported from worker threads,
and the packages' lazy façades.

Why: the daemon loads the tokenizer (transformers) and preloads the graph layer (cdlib,
igraph, leidenalg) in two threads at start-up. When two threads import modules that import
each other's dependencies, Python's per-module import locks can only break the deadlock by
handing one thread a partially initialized module; seen here as "partially initialized
module 'torch' has no attribute 'Tensor'", which failed the preload (and could as well have
failed the tokenizer, and with it the daemon's start). Imports under this lock run one at a
time; everything else of those threads still overlaps.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

HEAVY_IMPORTS = threading.Lock()


def lazy_exports(package: str, homes: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` that imports each public name from its home module
    on first use (then keeps it in ``namespace``), so importing one light piece (the client,
    a config model) does not pull in the rest (the model, Redis search, FastStream, spaCy)."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    return __getattr__
