#!/usr/bin/env bash
# Install agentmemd into ./.venv: torch pinned first (a plain `torch` would pull a
# multi-GB CUDA build), then the project with its embedded servers, test tools and the
# LangGraph/LangChain integrations (their tests are part of the suite).
# Safe to re-run: it skips the work when pyproject.toml has not changed since the last run.
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
VENV="${AGENTMEM_VENV:-.venv}"
stamp="$VENV/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
if [[ -f "$stamp" ]]; then
  exit 0
fi
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
"$VENV/bin/python" -m pip install --quiet -e ".[local,test,langgraph]"
rm -f "$VENV"/.installed-*
touch "$stamp"
echo "installed into $VENV"
