"""The one settings class: env (``AGENTMEM_``), an optional ``.env``, an optional TOML file.

Precedence, highest first: init arguments, environment, ``.env``, the TOML file named by
``AGENTMEM_CONFIG_FILE``, defaults. ``config/agentmemd.toml`` and ``docs/configuration.md``
list every setting with its default and meaning (tests keep them in sync with this class).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from consumers.config import ConsumerConfig, KafkaSecurity, Topics
from consumers.topic_names import TENANT_NAME_RULE, valid_tenant
from daemon.explore.access import Access, duplicate_tokens
from daemon.explore.config import ExploreConfig
from daemon.mcp_config import MCPConfig
from daemon.settings_check import ConfigError, misspelt_variables, unknown_keys
from graph import GraphConfig
from memory.config import ChunkingConfig, EmbeddingConfig, IndexConfig, IngestConfig, RetrievalConfig


class Settings(BaseSettings):
    """Everything the daemon and the CLI can be told."""

    model_config = SettingsConfigDict(
        env_prefix="AGENTMEM_",
        env_nested_delimiter="__",
        env_file=".env",
        extra="ignore",
        # An error must not print what it refused: the tokens and passwords among it.
        hide_input_in_errors=True,
    )

    kafka_bootstrap: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers, comma-separated.")
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        pattern=r"^(redis|rediss|unix)://",
        description="Redis (with the search module) URL; rediss:// for TLS.",
    )
    redis_username: str = Field("", description="Redis ACL user ('' = default user or the one in the URL).")
    redis_password: SecretStr = Field(SecretStr(""), description="Redis password (never logged).")
    redis_ssl_ca_certs: str = Field("", description="CA bundle for rediss:// ('' = system CAs).")
    redis_ssl_certfile: str = Field("", description="Client certificate for rediss:// mutual TLS.")
    redis_ssl_keyfile: str = Field("", description="Client key for rediss:// mutual TLS.")
    data_dir: Path = Field(Path(".agentmem"), description="Where `agentmemd servers`/`up` keep Redis's AOF and logs.")
    topic_partitions: int = Field(4, ge=1, le=1024, description="Partitions of topics the daemon creates.")
    topic_replication: int = Field(1, ge=1, le=16, description="Replication factor of topics the daemon creates.")
    topic_exchange_retention_ms: int = Field(
        3_600_000,
        ge=60_000,
        description=(
            "How long Kafka keeps the requests and replies topics' records (retention.ms and segment.ms, set "
            "when the daemon creates them): an answer is read within seconds, and kept forever it would fill "
            "the broker's disk with every reply. The embedded broker (tansu) keeps every record in memory "
            "regardless."
        ),
    )
    topic_event_retention_ms: int = Field(
        -1,
        ge=-1,
        description=(
            "How long Kafka keeps the documents and transcripts topics' records (retention.ms, set when "
            "the daemon creates them); -1, the default: forever. They are the memory's log: a reindex with "
            "a new model or chunking replays them, and a doc or turn whose events are gone can then only be "
            "kept by staying on the old settings. At least an hour when set."
        ),
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    log_format: Literal["auto", "json", "console"] = Field(
        "auto", description="auto: console on a TTY, JSON otherwise."
    )
    create_topics: bool = Field(True, description="Create missing topics at startup and whenever they vanish.")
    topic_check_s: float = Field(
        10.0, gt=0, description="How often missing topics are looked for (a broker that lost them, e.g. tansu)."
    )
    http_host: str = Field("127.0.0.1", description="Address of /healthz, /readyz, /metrics and the status page.")
    http_port: int = Field(8080, ge=0, le=65535, description="Port of the HTTP server (0 = no HTTP server).")
    http_token: SecretStr = Field(
        SecretStr(""),
        description="Bearer token every HTTP endpoint but /healthz and /readyz then requires "
        "(Prometheus scrapes with it); it sees every tenant ('' = none).",
    )
    http_tenant_tokens: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="Tenant -> bearer token that sees only that tenant in the explorer, as JSON in the "
        'environment: {"acme": "..."}. Setting one also makes every endpoint but health require a token.',
    )
    status_sample_s: float = Field(5.0, gt=0, description="How often lag, queue depth and index size are sampled.")
    shutdown_timeout_s: float = Field(30.0, gt=0, description="Time given to in-flight messages on SIGTERM.")
    up_drain_s: float = Field(
        60.0,
        ge=0,
        description=(
            "`up` only: on Ctrl-C or SIGTERM, the daemon keeps applying the events its embedded broker still "
            "holds (it keeps them in memory only) until they are applied or this long passes with none applied "
            "(a large document being embedded counts as applying), then stops (0: no wait; a second Ctrl-C ends it)."
        ),
    )
    kafka_security: KafkaSecurity = Field(default_factory=KafkaSecurity)
    topics: Topics = Field(default_factory=Topics)
    consumer: ConsumerConfig = Field(default_factory=ConsumerConfig)
    index: IndexConfig = Field(default_factory=IndexConfig)
    embedding: EmbeddingConfig = Field(default_factory=EmbeddingConfig)
    chunking: ChunkingConfig = Field(default_factory=ChunkingConfig)
    retrieval: RetrievalConfig = Field(default_factory=RetrievalConfig)
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    graph: GraphConfig = Field(default_factory=GraphConfig)
    mcp: MCPConfig = Field(default_factory=MCPConfig)
    explore: ExploreConfig = Field(default_factory=ExploreConfig)

    @field_validator("topic_event_retention_ms")
    @classmethod
    def _event_retention_forever_or_an_hour(cls, value: int) -> int:
        if value != -1 and value < 3_600_000:
            raise ValueError("keeps the memory's events: -1 (forever) or at least 3600000 (an hour)")
        return value

    @field_validator("http_tenant_tokens")
    @classmethod
    def _tenant_tokens_not_empty(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        if empty := sorted(t for t, token in value.items() if not token.get_secret_value().strip()):
            raise ValueError(f"the token of {', '.join(empty)} is empty: give it a token, or leave it out")
        if bad := sorted(t for t in value if not valid_tenant(t)):
            # Such a tenant has no topics, so its token would open an explorer of nothing.
            raise ValueError(f"{', '.join(map(repr, bad))} is no tenant name ({TENANT_NAME_RULE})")
        return value

    @model_validator(mode="after")
    def _tokens_name_one_principal(self) -> Settings:
        clashes = duplicate_tokens(self.http_token.get_secret_value(), self.http_access().tenant_tokens or {})
        if clashes:
            raise ValueError(
                f"http_tenant_tokens (AGENTMEM_HTTP_TENANT_TOKENS): the token of {', '.join(clashes)} is another's "
                "too (a tenant's, or the operator's AGENTMEM_HTTP_TOKEN): each needs its own"
            )
        return self

    def http_access(self) -> Access:
        """The HTTP server's tokens (``daemon.explore.access``)."""
        return Access(
            token=self.http_token.get_secret_value(),
            tenant_tokens={t: v.get_secret_value() for t, v in self.http_tenant_tokens.items()},
        )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then environment, then ``.env``, then the TOML file named by
        ``AGENTMEM_CONFIG_FILE`` (if any), then secrets files, then the defaults."""
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings, dotenv_settings]
        # The environment's and the .env file's (read with the same prefix, so as loosely).
        dotenv: Mapping[str, str | None] = getattr(dotenv_settings, "env_vars", None) or {}
        names = [*os.environ, *dotenv]
        if misspelt := misspelt_variables(names, Settings, others=_NOT_SETTINGS):
            raise ConfigError(f"no such setting: {'; '.join(misspelt)}")
        # Named in the environment or in .env, as any setting may be (.env keys come lowercased).
        toml_path = os.environ.get("AGENTMEM_CONFIG_FILE") or dotenv.get("agentmem_config_file")
        if toml_path:
            path = Path(toml_path)
            if not path.is_file():
                where = "" if path.is_absolute() else f" (a relative path is read from {Path.cwd()})"
                raise ConfigError(f"AGENTMEM_CONFIG_FILE names {toml_path}, which is not a file{where}")
            toml = TomlConfigSettingsSource(settings_cls, toml_file=path)
            if unknown := unknown_keys(toml.toml_data, Settings):
                raise ConfigError(f"{toml_path}: no such setting: {'; '.join(unknown)}")
            sources.append(toml)
        sources.append(file_secret_settings)
        return tuple(sources)


class EmbeddedServerFiles(BaseModel):
    """Where the embedded servers' files are, on machines with their own builds (``None``:
    those of the installed wheels). Read from the environment, not ``Settings``: ``agentmemd
    servers`` and the test suite start servers before any deployment's settings exist."""

    model_config = ConfigDict(frozen=True)

    redis_server_bin: str | None = None
    redis_modules: tuple[str, ...] | None = None
    tansu_bin: str | None = None


#: ``AGENTMEM_`` variables that are no settings: the config file's name and the embedded
#: servers' files.
_NOT_SETTINGS = frozenset({"CONFIG_FILE", *(name.upper() for name in EmbeddedServerFiles.model_fields)})


def embedded_server_files() -> EmbeddedServerFiles:
    """``AGENTMEM_REDIS_SERVER_BIN``, ``AGENTMEM_REDIS_MODULES`` (``:``-separated ``.so``
    paths) and ``AGENTMEM_TANSU_BIN``, as set in the environment."""
    modules = os.environ.get("AGENTMEM_REDIS_MODULES")
    return EmbeddedServerFiles(
        redis_server_bin=os.environ.get("AGENTMEM_REDIS_SERVER_BIN") or None,
        redis_modules=tuple(m for m in modules.split(":") if m) if modules else None,
        tansu_bin=os.environ.get("AGENTMEM_TANSU_BIN") or None,
    )


def namespaced(name: str, **over: Any) -> Settings:
    """Settings whose topics, consumer groups and index are all named after ``name``.

    One deployment's whole footprint under one prefix: for tests and benchmarks that share
    a broker and a Redis, and for running two deployments side by side. ``consumer`` and
    ``index`` may be given (their names are then the caller's); anything else is passed on.
    """
    topics = Topics(
        documents=f"{name}.documents",
        transcripts=f"{name}.transcripts",
        requests=f"{name}.requests",
        replies=f"{name}.replies",
        dlq=f"{name}.dlq",
    )
    return Settings(
        topics=topics,
        consumer=over.pop("consumer", ConsumerConfig(group_id=name)),
        index=over.pop("index", IndexConfig(name=name)),
        **over,
    )


def setting_rows(model: type[Any] = Settings, prefix: str = "") -> list[tuple[str, Any, str]]:
    """``(dotted name, default, description)`` for every leaf setting, for docs and the TOML."""
    rows: list[tuple[str, Any, str]] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields") and field.default_factory is not None:
            rows.extend(setting_rows(ann, f"{prefix}{name}."))
            continue
        default = field.get_default(call_default_factory=True)
        rows.append((f"{prefix}{name}", default, field.description or ""))
    return rows


def _toml_value(value: Any) -> str:
    if isinstance(value, SecretStr):
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_value(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_toml() -> str:
    """The full example config: every setting, its default, what it means, its env name."""
    lines = [
        "# agentmemd settings: every setting with its default and meaning.",
        "# Use: AGENTMEM_CONFIG_FILE=config/agentmemd.toml agentmemd run",
        "# Each can also be set in the environment, e.g. AGENTMEM_INDEX__NAME=agentmem.",
        "# Generated by `agentmemd config toml`; a test keeps it in sync with daemon/settings.py.",
        "",
    ]
    section = None
    for dotted, default, desc in setting_rows():
        head, _, leaf = dotted.rpartition(".")
        if head != section:
            section = head
            lines += ["", f"[{head}]"] if head else []
        env = "AGENTMEM_" + dotted.replace(".", "__").upper()
        lines.append(f"# {desc} (env {env})")
        # TOML has no null: a setting unset by default is shown commented out.
        lines.append(f"# {leaf} =" if default is None else f"{leaf} = {_toml_value(default)}")
    return "\n".join(lines).strip() + "\n"


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown() -> str:
    """``docs/configuration.md``: one table per section (setting, env name, default, meaning)."""
    lines = [
        "# Configuration",
        "",
        "<!-- Generated by `agentmemd config markdown` from daemon/settings.py; a test keeps it in sync. -->",
        "",
        "One settings class, `daemon/settings.py` `Settings`, composed of each component's config",
        "section. Precedence, highest first: the environment (prefix `AGENTMEM_`, `__` between a",
        "section and its setting), an optional `.env`, the TOML file named by `AGENTMEM_CONFIG_FILE`",
        "([config/agentmemd.toml](../config/agentmemd.toml) lists every setting), the defaults.",
        "A config file that is not there, a key of it that names no setting, and an `AGENTMEM_`",
        "variable that nearly names one (`AGENTMEM_CHUNKING__MAX_TOKEN`, or its words with other",
        "underscores or another section: `AGENTMEM_HTTP__TOKEN`, `AGENTMEM_TENANCY`) are refused at start, each",
        "named with the setting it is near: the defaults would otherwise run without a word. Those",
        "Kubernetes sets for a Service named `agentmem` (`AGENTMEM_PORT`, `AGENTMEM_SERVICE_HOST`, ...)",
        "and Docker's links (`AGENTMEM_NAME`, `AGENTMEM_ENV_...`) are no settings and pass.",
        "`agentmemd config show` prints the effective settings; regenerate this page with",
        "`agentmemd config markdown > docs/configuration.md`. What some of them trade off, measured:",
        "[operations.md](operations.md#tuning).",
    ]
    section = None
    for dotted, default, desc in setting_rows():
        head, _, leaf = dotted.rpartition(".")
        if head != section:
            section = head
            title = f"`[{head}]`" if head else "Top level"
            lines += ["", f"## {title}", "", "| Setting | Env var | Default | Meaning |", "|---|---|---|---|"]
        env = "AGENTMEM_" + dotted.replace(".", "__").upper()
        shown = "unset" if default is None else f"`{_markdown_cell(_toml_value(default))}`"
        lines.append(f"| `{leaf}` | `{env}` | {shown} | {_markdown_cell(desc)} |")
    return "\n".join(lines) + "\n"
