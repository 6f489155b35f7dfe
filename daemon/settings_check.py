"""Settings that name nothing (pure): a misspelt key in the config file, or a misspelt
``AGENTMEM_`` variable, would otherwise leave the setting at its default without a word, and
a daemon would run against the wrong broker or with the wrong chunking.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from memory.errors import MemdError


class ConfigError(MemdError):
    """The deployment's settings cannot be read as written: a config file that is not there,
    or a key or variable that names no setting (a misspelling the defaults would hide)."""

    code = "invalid_config"


#: ``AGENTMEM_`` variables of the test suite's own, which are no settings either, and those
#: Kubernetes sets in every pod for a Service named ``agentmem`` (``AGENTMEM_PORT``,
#: ``AGENTMEM_SERVICE_HOST``, ``AGENTMEM_PORT_8080_TCP_ADDR``, ...) and Docker's links for a
#: container of that name (``AGENTMEM_NAME``, ``AGENTMEM_ENV_...``).
NOT_SETTINGS_PREFIXES = ("TEST_", "SERVICE_", "PORT_", "ENV_")
NOT_SETTINGS_NAMES = frozenset({"PORT", "NAME"})


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


def _setting_names(model: type[BaseModel], where: str = "") -> list[str]:
    """Every setting's variable name after the prefix, lower case (``chunking__max_tokens``)."""
    out: list[str] = []
    for name in model.model_fields:
        sub = _submodel(model, name)
        out.extend(_setting_names(sub, f"{where}{name}__") if sub is not None else [f"{where}{name}"])
    return out


def _words(name: str) -> list[str]:
    return [w for w in name.split("_") if w]


def _meant(rest: str, settings: Sequence[str]) -> list[str]:
    """The settings a variable (lower case, after the prefix) that names none may mean, when
    the difference is more than a letter: its underscores (``http__token`` for ``http_token``,
    ``consumer_tenancy`` for ``consumer__tenancy``), or its section (``tenancy``,
    ``explore__token``: the settings whose name ends with its last part's words)."""
    same = [s for s in settings if _words(s) == _words(rest)]
    if same:
        return same
    last = _words(rest.split("__")[-1])
    return [s for s in settings if _words(s)[-len(last) :] == last][:3] if last else []


def misspelt_variables(
    names: Iterable[str], model: type[BaseModel], *, others: Collection[str] = (), prefix: str = "AGENTMEM_"
) -> list[str]:
    """Each ``AGENTMEM_`` variable that names no setting but nearly names one, with that one
    (``AGENTMEM_CHUNKING__MAX_TOKEN (did you mean AGENTMEM_CHUNKING__MAX_TOKENS?)``), in any
    case, as settings are read. Nearly: a letter or two apart, or the same words apart from
    their underscores or section (``AGENTMEM_HTTP__TOKEN``, ``AGENTMEM_TENANCY``): read past,
    such a variable would leave a token unset or the tenancy single. A variable near no
    setting is left alone: it may be another program's. ``others``: the names after the prefix
    that are variables but no settings."""
    settings = _setting_names(model)
    out: list[str] = []
    for name in sorted({n.upper() for n in names}):
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix) :]
        if rest in others or rest in NOT_SETTINGS_NAMES or rest.startswith(NOT_SETTINGS_PREFIXES):
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
            elif meant := _meant(rest.lower(), settings):
                hint = " or ".join(prefix + m.upper() for m in meant)
                out.append(f"{name} (did you mean {hint}?)")
            break
    return out
