"""The balancer core: pure functions over snapshots; no Django, Redis or httpx imports.

`strategies.decide` turns a snapshot (`snapshot.TargetView`s, the pool's `PoolPolicy`, the
request's `RequestFacts`) into an explained `Decision`; docs/balancer.md states the rules.
"""
