"""Model services: declare one, change it (a new revision), scale it, delete it; read its state.

These functions only record what is wanted. The reconciler (`serving.reconciler`) makes it so:
it places and starts replicas, rolls out the latest revision and finishes a delete. Every check
runs before anything is written, and every problem is reported at once, so a refused call leaves
nothing behind.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.contrib.auth.models import User
from django.db import IntegrityError, models, transaction
from django.db.models import Count, Max, Q, QuerySet

from pools.models import Pool
from serving.defaults import DEFAULT_GROUP
from serving.definitions import parse_memory
from serving.definitions.command_import import DEFAULT_MOUNT
from serving.definitions.values import key_path
from serving.launch import CUSTOM, Launch, LaunchError, LaunchProblem, resolve_launch
from serving.models import (
    ModelFolder,
    ResourceGroup,
    ResourcePreset,
    Revision,
    Route,
    RouteState,
    Service,
    ServiceLifecycle,
    readiness_text,
)
from serving.replicas import clear_errors_and_retry
from serving.scheduler import slots_text

NAME_MAX_LENGTH = 64
MAX_REPLICAS = 64
PROJECT_MAX_LENGTH = 100
# Django's slug: the name is a URL path segment (/serve/<name>/) and the managed pool's slug.
_SLUG = re.compile(r"[-A-Za-z0-9_]+")
# The launch settings resolve_launch reads to make the revision's spec.
RESOLVED_FIELDS = (
    "model_folder",
    "runtime_variant",
    "mount_destination",
    "model_definition_path",
    "command",
    "command_settings",
    "environ",
    "runtime_parameters",
    "cluster_size",
    "extra_mounts",
)
# What a revision is made of; a change to any of them makes a new revision.
LAUNCH_FIELDS = (*RESOLVED_FIELDS, "resource_group", "preset", "resource_slots")
# The service's own settings: changing them makes no revision.
SERVICE_FIELDS = ("desired_replicas", "open_to_public", "scale_to_zero_after_s")
FINISHED_ROUTES_SHOWN = 20
# Live: a process that takes, or is about to take, requests; a failed route waiting for its
# replacement is not, nor is one terminated. Deleting the service stops these.
LIVE_ROUTE_STATES = (RouteState.PROVISIONING, RouteState.HEALTHY, RouteState.TERMINATING)
M = TypeVar("M", bound=models.Model)


class ServiceError(LaunchError):
    """A refused service operation, with every problem at its field or file path."""

    status_code = 400


class ServiceGone(ServiceError):
    """The service is being destroyed, or is destroyed: it cannot change any more."""

    status_code = 409


@dataclass(frozen=True)
class Plan:
    """A checked service declaration: everything `create_service` writes."""

    name: str
    project: str
    owner: User | None
    open_to_public: bool
    desired_replicas: int
    model_folder: ModelFolder
    resource_group: ResourceGroup
    preset: ResourcePreset | None
    resource_slots: dict[str, int | float]
    launch: Launch
    runtime_variant: str
    model_definition_path: str
    command: str
    command_settings: dict[str, Any]
    environ: dict[str, str]
    runtime_parameters: dict[str, str]
    cluster_size: int

    @property
    def slots_text(self) -> str:
        return slots_text(self.resource_slots)


def check_service(
    *,
    name: str,
    model_folder: ModelFolder | str | None,
    runtime_variant: str,
    project: str = "default",
    owner: User | None = None,
    open_to_public: bool = False,
    desired_replicas: int = 1,
    mount_destination: str = DEFAULT_MOUNT,
    model_definition_path: str = "",
    command: str = "",
    command_settings: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    runtime_parameters: Mapping[str, Any] | None = None,
    cluster_size: int = 1,
    extra_mounts: Sequence[Mapping[str, Any]] | None = None,
    resource_group: ResourceGroup | str | None = DEFAULT_GROUP,
    preset: ResourcePreset | str | None = None,
    resource_slots: Mapping[str, Any] | None = None,
    naming: bool = True,
) -> Plan:
    """Return the checked declaration of a new service; raise ServiceError with every problem.

    Model folder, resource group and preset may be given as objects or by name. Without
    `naming` the name is not checked: a trial of the settings (Validate) makes no service.
    """
    problems: list[LaunchProblem] = []
    if naming:
        _check_name(name, problems)
    _check_project(project, problems)
    _check_replicas(desired_replicas, problems)
    folder = _by_name(ModelFolder, model_folder, "model_folder", "model folder", problems)
    group = _by_name(ResourceGroup, resource_group, "resource_group", "resource group", problems)
    chosen_preset = _by_name(ResourcePreset, preset, "preset", "resource preset", problems, True)
    slots = _checked_slots(resource_slots, problems)
    launch = None
    if folder is not None:
        launch = _resolve(
            problems,
            model_folder=folder,
            runtime_variant=runtime_variant,
            mount_destination=mount_destination,
            model_definition_path=model_definition_path,
            command=command,
            command_settings=command_settings,
            environ=environ,
            runtime_parameters=runtime_parameters,
            cluster_size=cluster_size,
            extra_mounts=extra_mounts,
        )
    if problems:
        raise ServiceError(problems)
    assert folder is not None and group is not None and launch is not None
    return Plan(
        name=name,
        project=project,
        owner=owner,
        open_to_public=bool(open_to_public),
        desired_replicas=desired_replicas,
        model_folder=folder,
        resource_group=group,
        preset=chosen_preset,
        resource_slots=_merged_slots(launch, chosen_preset, slots),
        launch=launch,
        runtime_variant=runtime_variant,
        model_definition_path=model_definition_path.strip(),
        command=command.strip(),
        command_settings=dict(command_settings or {}),
        environ=dict(environ or {}),
        # Stored as the launcher checked them: empty values (the server's default) left out.
        runtime_parameters=_stored_parameters(runtime_parameters),
        cluster_size=cluster_size,
    )


def create_service(**declaration: Any) -> Service:
    """Create a service with its first revision, once every setting checks out.

    Takes `check_service`'s arguments. The service and revision 1 (its spec resolved) are
    written in one transaction: on any error neither exists.
    """
    plan = check_service(**declaration)
    try:
        with transaction.atomic():
            service = Service.objects.create(
                name=plan.name,
                project=plan.project,
                owner=plan.owner,
                open_to_public=plan.open_to_public,
                desired_replicas=plan.desired_replicas,
                status_message="Waiting for the first replicas.",
            )
            revision = _new_revision(
                service,
                1,
                plan.owner,
                model_folder=plan.model_folder,
                runtime_variant=plan.runtime_variant,
                model_definition_path=plan.model_definition_path,
                command=plan.command,
                command_settings=plan.command_settings,
                environ=plan.environ,
                runtime_parameters=plan.runtime_parameters,
                cluster_size=plan.cluster_size,
                resource_group=plan.resource_group,
                preset=plan.preset,
                resource_slots=plan.resource_slots,
                launch=plan.launch,
            )
            service.latest_revision = revision
            service.save(update_fields=["latest_revision"])
    except IntegrityError:
        # Another request created a service of this name since the check.
        raise ServiceError([_name_taken(plan.name)]) from None
    return service


def update_service(service: Service, *, actor: User | None = None, **changes: Any) -> Revision:
    """Apply changes to a service and return its latest revision.

    A change to any launch setting (`LAUNCH_FIELDS`) makes a new immutable revision, which the
    reconciler rolls out; replicas and public access are the service's own and make none.
    Resource slots are kept unless the change names a preset or slots. Nothing is written
    unless every change checks out.
    """
    unknown = sorted(set(changes) - set(LAUNCH_FIELDS) - set(SERVICE_FIELDS))
    if unknown:
        raise TypeError(f"update_service() got unknown settings: {', '.join(unknown)}")
    _check_alive(service)
    latest = service.latest_revision
    assert latest is not None, "every service is created with its first revision"
    problems: list[LaunchProblem] = []
    replicas = changes.get("desired_replicas", service.desired_replicas)
    _check_replicas(replicas, problems)
    settings = _changed_settings(latest, changes, problems)
    launch = None
    if settings is not None and settings != _settings_of(latest):
        launch = _resolve(problems, **{key: settings[key] for key in RESOLVED_FIELDS})
    if problems:
        raise ServiceError(problems)
    public = bool(changes.get("open_to_public", service.open_to_public))
    idle_s = changes.get("scale_to_zero_after_s", service.scale_to_zero_after_s)
    with transaction.atomic():
        # The row lock serialises revision numbers between concurrent updates.
        locked = Service.objects.select_for_update().get(pk=service.pk)
        _check_alive(locked)
        if launch is not None and settings is not None:
            number = (locked.revisions.aggregate(last=Max("number"))["last"] or 0) + 1
            slots = settings["resource_slots"]
            if "preset" in changes or "resource_slots" in changes:
                # A new preset replaces the old slots, unless slots are given with it.
                given = slots if "resource_slots" in changes else {}
                slots = _merged_slots(launch, settings["preset"], given)
            revision = _new_revision(
                locked, number, actor, launch=launch, **{**settings, "resource_slots": slots}
            )
            locked.latest_revision = revision
        locked.desired_replicas = replicas
        locked.open_to_public = public
        locked.scale_to_zero_after_s = idle_s
        locked.save()
    service.refresh_from_db()
    assert service.latest_revision is not None
    return service.latest_revision


def check_update(service: Service, **changes: Any) -> Plan:
    """Return what `update_service` would run with the changes, writing nothing; raise
    ServiceError with every problem. The launch is resolved even when nothing changed."""
    _check_alive(service)
    latest = service.latest_revision
    assert latest is not None, "every service is created with its first revision"
    problems: list[LaunchProblem] = []
    replicas = changes.get("desired_replicas", service.desired_replicas)
    _check_replicas(replicas, problems)
    settings = _changed_settings(latest, changes, problems)
    launch = None
    if settings is not None:
        launch = _resolve(problems, **{key: settings[key] for key in RESOLVED_FIELDS})
    if problems:
        raise ServiceError(problems)
    assert settings is not None and launch is not None
    slots = settings["resource_slots"]
    if "preset" in changes or "resource_slots" in changes:
        slots = _merged_slots(launch, settings["preset"], changes.get("resource_slots") or {})
    return Plan(
        name=service.name,
        project=service.project,
        owner=service.owner,
        open_to_public=bool(changes.get("open_to_public", service.open_to_public)),
        desired_replicas=replicas,
        model_folder=settings["model_folder"],
        resource_group=settings["resource_group"],
        preset=settings["preset"],
        resource_slots=slots,
        launch=launch,
        runtime_variant=settings["runtime_variant"],
        model_definition_path=settings["model_definition_path"],
        command=settings["command"],
        command_settings=settings["command_settings"],
        environ=settings["environ"],
        runtime_parameters=settings["runtime_parameters"],
        cluster_size=settings["cluster_size"],
    )


def scale_service(service: Service, replicas: int) -> Service:
    """Set how many replicas the service keeps; the reconciler starts or stops the difference."""
    update_service(service, desired_replicas=replicas)
    return service


def delete_service(service: Service) -> Service:
    """Mark the service for destruction; the reconciler drains, stops and marks it destroyed."""
    if service.lifecycle == ServiceLifecycle.DESTROYED:
        raise ServiceGone([LaunchProblem("", "", f"the service {service.name!r} is destroyed")])
    with transaction.atomic():
        # Its managed pool stops taking requests from the gateway's next snapshot on.
        Service.objects.filter(pk=service.pk, lifecycle=ServiceLifecycle.ACTIVE).update(
            lifecycle=ServiceLifecycle.DESTROYING,
            status_message="Destroying: draining and stopping the replicas.",
        )
    service.refresh_from_db()
    return service


class RouteFinished(ServiceError):
    """The route is terminated: another replaced it, and nothing of it can be retried."""

    status_code = 409


def clear_route_errors(route: Route, actor: User | None = None) -> Route:
    """Forget the route's errors and let the reconciler start it again at once.

    The model folder's files are read again first: when what they define now differs from what
    the route's revision froze (a definition file fixed since), the service gets a new revision
    of the same settings, rolled out as any change, so the fixed file is what runs. Files that
    still have problems are refused with them, and nothing changes.
    """
    if route.state == RouteState.TERMINATED:
        message = f"route {route.pk} is terminated; the route that replaced it is retried instead"
        raise RouteFinished([LaunchProblem("", "", message)])
    service = route.service
    latest = service.latest_revision
    if route.revision_id == getattr(latest, "pk", None) and latest is not None:
        _check_alive(service)
        _renew_from_files(service, latest, actor)
    clear_errors_and_retry(route)
    route.refresh_from_db()
    return route


def _renew_from_files(service: Service, latest: Revision, actor: User | None) -> None:
    """Make the next revision of the latest's settings if the folder's files now resolve them
    to something else (a command, port, health check, variables, image)."""
    problems: list[LaunchProblem] = []
    settings = _settings_of(latest)
    launch = _resolve(problems, **{key: settings[key] for key in RESOLVED_FIELDS})
    if problems or launch is None:
        raise ServiceError(problems)
    fresh = (launch.spec, launch.mount_destination, launch.image or "")
    if fresh == (latest.spec, latest.mount_destination, latest.image):
        return
    with transaction.atomic():
        locked = Service.objects.select_for_update().get(pk=service.pk)
        _check_alive(locked)
        if locked.latest_revision_id != latest.pk:
            return  # another change made a newer revision meanwhile, from the files as they are
        number = (locked.revisions.aggregate(last=Max("number"))["last"] or 0) + 1
        locked.latest_revision = _new_revision(locked, number, actor, launch=launch, **settings)
        locked.save(update_fields=["latest_revision", "updated_at"])
    service.refresh_from_db()


# Resource groups


class GroupRefused(Exception):
    """The resource group cannot be deleted; the message says why."""


def group_in_use_reason(group: ResourceGroup) -> str:
    """Say why the group cannot be deleted: it is the default, or revisions name it; "" when
    it can. A destroyed service's revisions count too: they keep where they ran."""
    if group.name == DEFAULT_GROUP:
        return f"The resource group {group.name} is where services go unless told otherwise."
    using = sorted(
        Service.objects.filter(revisions__resource_group=group)
        .values_list("name", flat=True)
        .distinct()
    )
    if not using:
        return ""
    several = len(using) > 1
    return (
        f"The resource group {group.name} is used by the service{'s' if several else ''} "
        f"{', '.join(using)} (destroyed ones included: their revisions keep where they ran)."
    )


def delete_resource_group(group: ResourceGroup) -> None:
    """Delete the group; refused while it is the default or a revision names it."""
    reason = group_in_use_reason(group)
    if reason:
        raise GroupRefused(reason)
    try:
        group.delete()
    except models.ProtectedError as protected:
        # A revision made since the check: refused as the check would refuse it now.
        raise GroupRefused(group_in_use_reason(group)) from protected


# Reading a service's state


def with_ready_counts(services: QuerySet[Service]) -> QuerySet[Service]:
    """Return the services annotated with `ready_replicas`, their HEALTHY routes."""
    return services.annotate(
        ready_replicas=Count("routes", filter=Q(routes__state=RouteState.HEALTHY))
    )


def ready_replicas(service: Service) -> int:
    """Return how many of the service's replicas take traffic now."""
    annotated = getattr(service, "ready_replicas", None)
    if annotated is not None:
        return int(annotated)
    return service.routes.filter(state=RouteState.HEALTHY).count()


def status_text(service: Service) -> str:
    """Return the service's readiness in words: "2 of 3 replicas ready"."""
    if service.lifecycle == ServiceLifecycle.DESTROYED:
        return "Destroyed"
    return readiness_text(ready_replicas(service), service.desired_replicas)


def in_tab(services: QuerySet[Service], tab: str) -> QuerySet[Service]:
    """Return the services of a list tab: "active" (also those being destroyed) or "destroyed"."""
    if tab == "destroyed":
        return services.filter(lifecycle=ServiceLifecycle.DESTROYED)
    return services.exclude(lifecycle=ServiceLifecycle.DESTROYED)


# The list's property filter: what each property matches a value against (UI.md, "Layout").
FILTER_PROPERTIES = {"name": "Name", "url": "Service URL", "owner": "Owner"}
SERVICE_URL_NAME = re.compile(r"/serve/([^/?#]*)")


def filtered(services: QuerySet[Service], prop: str, value: str) -> QuerySet[Service]:
    """Return the services whose property contains the value (ignoring case); a URL value
    matches by the service name it carries (`/serve/<name>/`), a whole URL or part of one."""
    value = value.strip()
    if not value or prop not in FILTER_PROPERTIES:
        return services
    if prop == "owner":
        return services.filter(owner__username__icontains=value)
    if prop == "url":
        named = SERVICE_URL_NAME.search(value)
        value = named.group(1) if named else value.strip("/")
    return services.filter(name__icontains=value) if value else services


def with_route_counts(services: QuerySet[Service]) -> QuerySet[Service]:
    """Return the services annotated with `live_routes` and `finished_routes`: what deleting
    one stops, and what its history keeps."""
    live = Q(routes__state__in=LIVE_ROUTE_STATES)
    return services.annotate(
        live_routes=Count("routes", filter=live),
        finished_routes=Count("routes", filter=Q(routes__isnull=False) & ~live),
    )


# What a route does with requests: (value, words), the routes card's Traffic column and filter.
ROUTE_TRAFFIC = {
    "taking": "Taking requests",
    "fallback": "Only when the others are full",
    "draining": "Draining",
    "none": "None",
}


def route_traffic(route: Route) -> str:
    """Return what the route does with requests now, a key of ROUTE_TRAFFIC."""
    if route.state == RouteState.HEALTHY:
        # A degraded route is ranked below every healthy one (DESIGN.md, Health).
        return "fallback" if route.degraded else "taking"
    return "draining" if route.state == RouteState.TERMINATING else "none"


def shown_routes(service: Service, *, finished: bool = False) -> QuerySet[Route]:
    """Return the running routes (every one not terminated), oldest first; or the finished
    ones, newest first and at most FINISHED_ROUTES_SHOWN (a restart loop leaves hundreds)."""
    routes = service.routes.select_related("node", "revision").prefetch_related("parts__node")
    if not finished:
        return routes.exclude(state=RouteState.TERMINATED).order_by("id")
    return routes.filter(state=RouteState.TERMINATED).order_by("-id")[:FINISHED_ROUTES_SHOWN]


def find_by_pk(service_id: int) -> Service | None:
    """Return the service with what its page shows, or None when it is gone."""
    return _for_page(Service.objects.filter(pk=service_id)).first()


def _for_page(found: QuerySet[Service]) -> QuerySet[Service]:
    return found.select_related(
        "owner",
        *(
            f"{revision}__{related}"
            for revision in ("latest_revision", "running_revision")
            for related in ("model_folder", "resource_group", "preset")
        ),
    )


def find_service(name: str) -> Service | None:
    """Return the service of that name: the live one, else the latest destroyed one."""
    named = _for_page(Service.objects.filter(name=name))
    alive = named.exclude(lifecycle=ServiceLifecycle.DESTROYED).first()
    return alive or named.order_by("-created_at", "-id").first()


# Checks


def _check_name(name: object, problems: list[LaunchProblem]) -> None:
    """Record a name that is not a free slug of at most 64 characters."""
    if not isinstance(name, str) or not name:
        message = "required"
    elif len(name) > NAME_MAX_LENGTH:
        message = f"has at most {NAME_MAX_LENGTH} characters"
    elif not _SLUG.fullmatch(name):
        message = "may hold only letters, digits, '-' and '_' (it is part of the URL)"
    elif name == "new":
        message = "'new' is the launcher's address (/serving/services/new/); choose another"
    elif Service.objects.filter(name=name).exclude(lifecycle=ServiceLifecycle.DESTROYED).exists():
        problems.append(_name_taken(name))
        return
    elif Pool.objects.filter(slug=name, managed=False).exists():
        message = (
            f"the pool {name!r} has this slug; a service's pool takes the service's name, "
            "so choose another"
        )
    else:
        return
    problems.append(LaunchProblem("", "name", message))


def _name_taken(name: str) -> LaunchProblem:
    return LaunchProblem("", "name", f"a service named {name!r} exists")


def _check_project(project: object, problems: list[LaunchProblem]) -> None:
    if not isinstance(project, str) or not project.strip():
        problems.append(LaunchProblem("", "project", "required"))
    elif len(project) > PROJECT_MAX_LENGTH:
        message = f"has at most {PROJECT_MAX_LENGTH} characters"
        problems.append(LaunchProblem("", "project", message))


def _check_replicas(replicas: object, problems: list[LaunchProblem]) -> None:
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        problems.append(LaunchProblem("", "desired_replicas", "must be an integer"))
    elif not 0 <= replicas <= MAX_REPLICAS:
        message = f"must be between 0 and {MAX_REPLICAS}, not {replicas}"
        problems.append(LaunchProblem("", "desired_replicas", message))


def _check_alive(service: Service) -> None:
    if service.lifecycle != ServiceLifecycle.ACTIVE:
        state = service.get_lifecycle_display().lower()
        message = f"the service {service.name!r} is {state}; it cannot change any more"
        raise ServiceGone([LaunchProblem("", "", message)])


def _by_name(
    model: type[M],
    value: M | str | None,
    path: str,
    noun: str,
    problems: list[LaunchProblem],
    optional: bool = False,
) -> M | None:
    """Return the object given, or the one of that name; record a name that finds none."""
    if isinstance(value, model):
        return value
    if value is None or value == "":
        if not optional:
            problems.append(LaunchProblem("", path, "required"))
        return None
    found = model._default_manager.filter(name=value).first() if isinstance(value, str) else None
    if found is None:
        problems.append(LaunchProblem("", path, f"no {noun} named {value!r}"))
    return found


def _checked_slots(
    slots: Mapping[str, Any] | None, problems: list[LaunchProblem]
) -> dict[str, int | float]:
    """Return slot amounts as numbers (`mem` in bytes, "8gb" allowed); record the unusable."""
    if slots is None:
        return {}
    if not isinstance(slots, Mapping):
        problems.append(LaunchProblem("", "resource_slots", "must be a mapping of slot amounts"))
        return {}
    checked: dict[str, int | float] = {}
    for name, amount in slots.items():
        path = key_path("resource_slots", name)
        if name == "mem" and isinstance(amount, str):
            try:
                checked[name] = parse_memory(amount)
            except ValueError:
                problems.append(LaunchProblem("", path, 'must be a size like "8gb" or "512m"'))
            continue
        if isinstance(amount, bool) or not isinstance(amount, int | float) or amount < 0:
            problems.append(LaunchProblem("", path, "must be a number, 0 or more"))
            continue
        checked[name] = int(amount) if float(amount).is_integer() else amount
    return checked


def _merged_slots(
    launch: Launch, preset: ResourcePreset | None, given: Mapping[str, int | float]
) -> dict[str, int | float]:
    """Return the slots a replica reserves: given slots over the preset's over the folder's."""
    return {**launch.resource_slots, **(preset.slots() if preset else {}), **given}


def _resolve(problems: list[LaunchProblem], **settings: Any) -> Launch | None:
    """Return the resolved launch, adding its problems to `problems` instead of raising."""
    try:
        return resolve_launch(**settings)
    except LaunchError as refused:
        problems.extend(refused.problems)
        return None


def _settings_of(revision: Revision) -> dict[str, Any]:
    """Return a revision's launch settings, as `_changed_settings` returns them."""
    return {
        "model_folder": revision.folder,
        "runtime_variant": revision.runtime_variant,
        "mount_destination": revision.mount_destination,
        "model_definition_path": revision.model_definition_path,
        "command": revision.command,
        "command_settings": dict(revision.command_settings),
        "environ": dict(revision.environ),
        "runtime_parameters": dict(revision.runtime_parameters),
        "cluster_size": revision.cluster_size,
        "extra_mounts": list(revision.spec.get("extra_mounts") or []),
        "resource_group": revision.resource_group,
        "preset": revision.preset,
        "resource_slots": dict(revision.resource_slots),
    }


def _changed_settings(
    latest: Revision, changes: Mapping[str, Any], problems: list[LaunchProblem]
) -> dict[str, Any] | None:
    """Return the latest revision's launch settings with the changes applied, all checked."""
    settings = _settings_of(latest)
    before = len(problems)
    for key in LAUNCH_FIELDS:
        if key not in changes:
            continue
        value = changes[key]
        if key == "model_folder":
            value = _by_name(ModelFolder, value, key, "model folder", problems)
        elif key == "resource_group":
            value = _by_name(ResourceGroup, value, key, "resource group", problems)
        elif key == "preset":
            value = _by_name(ResourcePreset, value, key, "resource preset", problems, True)
        elif key == "resource_slots":
            value = _checked_slots(value, problems)
        elif key in ("environ", "command_settings"):
            value = dict(value or {})
        elif key == "extra_mounts":
            value = [dict(mount) for mount in value or []]
        elif key == "runtime_parameters":
            value = _stored_parameters(value)
        elif isinstance(value, str):
            value = value.strip()
        settings[key] = value
    if "runtime_variant" in changes and changes["runtime_variant"] != CUSTOM:
        # What only Custom takes is dropped when the variant changes, unless given again.
        for key in ("command", "model_definition_path"):
            settings[key] = changes.get(key, "")
        settings["command_settings"] = dict(changes.get("command_settings") or {})
        settings["extra_mounts"] = list(changes.get("extra_mounts") or [])
    if str(changes.get("command") or "").strip() and "extra_mounts" not in changes:
        settings["extra_mounts"] = []  # a pasted command mounts only the model folder
    if "runtime_variant" in changes and changes["runtime_variant"] != latest.runtime_variant:
        # Parameters are one runtime's flags: another runtime starts from its defaults.
        settings["runtime_parameters"] = _stored_parameters(changes.get("runtime_parameters"))
    # Giving one of Custom's two modes switches to it: the other is dropped unless given too.
    for given, other in (
        ("command", "model_definition_path"),
        ("model_definition_path", "command"),
    ):
        if str(changes.get(given) or "").strip() and other not in changes:
            settings[other] = ""
            if given == "model_definition_path" and "command_settings" not in changes:
                settings["command_settings"] = {}
    return None if len(problems) > before else settings


def _stored_parameters(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return the parameters worth keeping: those with a value (empty means the default)."""
    if not isinstance(values, Mapping):
        return {}
    return {
        key: value
        for key, value in values.items()
        if not (isinstance(value, str) and not value.strip())
    }


def _new_revision(
    service: Service,
    number: int,
    actor: User | None,
    *,
    launch: Launch,
    **settings: Any,
) -> Revision:
    """Create revision `number` of the service from checked settings and their launch."""
    settings.pop("mount_destination", None)
    settings.pop("extra_mounts", None)  # resolved into the spec, which keeps them
    return Revision.objects.create(
        service=service,
        number=number,
        mount_destination=launch.mount_destination,
        image=launch.image or "",
        spec=launch.spec,
        created_by=actor,
        **settings,
    )
