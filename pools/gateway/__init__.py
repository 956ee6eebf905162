"""The gateway: the ASGI proxy for /v1, the product's hot path."""
