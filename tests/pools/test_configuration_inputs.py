"""Every input of the gateway's snapshot announces its changes: no change leaves gateways stale.

The snapshot's inputs are found, not listed: the tables `load_snapshot()` reads are mapped to
their models, and each must be a `ConfigInput` whose declared fields are exactly what the
snapshot depends on. Each declared field is then changed every way Django can write it (a save,
a save of that field alone, `update()`, `bulk_update()`), and each input is created in bulk and
deleted: every one must bump the configuration version. A field the snapshot reads but the model
does not declare is found too, because changing it changes the snapshot.
"""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps
from django.db import connection, models, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from nexus.models import ApiToken, ConfigInput, ConfigVersion, Project
from nexus.signals import config_inputs
from nodes.models import Node, NodeStatus, NodeTrust
from pools.gateway.snapshot import Snapshot, load_snapshot
from pools.models import Pool, Target
from serving.models import Service
from tests.nexus.factories import make_pool, make_target

pytestmark = pytest.mark.django_db

TABLE = re.compile(r'(?:FROM|JOIN)\s+"?(\w+)"?', re.IGNORECASE)


def build_world() -> dict[type[ConfigInput], ConfigInput]:
    """Create one row of every snapshot input, each read by the snapshot; return them by model."""
    node = Node.objects.create(
        name="gpu-1",
        address="http://10.0.0.5:7100",
        trust=NodeTrust.TRUSTED,
        status=NodeStatus.ONLINE,
    )
    node.set_credential("node-secret")
    node.save()
    chat = make_pool("chat")
    hosted = make_target(chat, "hosted", credential="sk-provider")
    Target.objects.create(pool=chat, name="on-node", node=node, model_id="m")
    managed = Pool.objects.create(slug="svc", name="svc", managed=True)
    make_target(managed, "route-1")
    service = Service.objects.create(name="svc", pool=managed, open_to_public=False)
    token, _ = ApiToken.issue("app", pools=["chat"], expires_at=timezone.now() + timedelta(days=1))
    ApiToken.issue("old")[0].revoke()
    # A second project, so that a row's project can change (other_value picks another row).
    Project.objects.create(name="elsewhere")
    return {Node: node, Pool: chat, Target: hosted, Service: service, ApiToken: token}


def fresh(row: ConfigInput) -> ConfigInput:
    return type(row).objects.get(pk=row.pk)


def other_value(field: models.Field, current: Any) -> Any:
    """Return a value for the field that differs from `current` and the database accepts."""
    if field.is_relation:
        if current is not None and field.null:
            return None
        related = field.related_model._default_manager.exclude(pk=current)
        return related.order_by("pk").values_list("pk", flat=True).first()
    if field.choices:
        return next(value for value, _ in field.flatchoices if value != current)
    if isinstance(field, models.BooleanField):
        return not current
    if isinstance(field, models.IntegerField):
        return (current or 0) + 1
    if isinstance(field, models.FloatField):
        return (current or 0.0) + 0.5
    if isinstance(field, models.DateTimeField):
        return (current or timezone.now()) - timedelta(days=1)
    if isinstance(field, models.JSONField):
        return [*current, "changed"] if isinstance(current, list) else {**current, "changed": 1}
    if isinstance(field, models.CharField | models.TextField):
        limit = field.max_length or 1000
        return ("changed-" + current)[:limit] if current else "changed"
    raise AssertionError(f"no other value known for {field!r}")


def declared(model: type[ConfigInput]) -> list[models.Field]:
    return [model._meta.get_field(name) for name in sorted(model.config_fields)]


def undeclared(model: type[ConfigInput]) -> list[models.Field]:
    return [
        field
        for field in model._meta.concrete_fields
        if not field.primary_key and field.name not in model.config_fields
    ]


def cases(fields_of: Any) -> list[Any]:
    return [
        pytest.param(model, field.name, id=f"{model.__name__}.{field.name}")
        for model in sorted(config_inputs(), key=lambda model: model.__name__)
        for field in fields_of(model)
    ]


def at_rest(snapshot: Snapshot) -> Snapshot:
    """The snapshot without its version number, which every change moves."""
    return dataclasses.replace(snapshot, version=0)


def test_every_table_the_snapshot_reads_is_a_declared_config_input() -> None:
    # Given a configuration that uses every kind of input (a node target, a service's pool),
    build_world()
    by_table = {model._meta.db_table: model for model in apps.get_models()}

    # when the gateway loads its snapshot,
    with CaptureQueriesContext(connection) as queries:
        load_snapshot()

    # then every model it reads (but the version itself) announces its changes, and nothing
    # is declared an input that the snapshot does not read.
    read = {
        by_table[table]
        for query in queries.captured_queries
        for table in TABLE.findall(query["sql"])
        if table in by_table
    }
    assert ConfigVersion in read  # the capture sees what the snapshot reads
    assert read - {ConfigVersion} == set(config_inputs())


@pytest.mark.parametrize(("model", "name"), cases(declared))
def test_each_way_of_writing_a_declared_field_bumps_the_version(
    model: type[ConfigInput], name: str
) -> None:
    row = build_world()[model]
    field = model._meta.get_field(name)
    writes = {
        "save": lambda obj, value: (setattr(obj, field.attname, value), obj.save()),
        "save(update_fields)": lambda obj, value: (
            setattr(obj, field.attname, value),
            obj.save(update_fields=[name]),
        ),
        "update()": lambda obj, value: model.objects.filter(pk=obj.pk).update(**{name: value}),
        "bulk_update()": lambda obj, value: (
            setattr(obj, field.attname, value),
            model.objects.bulk_update([obj], [name]),
        ),
    }
    bumped = {}
    for way, write in writes.items():
        obj = fresh(row)
        before = ConfigVersion.current()
        write(obj, other_value(field, getattr(obj, field.attname)))
        bumped[way] = ConfigVersion.current() > before

    assert bumped == dict.fromkeys(writes, True)


@pytest.mark.parametrize("model", sorted(config_inputs(), key=lambda model: model.__name__))
def test_creating_in_bulk_and_deleting_an_input_bump_the_version(
    model: type[ConfigInput],
) -> None:
    row = build_world()[model]
    copy = fresh(row)
    copy.pk = None
    copy._state.adding = True
    for field in model._meta.concrete_fields:
        if field.unique and not field.primary_key or field.name == "name":
            setattr(copy, field.attname, other_value(field, getattr(copy, field.attname)))

    before = ConfigVersion.current()
    (created,) = model.objects.bulk_create([copy])
    after_create = ConfigVersion.current()
    created.delete()
    after_delete = ConfigVersion.current()

    assert before < after_create < after_delete


def test_saving_without_changing_what_the_snapshot_reads_leaves_the_version_alone() -> None:
    # Given a node whose agent answers its frequent refresh,
    node = build_world()[Node]
    before = ConfigVersion.current()

    # when only its last-seen time and metrics are saved, on a loaded and on a refreshed copy,
    node = fresh(node)
    node.last_seen_at = timezone.now()
    node.metrics = {"cpu": 0.5}
    node.save()
    node.refresh_from_db()
    node.last_seen_at = timezone.now()
    node.save()
    Node.objects.filter(pk=node.pk).update(last_seen_at=timezone.now())

    # then no gateway rebuilds its snapshot.
    assert ConfigVersion.current() == before


def test_a_change_rolled_back_is_never_announced() -> None:
    node = build_world()[Node]
    before = ConfigVersion.current()

    with pytest.raises(RuntimeError), transaction.atomic():
        Node.objects.filter(pk=node.pk).update(status=NodeStatus.OFFLINE)
        raise RuntimeError("the caller fails after the change")

    assert ConfigVersion.current() == before


@pytest.mark.parametrize(("model", "name"), cases(undeclared))
def test_a_field_that_is_not_declared_does_not_change_the_snapshot(
    model: type[ConfigInput], name: str
) -> None:
    # Given the snapshot of a configuration that uses every input,
    row = build_world()[model]
    before = at_rest(load_snapshot())
    field = model._meta.get_field(name)

    # when a field the model does not declare changes,
    model.objects.filter(pk=row.pk).update(
        **{name: other_value(field, getattr(row, field.attname))}
    )

    # then the snapshot is the same: the declaration misses nothing the snapshot reads.
    assert at_rest(load_snapshot()) == before


def test_a_token_limit_change_bumps_the_version_and_reaches_the_snapshot() -> None:
    token, secret = ApiToken.issue("app")
    before = ConfigVersion.current()

    token.requests_per_minute = 60
    token.tokens_per_minute = 1000
    token.max_concurrent = 2
    token.save()

    assert ConfigVersion.current() > before
    entry = load_snapshot().tokens[token.token_hash]
    assert (
        entry.limits.requests_per_minute,
        entry.limits.tokens_per_minute,
        entry.limits.concurrent,
    ) == (60, 1000, 2)
