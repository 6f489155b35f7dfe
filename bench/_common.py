"""The benchmarks' environment: offline models, the project root on ``sys.path``, matplotlib's Agg.

Importing this module first (before any project module) sets the offline environment,
puts the project root on ``sys.path`` and selects matplotlib's Agg backend, so every
script runs as ``.venv/bin/python bench/<name>.py`` from the project root. Every other
``bench/_*.py`` module imports it first; the harness is in ``_servers`` (embedded servers,
processes), ``_run`` (a script's arguments and tail), ``_result`` (the JSON), ``_stats``
(percentiles, CPU, memory) and ``_synthetic_text``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "MPLBACKEND": "Agg",
}.items():
    os.environ.setdefault(_key, _value)

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
CACHE_DIR = BENCH_DIR / ".cache"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


import matplotlib  # noqa: E402  (after the environment on purpose)

matplotlib.use("Agg")
