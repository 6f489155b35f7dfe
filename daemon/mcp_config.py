"""``agentmemd mcp``'s settings, apart from the tools: every command reads the settings, and
only ``mcp`` needs the client the tools stand on."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr


class MCPConfig(BaseModel):
    """``agentmemd mcp``: the MCP server in front of the daemon's Kafka contract."""

    token: SecretStr = Field(
        SecretStr(""),
        description="Bearer token `agentmemd mcp --http` requires ('' = none; stdio never asks).",
    )
    host: str = Field("127.0.0.1", description="Address `agentmemd mcp --http` serves on (--host overrides it).")
    port: int = Field(8765, ge=1, le=65535, description="Port `agentmemd mcp --http` serves on (--port overrides it).")
    timeout_s: float = Field(
        10.0, gt=0, le=300, description="Deadline of one MCP tool call (the Kafka reply or ack it waits for)."
    )

    @property
    def client_timeout_s(self) -> float:
        """The client's own timeout: a little inside the tool's deadline, so the client's reason
        (the broker took nothing, the daemon did not answer) reaches the agent before the tool's
        deadline cuts the call short."""
        return self.timeout_s * 0.9
