"""The balancer core: pure functions over snapshots; no Django, Redis or httpx imports."""
