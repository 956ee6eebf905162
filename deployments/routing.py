"""Websocket routes for the deployment pages."""

from __future__ import annotations

websocket_urlpatterns: list = []
