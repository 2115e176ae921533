"""edgecut's Python client: ``from edgecut import Client`` (docs/client.md)."""

from .client import Client, EdgecutError

__all__ = ["Client", "EdgecutError"]
