"""Settings, wiring, lifecycle, embedded servers and the CLI. Nothing imports this package."""

from daemon.settings import Settings

__all__ = ["Settings"]
