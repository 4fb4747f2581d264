"""A Django Channels consumer, standing in for those a project that uses Channels already has."""

from __future__ import annotations

from channels.generic.websocket import AsyncWebsocketConsumer


class EchoConsumer(AsyncWebsocketConsumer):
    """Echoes every text frame back, prefixed with `echo: `."""

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Answer one frame."""
        await self.send(text_data=f"echo: {text_data}")
