"""Settings that name nothing (pure): a misspelt key in the config file, or a misspelt
``AGENTMEM_`` variable, would otherwise leave the setting at its default without a word, and
a daemon would run against the wrong broker or with the wrong chunking.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

#: ``AGENTMEM_`` variables that are not settings: the config file's own name, the embedded
#: servers' files (``daemon.settings.embedded_server_files``) and the test suite's.
NOT_SETTINGS = frozenset({"CONFIG_FILE", "REDIS_SERVER_BIN", "REDIS_MODULES", "TANSU_BIN"})
NOT_SETTINGS_PREFIXES = ("TEST_",)


def _submodel(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    ann = model.model_fields[name].annotation
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _near(name: str, names: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.75)
    return close[0] if close else None


def unknown_keys(data: Mapping[str, Any], model: type[BaseModel], where: str = "") -> list[str]:
    """Each key of a config file's table that names no setting of ``model``, as
    ``section.key``, with the setting it may misspell (``chunking.max_token (did you mean
    chunking.max_tokens?)``). A mapping setting's own keys (token maps) are its values."""
    out: list[str] = []
    for key, value in data.items():
        if key not in model.model_fields:
            near = _near(key, model.model_fields)
            out.append(f"{where}{key}" + (f" (did you mean {where}{near}?)" if near else ""))
        elif isinstance(value, Mapping) and (sub := _submodel(model, key)) is not None:
            out.extend(unknown_keys(value, sub, f"{where}{key}."))
    return out


def misspelt_variables(names: Iterable[str], model: type[BaseModel], prefix: str = "AGENTMEM_") -> list[str]:
    """Each ``AGENTMEM_`` variable that names no setting but nearly names one, with that one
    (``AGENTMEM_CHUNKING__MAX_TOKEN (did you mean AGENTMEM_CHUNKING__MAX_TOKENS?)``). A
    variable near no setting is left alone: it may be another program's."""
    out: list[str] = []
    for name in sorted(names):
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix) :]
        if rest in NOT_SETTINGS or rest.startswith(NOT_SETTINGS_PREFIXES):
            continue
        parts = rest.lower().split("__")
        current: type[BaseModel] | None = model
        fixed: list[str] = []
        for part in parts:
            if current is None:  # below a setting that is no section: pydantic reports it
                break
            if part in current.model_fields:
                fixed.append(part)
                current = _submodel(current, part)
                continue
            near = _near(part, current.model_fields)
            if near is not None:
                hint = prefix + "__".join([*fixed, near, *parts[len(fixed) + 1 :]]).upper()
                out.append(f"{name} (did you mean {hint}?)")
            break
    return out
