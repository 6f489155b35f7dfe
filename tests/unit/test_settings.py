"""Settings: env prefix and nesting, the TOML file, and the example config kept in sync."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from consumers.config import ConsumerConfig
from daemon.settings import Settings, render_markdown, render_toml, setting_rows
from daemon.settings_check import ConfigError
from memory.schema import index_schema

ROOT = Path(__file__).resolve().parents[2]


def test_example_toml_lists_every_setting() -> None:
    """config/agentmemd.toml is exactly what the settings class renders (run `agentmemd config toml`)."""
    assert (ROOT / "config" / "agentmemd.toml").read_text() == render_toml()


def test_configuration_markdown_lists_every_setting() -> None:
    """docs/configuration.md is exactly what the settings class renders (run `agentmemd config markdown`)."""
    assert (ROOT / "docs" / "configuration.md").read_text() == render_markdown()


def test_configuration_markdown_has_one_row_per_setting() -> None:
    """Every leaf setting is one table row naming its env var, and nothing else is a row."""
    rows = [line for line in render_markdown().splitlines() if line.startswith("| `")]
    envs = ["AGENTMEM_" + dotted.replace(".", "__").upper() for dotted, _, _ in setting_rows()]
    assert [row.split(" | ")[1].strip("`") for row in rows] == envs


def test_example_index_schema_is_current() -> None:
    """config/index.yaml is the schema the default settings create."""
    on_disk = yaml.safe_load((ROOT / "config" / "index.yaml").read_text())
    assert on_disk == index_schema(Settings().index, dims=384, generation=1)


def test_env_overrides_nested_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """AGENTMEM_ prefix, __ for nesting."""
    monkeypatch.setenv("AGENTMEM_KAFKA_BOOTSTRAP", "k:1")
    monkeypatch.setenv("AGENTMEM_TOPICS__REQUESTS", "custom.requests")
    monkeypatch.setenv("AGENTMEM_RETRIEVAL__FETCH_MULTIPLIER", "3")
    s = Settings()
    assert (s.kafka_bootstrap, s.topics.requests, s.retrieval.fetch_multiplier) == ("k:1", "custom.requests", 3.0)


def test_the_example_toml_loads_as_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example file is a working config: it loads, and gives exactly the defaults (its
    dict setting, graph.aliases, was once written as a string, which failed validation)."""
    for key in [k for k in os.environ if k.startswith("AGENTMEM_")]:
        monkeypatch.delenv(key)
    defaults = Settings().model_dump()
    monkeypatch.setenv("AGENTMEM_CONFIG_FILE", str(ROOT / "config" / "agentmemd.toml"))
    assert Settings().model_dump() == defaults


def test_toml_file_is_read_below_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """AGENTMEM_CONFIG_FILE names a TOML file; the environment still wins over it."""
    path = tmp_path / "c.toml"
    path.write_text('redis_url = "redis://from-toml:1/0"\n[index]\nname = "fromtoml"\n')
    monkeypatch.setenv("AGENTMEM_CONFIG_FILE", str(path))
    monkeypatch.setenv("AGENTMEM_INDEX__NAME", "fromenv")
    s = Settings()
    assert s.redis_url == "redis://from-toml:1/0" and s.index.name == "fromenv"


def test_a_config_file_named_in_dotenv_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``AGENTMEM_CONFIG_FILE`` in ``.env``, as every other setting may be: it was read from the
    environment only, and the file ignored without a word."""
    for key in [k for k in os.environ if k.startswith("AGENTMEM_")]:
        monkeypatch.delenv(key)
    (tmp_path / "c.toml").write_text("[chunking]\nmax_tokens = 128\n")
    (tmp_path / ".env").write_text("AGENTMEM_CONFIG_FILE=c.toml\n")
    monkeypatch.chdir(tmp_path)
    assert Settings().chunking.max_tokens == 128


def test_a_config_file_that_is_not_there_or_names_no_setting_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Else the defaults would run silently: a daemon against the default broker, or with the
    chunking the file meant to change. Each misspelling is named with the setting it is near."""
    monkeypatch.setenv("AGENTMEM_CONFIG_FILE", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match=r"missing\.toml, which is not a file"):
        Settings()
    monkeypatch.setenv("AGENTMEM_CONFIG_FILE", "relative.toml")
    with pytest.raises(ConfigError, match="a relative path is read from"):
        Settings()
    path = tmp_path / "c.toml"
    path.write_text('[chunking]\nmax_token = 100\n[retrival]\nx = 1\n[http_tenant_tokens]\nacme = "t"\n')
    monkeypatch.setenv("AGENTMEM_CONFIG_FILE", str(path))
    with pytest.raises(ConfigError) as caught:
        Settings()
    assert str(caught.value).endswith(
        "no such setting: chunking.max_token (did you mean chunking.max_tokens?); retrival (did you mean retrieval?)"
    )  # a mapping setting's keys (tenant tokens) are its values, not settings


@pytest.mark.parametrize(
    ("variables", "said"),
    [
        # Read past, AGENTMEM_CHUNKING__MAX_TOKEN left the chunking at its default.
        (
            ["AGENTMEM_CHUNKING__MAX_TOKEN", "AGENTMEM_KAFKA_BOOTSTRP"],
            "AGENTMEM_CHUNKING__MAX_TOKEN (did you mean AGENTMEM_CHUNKING__MAX_TOKENS?); "
            "AGENTMEM_KAFKA_BOOTSTRP (did you mean AGENTMEM_KAFKA_BOOTSTRAP?)",
        ),
        # An operator's AGENTMEM_HTTP__TOKEN left the explorer with no token, and AGENTMEM_TENANCY
        # the daemon in single tenancy: the setting's words, the underscores or the section wrong,
        # too far apart for a misspelling.
        (
            ["AGENTMEM_HTTP__TOKEN", "AGENTMEM_TENANCY", "AGENTMEM_EXPLORE__TOKEN"],
            "AGENTMEM_EXPLORE__TOKEN (did you mean AGENTMEM_HTTP_TOKEN or AGENTMEM_MCP__TOKEN?); "
            "AGENTMEM_HTTP__TOKEN (did you mean AGENTMEM_HTTP_TOKEN?); "
            "AGENTMEM_TENANCY (did you mean AGENTMEM_CONSUMER__TENANCY?)",
        ),
    ],
)
def test_a_variable_that_nearly_names_a_setting_is_refused(
    monkeypatch: pytest.MonkeyPatch, variables: list[str], said: str
) -> None:
    """A variable near no setting may be another program's, and the servers' and tests' own pass,
    as do those Kubernetes sets for a Service named agentmem and Docker's links for a container."""
    others = ["AGENTMEM_REDIS_SERVER_BIN", "AGENTMEM_TEST_WHATEVER", "AGENTMEM_SOMETHING_ELSE_ENTIRELY"]
    others += ["AGENTMEM_PORT", "AGENTMEM_SERVICE_HOST", "AGENTMEM_SERVICE_PORT", "AGENTMEM_PORT_8080_TCP_ADDR"]
    others += ["AGENTMEM_NAME", "AGENTMEM_ENV_FOO"]
    for name in others:
        monkeypatch.setenv(name, "x")
    Settings()
    for name in variables:
        monkeypatch.setenv(name, "1")
    with pytest.raises(ConfigError) as caught:
        Settings()
    assert str(caught.value) == f"no such setting: {said}"


def test_a_misspelt_variable_in_the_env_file_is_refused_too(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`.env` is read with the same prefix, in any case."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("agentmem_retrival__dense_weight=2\n")
    with pytest.raises(ConfigError, match=r"AGENTMEM_RETRIVAL__DENSE_WEIGHT \(did you mean AGENTMEM_RETRIEVAL__DENSE"):
        Settings()


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("AGENTMEM_CHUNKING__OVERLAP", "500"),
        ("AGENTMEM_INDEX__EXTRA_FILTER_KEYS", '["text"]'),
        # names redis-py's search results use for themselves, and the hash fields' prefix
        ("AGENTMEM_INDEX__EXTRA_FILTER_KEYS", '["payload"]'),
        ("AGENTMEM_INDEX__EXTRA_FILTER_KEYS", '["id"]'),
        ("AGENTMEM_INDEX__EXTRA_FILTER_KEYS", '["h_team"]'),
        # index names that would let one index's key patterns or index names reach another's
        ("AGENTMEM_INDEX__NAME", "mem*"),
        ("AGENTMEM_INDEX__NAME", "mem?"),
        ("AGENTMEM_INDEX__NAME", "mem[1]"),
        ("AGENTMEM_INDEX__NAME", "mem:g1"),
        ("AGENTMEM_INDEX__NAME", "mem-g1"),
        ("AGENTMEM_INDEX__NAME", "my mem"),
        ("AGENTMEM_INDEX__NAME", ""),
        ("AGENTMEM_INDEX__NAME", "x" * 65),
    ],
)
def test_invalid_settings_are_rejected(monkeypatch: pytest.MonkeyPatch, var: str, value: str) -> None:
    """Inconsistent settings fail at startup with a clear error."""
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError):
        Settings()


def test_index_names_that_stay_apart_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("agentmem", "team-a_memory", "mem-g", "mem-gx1", "7days"):
        monkeypatch.setenv("AGENTMEM_INDEX__NAME", name)
        assert Settings().index.name == name


def test_cli_prints_the_toml() -> None:
    """`agentmemd config toml` prints the same text."""
    out = subprocess.run(
        [str(Path(sys.executable).parent / "agentmemd"), "config", "toml"], capture_output=True, text=True, check=True
    )
    assert out.stdout == render_toml()


def test_a_heartbeat_over_a_third_of_the_session_is_refused() -> None:
    """Three heartbeats must fit in a session, or one late heartbeat drops the daemon from its
    groups; unset, the heartbeat follows the session (Apache Kafka's minimum, 6 s, gives 2 s)."""
    assert ConsumerConfig(session_timeout_ms=6000, heartbeat_interval_ms=2000).heartbeat_ms == 2000
    with pytest.raises(ValidationError, match="at most a third"):
        ConsumerConfig(session_timeout_ms=6000, heartbeat_interval_ms=2001)
    assert ConsumerConfig(session_timeout_ms=6000).heartbeat_ms == 2000
    assert ConsumerConfig().heartbeat_ms == 3000  # aiokafka's default, at the default 10 s session
    assert "heartbeat_interval_ms" not in ConsumerConfig(session_timeout_ms=6000).model_fields_set
