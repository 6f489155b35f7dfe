"""One lock for importing the heavy, torch-adjacent libraries from worker threads.

Why: the daemon loads the tokenizer (transformers) and preloads the graph layer (cdlib,
igraph, leidenalg) in two threads at start-up. When two threads import modules that import
each other's dependencies, Python's per-module import locks can only break the deadlock by
handing one thread a partially initialized module; seen here as "partially initialized
module 'torch' has no attribute 'Tensor'", which failed the preload (and could as well have
failed the tokenizer, and with it the daemon's start). Imports under this lock run one at a
time; everything else of those threads still overlaps.
"""

from __future__ import annotations

import threading

HEAVY_IMPORTS = threading.Lock()
