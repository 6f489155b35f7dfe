"""The graph's Lua scripts, read once at import from ``graph/lua/`` (package data).

Each script runs atomically in Redis. ``clear_if_gen_fn.lua``, ``mark_fn.lua`` and
``queue_fn.lua`` each define one Lua function that the scripts clearing, setting or queueing a
stale mark share; it is prepended to each of them.
"""

from __future__ import annotations

from importlib.resources import files


def _read(name: str) -> str:
    return (files("graph") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


_CLEAR_FN = _read("clear_if_gen_fn")
_QUEUE_FN = _read("queue_fn")
_MARK_FN = _QUEUE_FN + _read("mark_fn")

APPLY = _MARK_FN + _read("apply")
CLAIM = _read("claim")
CLEAR_IF_GEN = _CLEAR_FN + _read("clear_if_gen")
COMMIT_SUMMARY = _QUEUE_FN + _CLEAR_FN + _read("commit_summary")
MARK = _MARK_FN + _read("mark")
RECORD_FAILURE = _read("record_failure")
RELEASE = _read("release")
RENEW = _read("renew")
