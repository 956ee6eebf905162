"""Model serving pages: model folders and their files; services, their launcher and state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db.models import Count, QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import filesizeformat
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from nexus import access, live
from nexus.auth import acting_user
from nexus.pages import HtmxHttpRequest, render_page_or_fragment, require_staff
from nexus.ui.format import count
from serving import folder_sync, folders, replicas, services, tokens, trials
from serving import live as serving_live
from serving.forms import (
    ModelFolderForm,
    ResourceGroupForm,
    ServiceLaunchForm,
    ServiceTokenForm,
    form_data_of,
)
from serving.launch import LaunchError, LaunchProblem
from serving.models import (
    ModelFolder,
    ResourceGroup,
    Service,
    ServiceLifecycle,
)

FOLDER_LIST = "serving/model_folder_list.html"
FOLDERS_SECTION = f"{FOLDER_LIST}#model-folders"
FOLDER_DETAIL = "serving/model_folder_detail.html"
FILES_TABLE = f"{FOLDER_DETAIL}#files-table"
SECTION = "models"
SERVICES_SECTION = "services"
SERVICE_NEW = "serving/service_new.html"
LAUNCH_CHECK = f"{SERVICE_NEW}#launch-check"
VARIANT_FIELDS = f"{SERVICE_NEW}#variant-fields"


def files_context(folder: ModelFolder) -> dict[str, Any]:
    """Return what the files-table partial needs: the listing, or why there is none."""
    try:
        return {"folder": folder, "listing": folders.list_files(folder), "problem": None}
    except folders.FolderError as problem:
        return {"folder": folder, "listing": None, "problem": str(problem)}


def folder_or_404(
    request: HttpRequest, name: str, folders: QuerySet[ModelFolder] | None = None
) -> ModelFolder:
    """Return the model folder of that name in the user's projects, or answer 404."""
    found = ModelFolder.objects.all() if folders is None else folders
    return get_object_or_404(access.in_visible_projects(request.user, found), name=name)


@require_http_methods(["GET", "POST"])
@login_required
def model_folder_list(request: HtmxHttpRequest) -> HttpResponse:
    """Render the model folders with a form to create one; create one on POST."""
    form = ModelFolderForm()
    created = None
    if request.method == "POST":
        require_staff(request, "change model folders")
        form = ModelFolderForm(request.POST)
        if form.is_valid():
            try:
                created = folders.create_folder(
                    ModelFolder(owner=acting_user(request), **form.cleaned_data)
                )
            except folders.FolderExists as taken:
                form.add_error("name", str(taken))
            else:
                if not request.htmx:
                    return redirect("serving:model_folder_detail", name=created.name)
                form = ModelFolderForm()
    context = {
        "section": SECTION,
        "form": form,
        "created": created,
        "folders": access.in_visible_projects(
            request.user, ModelFolder.objects.select_related("owner")
        ),
    }
    return render_page_or_fragment(request, FOLDER_LIST, FOLDERS_SECTION, context)


@require_GET
@login_required
def model_folder_detail(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Render a folder with its files, or only the files table for an htmx request."""
    folder = folder_or_404(request, name, ModelFolder.objects.select_related("owner"))
    context = {"section": SECTION, **files_context(folder)}
    if request.user.is_staff and not request.htmx:
        # Said in the delete dialog before anyone tries.
        context["in_use"] = folders.in_use_reason(folder)
    return render_page_or_fragment(request, FOLDER_DETAIL, FILES_TABLE, context)


# Exempt here, checked in store_upload: the CSRF check reads the body, and the upload handler
# that streams it into the folder must be in place before that.
@csrf_exempt
@require_POST
@login_required
def model_folder_upload(request: HttpRequest, name: str) -> HttpResponse:
    """Store an uploaded file in the folder, then show the folder."""
    folder = folder_or_404(request, name)
    require_staff(request, "change model folders")
    upload = folders.FolderUploadHandler(folder, request)
    request.upload_handlers = [upload]
    try:
        return store_upload(request, folder)
    except folders.FolderError as refused:
        messages.error(request, str(refused))
        return redirect("serving:model_folder_detail", name=folder.name)
    finally:
        upload.discard()


@csrf_protect
def store_upload(request: HttpRequest, folder: ModelFolder) -> HttpResponse:
    """Install the file the upload handler staged, at the path asked for or under its own name."""
    staged = request.FILES.get("file")
    if not isinstance(staged, folders.StagedUpload):
        raise folders.FolderError("Choose a file to upload.")
    relative = request.POST.get("path", "").strip() or staged.name
    written = folders.install_file(folder, relative, staged.staged_path)
    messages.success(request, f"Uploaded {written.path} ({filesizeformat(written.size)}).")
    return redirect("serving:model_folder_detail", name=folder.name)


@require_GET
@login_required
def model_file(request: HttpRequest, name: str, path: str) -> HttpResponse:
    """Render a file of the folder: its text, or the facts of a binary file."""
    folder = folder_or_404(request, name)
    try:
        preview = folders.read_file(folder, path)
    except folders.FolderError as refused:
        messages.error(request, str(refused))
        return redirect("serving:model_folder_detail", name=folder.name)
    context = {"section": SECTION, "folder": folder, "preview": preview}
    return render(request, "serving/model_file.html", context)


@require_POST
@login_required
def model_file_delete(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Delete a file (or directory) of the folder; answer htmx with the refreshed files table."""
    folder = folder_or_404(request, name)
    require_staff(request, "change model folders")
    relative = request.POST.get("path", "")
    try:
        folders.delete_path(folder, relative)
    except folders.FolderError as refused:
        outcome, failed = str(refused), True
    else:
        outcome, failed = f"Deleted {relative}.", False
    if request.htmx:
        context = {**files_context(folder), "outcome": outcome, "outcome_failed": failed}
        return render(request, FILES_TABLE, context)
    messages.add_message(request, messages.ERROR if failed else messages.SUCCESS, outcome)
    return redirect("serving:model_folder_detail", name=folder.name)


@require_http_methods(["GET", "POST"])
@login_required
def model_folder_delete(request: HttpRequest, name: str) -> HttpResponse:
    """Ask to confirm deleting the folder; delete it, with its files, on POST."""
    folder = folder_or_404(request, name)
    require_staff(request, "change model folders")
    if request.method == "POST":
        try:
            folders.delete_folder(folder)
        except folders.FolderInUse as in_use:
            context = {"section": SECTION, "folder": folder, "in_use": str(in_use)}
            return render(request, "serving/model_folder_delete.html", context, status=409)
        messages.success(request, f"Deleted model folder {name} and its files.")
        return redirect("serving:model_folder_list")
    context = {"section": SECTION, "folder": folder, **files_context(folder)}
    context["in_use"] = folders.in_use_reason(folder)
    return render(request, "serving/model_folder_delete.html", context)


@require_GET
def folder_sync_file(request: HttpRequest, token: str, path: str) -> HttpResponseBase:
    """Send one file of a model folder to the agent the token was issued for, from a byte on
    when asked (Range), so a broken copy resumes."""
    grant = folder_sync.grant_of(token)
    if grant is None:
        return JsonResponse({"detail": "The folder link is invalid or expired."}, status=403)
    folder = ModelFolder.objects.filter(pk=grant.folder_id).first()
    if folder is None:
        return JsonResponse({"detail": "No such model folder."}, status=404)
    try:
        file = folders.existing_file(folder, path)
    except folders.FolderError as missing:
        return JsonResponse({"detail": str(missing)}, status=404)
    size = folder_sync.file_size(file)
    try:
        wanted = folder_sync.byte_range(request.headers.get("Range"), size)
    except ValueError:
        unsatisfiable = JsonResponse({"detail": "Range not satisfiable."}, status=416)
        unsatisfiable["Content-Range"] = f"bytes */{size}"
        return unsatisfiable
    start, end = wanted or (0, size - 1)
    response = StreamingHttpResponse(
        folder_sync.read_range(file, start, end) if size else iter(()),
        status=206 if wanted else 200,
        content_type="application/octet-stream",
    )
    response["Content-Length"] = str(max(end - start + 1, 0))
    response["Accept-Ranges"] = "bytes"
    if wanted:
        response["Content-Range"] = f"bytes {start}-{end}/{size}"
    return response


# Services


@dataclass(frozen=True)
class LaunchCheck:
    """The launcher's verdict: every problem, or the checked plan with its resolved launch."""

    problems: list[LaunchProblem]
    plan: services.Plan | None


def check_launch(form: ServiceLaunchForm, owner: User | None) -> LaunchCheck:
    """Return what would happen if the form were submitted now (a new service, or the next
    revision of the one edited); nothing is written."""
    if not form.is_valid():
        return LaunchCheck(problems=form.problems(), plan=None)
    try:
        if form.editing is not None:
            plan = services.check_update(form.editing, **form.changes())
        else:
            plan = services.check_service(owner=owner, **form.declaration())
    except LaunchError as refused:
        for problem in refused.problems:
            # Shown next to its field too; a file's problem says where in the file.
            name = form.field_of(problem)
            if name is not None:
                form.add_error(name, str(problem) if problem.file else problem.message)
        return LaunchCheck(problems=list(refused.problems), plan=None)
    return LaunchCheck(problems=[], plan=plan)


@require_GET
@login_required
def service_list(request: HttpRequest) -> HttpResponse:
    """Render the services of a tab, active (the default) or destroyed, filtered by a property
    (name, service URL; owner for staff)."""
    tab = "destroyed" if request.GET.get("tab") == "destroyed" else "active"
    properties = dict(services.FILTER_PROPERTIES)
    if not request.user.is_staff:
        # Others see only their projects' services, whose owners they need not know.
        properties.pop("owner")
    prop = request.GET.get("property", "name")
    prop = prop if prop in properties else "name"
    value = request.GET.get("value", "").strip()
    visible = access.in_visible_projects(request.user, Service.objects.all())
    found = services.filtered(services.in_tab(visible, tab), prop, value)
    context = {
        "section": SERVICES_SECTION,
        "tab": tab,
        "rows": serving_live.service_rows(serving_live.listed_services(found)),
        "properties": properties,
        "property": prop,
        "property_label": properties[prop].lower(),
        "value": value,
        "can_manage": request.user.is_staff,
    }
    return render(request, serving_live.SERVICE_LIST, context)


@require_http_methods(["GET", "POST"])
@login_required
def service_new(request: HttpRequest) -> HttpResponse:
    """Render the service launcher; create the service on POST and show it."""
    require_staff(request, "start services")
    form = ServiceLaunchForm(request.POST or None)
    check = None
    if request.method == "POST":
        check = check_launch(form, acting_user(request))
        if check.plan is not None:
            try:
                service = services.create_service(owner=acting_user(request), **form.declaration())
            except LaunchError as refused:
                check = LaunchCheck(problems=list(refused.problems), plan=None)
            else:
                messages.success(request, f"Started service {service.name}.")
                return redirect("serving:service_detail", name=service.name)
    context = {"section": SERVICES_SECTION, "form": form, "check": check}
    return render(request, SERVICE_NEW, context, status=400 if check else 200)


@require_http_methods(["GET", "POST"])
@login_required
def service_edit(request: HttpRequest, name: str) -> HttpResponse:
    """Render the launcher filled in from the service's latest revision; on POST, apply it:
    a changed launch setting makes the next revision, which rolls out."""
    service = service_or_404(request, name)
    require_staff(request, "change services")
    if service.lifecycle != ServiceLifecycle.ACTIVE:
        messages.error(request, f"{service.name} is {service.get_lifecycle_display().lower()}.")
        return redirect("serving:service_detail", name=service.name)
    form = ServiceLaunchForm(request.POST or form_data_of(service), editing=service)
    check = check_launch(form, acting_user(request))
    if request.method == "POST" and check.plan is not None:
        before = service.latest_revision_id
        try:
            latest = services.update_service(service, actor=acting_user(request), **form.changes())
        except LaunchError as refused:
            check = LaunchCheck(problems=list(refused.problems), plan=None)
        else:
            if latest.pk == before:
                messages.success(request, f"Updated {service.name}; its revision is unchanged.")
            else:
                messages.success(
                    request, f"Updated {service.name}: revision {latest.number} rolls out."
                )
            return redirect("serving:service_detail", name=service.name)
    context = {"section": SERVICES_SECTION, "form": form, "check": check, "editing": service}
    failed = request.method == "POST"
    return render(request, SERVICE_NEW, context, status=400 if failed else 200)


@require_POST
@login_required
def service_check(request: HttpRequest) -> HttpResponse:
    """Render the launcher's check of the form as it is now: problems, or what would run."""
    require_staff(request, "start services")
    editing = request.POST.get("editing")
    form = ServiceLaunchForm(
        request.POST, editing=service_or_404(request, editing) if editing else None
    )
    check = check_launch(form, acting_user(request))
    # The fields' own error slots are updated out of band, beside the check.
    return render(request, LAUNCH_CHECK, {"check": check, "form": form, "oob": True})


@require_POST
@login_required
def service_validate(request: HttpRequest) -> HttpResponse:
    """Start a trial replica of the launcher's settings; render its popup, which then follows
    it over /ws/serving/trials/<id>/ (or says why it did not start)."""
    require_staff(request, "validate services")
    editing = request.POST.get("editing")
    data = request.POST.copy()
    # A trial makes no service: its name is neither needed nor checked.
    data["name"] = data.get("name") or "trial"
    form = ServiceLaunchForm(data, editing=service_or_404(request, editing) if editing else None)
    problems: list[Any] = []
    trial = None
    if not form.is_valid():
        problems = form.problems()
    else:
        declaration = form.declaration()
        if form.editing is not None:
            declaration["project"] = form.editing.project
        try:
            trial = trials.start_trial(acting_user(request), **declaration)
        except LaunchError as refused:
            problems = list(refused.problems)
        except trials.TrialRefused as refused:
            problems = [str(refused)]
    return render(request, "serving/trial.html", {"trial": trial, "problems": problems})


@require_POST
@login_required
def service_variant_fields(request: HttpRequest) -> HttpResponse:
    """Render the launcher's fields for the variant (and Custom mode) chosen now."""
    require_staff(request, "start services")
    editing = request.POST.get("editing")
    form = ServiceLaunchForm(
        request.POST, editing=service_or_404(request, editing) if editing else None
    )
    return render(request, VARIANT_FIELDS, {"form": form})


def service_or_404(request: HttpRequest, name: str) -> Service:
    """Return the service of that name (the live one first) or answer 404, also when it is
    outside the user's projects, so that no name leaks."""
    service = services.find_service(name)
    if service is None or not access.sees_named_project(request.user, service.project):
        raise Http404(f"No service named {name!r}.")
    return service


@require_GET
@login_required
def service_detail(request: HttpRequest, name: str) -> HttpResponse:
    """Render a service; its live cards then arrive over /ws/serving/services/<pk>/."""
    service = service_or_404(request, name)
    finished = request.GET.get("routes") == "finished"
    audience = live.audience_of(request.user)
    context = serving_live.service_context(service, audience, finished_routes=finished)
    context["issued"] = take_issued(request, service)
    return render(request, serving_live.SERVICE_DETAIL, context)


@require_GET
@login_required
def route_detail(request: HttpRequest, name: str, route_id: int) -> HttpResponse:
    """Render a route's drawer: where it runs, its probes, its errors and its log's tail."""
    service = service_or_404(request, name)
    route = get_object_or_404(service.routes.select_related("node", "revision"), pk=route_id)
    context = {
        "service": service,
        "route": route,
        "row": serving_live.route_rows([route])[0],
        "log": replicas.log_tail(route),
    }
    return render(request, "serving/route_detail.html", context)


@require_POST
@login_required
def service_scale(request: HttpRequest, name: str) -> HttpResponse:
    """Set how many replicas the service keeps."""
    service = service_or_404(request, name)
    require_staff(request, "change services")
    try:
        replicas = int(request.POST.get("desired_replicas", ""))
    except ValueError:
        messages.error(request, "Replicas: enter a whole number from 0 to 64.")
        return redirect("serving:service_detail", name=service.name)
    try:
        services.scale_service(service, replicas)
    except LaunchError as refused:
        messages.error(request, str(refused))
    else:
        messages.success(request, f"{service.name} now keeps {count(replicas, 'replica')}.")
    return redirect("serving:service_detail", name=service.name)


@require_POST
@login_required
def route_clear_errors(request: HttpRequest, name: str, route_id: int) -> HttpResponse:
    """Forget a route's errors and retry it now."""
    service = service_or_404(request, name)
    require_staff(request, "change services")
    route = get_object_or_404(service.routes, pk=route_id)
    try:
        services.clear_route_errors(route, actor=acting_user(request))
    except LaunchError as refused:
        messages.error(request, f"Route {route.pk} was not retried: {refused}")
    else:
        messages.success(request, f"Cleared the errors of route {route.pk}; retrying it now.")
    return redirect("serving:service_detail", name=service.name)


@require_http_methods(["GET", "POST"])
@login_required
def service_delete(request: HttpRequest, name: str) -> HttpResponse:
    """Ask to confirm destroying the service; start destroying it on POST."""
    service = service_or_404(request, name)
    require_staff(request, "delete services")
    if request.method == "POST":
        try:
            services.delete_service(service)
        except LaunchError as refused:
            messages.error(request, str(refused))
        else:
            messages.success(request, f"Destroying {service.name}: its replicas are stopping.")
        if request.GET.get("next") == "list":
            return redirect("serving:service_list")
        return redirect("serving:service_detail", name=service.name)
    context = serving_live.service_context(service, live.audience_of(request.user))
    return render(request, "serving/service_delete.html", context)


@require_POST
@login_required
def service_token_issue(request: HttpRequest, name: str) -> HttpResponse:
    """Issue a token for the service and show its secret, this once."""
    service = service_or_404(request, name)
    require_staff(request, "issue tokens")
    form = ServiceTokenForm(request.POST)
    if not form.is_valid():
        messages.error(request, " ".join(str(m) for errors in form.errors.values() for m in errors))
        return redirect("serving:service_detail", name=service.name)
    try:
        token, secret = tokens.issue_service_token(
            service,
            name=form.cleaned_data["name"],
            expires_at=form.expires_at(),
            created_by=acting_user(request),
        )
    except ValidationError as refused:
        messages.error(request, " ".join(refused.messages))
        return redirect("serving:service_detail", name=service.name)
    # Redirected, so a reload issues no second token. The secret waits in the server-side
    # session (not a message, which may live in a cookie) for the one page that shows it.
    request.session[issued_key(service)] = {"token": token.pk, "secret": secret}
    return redirect("serving:service_detail", name=service.name)


def issued_key(service: Service) -> str:
    """Return the session key a just-issued token's secret waits under until shown."""
    return f"serving-issued-token-{service.pk}"


def take_issued(request: HttpRequest, service: Service) -> dict[str, Any] | None:
    """Return the token issued just now with its secret, once: it leaves the session."""
    issued = request.session.pop(issued_key(service), None)
    if issued is None:
        return None
    token = next((t for t in tokens.service_tokens(service) if t.pk == issued["token"]), None)
    return {"token": token, "secret": issued["secret"]} if token is not None else None


@require_POST
@login_required
def service_token_revoke(request: HttpRequest, name: str, token_id: int) -> HttpResponse:
    """Revoke one of the service's tokens."""
    service = service_or_404(request, name)
    require_staff(request, "revoke tokens")
    token = next((t for t in tokens.service_tokens(service) if t.pk == token_id), None)
    if token is None:
        raise Http404(f"No token {token_id} for service {service.name!r}.")
    tokens.revoke_service_token(token)
    messages.success(request, f"Revoked token {token.name}.")
    return redirect("serving:service_detail", name=service.name)


# Resource groups

GROUP_LIST = "serving/resource_group_list.html"
GROUPS_SECTION = "resource_groups"


def group_rows() -> list[dict[str, Any]]:
    """Return every resource group with its nodes and how many services (not destroyed) run
    their latest revision in it."""
    running = dict(
        Service.objects.exclude(lifecycle=ServiceLifecycle.DESTROYED)
        .values_list("latest_revision__resource_group")
        .annotate(services=Count("id"))
        .values_list("latest_revision__resource_group", "services")
    )
    return [
        {"group": group, "nodes": list(group.nodes.all()), "services": running.get(group.pk, 0)}
        for group in ResourceGroup.objects.prefetch_related("nodes")
    ]


@require_http_methods(["GET", "POST"])
@login_required
def resource_group_list(request: HttpRequest) -> HttpResponse:
    """Render the resource groups with a form to create one; create it on POST."""
    form = ResourceGroupForm()
    if request.method == "POST":
        require_staff(request, "change resource groups")
        form = ResourceGroupForm(request.POST)
        if form.is_valid():
            group = form.save()
            messages.success(request, f"Created resource group {group.name}.")
            return redirect("serving:resource_group_list")
    context = {"section": GROUPS_SECTION, "rows": group_rows(), "form": form}
    return render(request, GROUP_LIST, context, status=400 if form.errors else 200)


@require_http_methods(["GET", "POST"])
@login_required
def resource_group_edit(request: HttpRequest, name: str) -> HttpResponse:
    """Render a resource group's form; save which nodes it spans on POST."""
    group = get_object_or_404(ResourceGroup, name=name)
    require_staff(request, "change resource groups")
    form = ResourceGroupForm(request.POST or None, instance=group)
    if request.method == "POST" and form.is_valid():
        form.save()
        messages.success(request, f"Saved resource group {group.name}.")
        return redirect("serving:resource_group_list")
    context = {
        "section": GROUPS_SECTION,
        "group": group,
        "form": form,
        "in_use": services.group_in_use_reason(group),
    }
    status = 400 if form.errors else 200
    return render(request, "serving/resource_group_edit.html", context, status=status)


@require_http_methods(["GET", "POST"])
@login_required
def resource_group_delete(request: HttpRequest, name: str) -> HttpResponse:
    """Ask to confirm deleting a resource group; delete it on POST, unless a revision names it."""
    group = get_object_or_404(ResourceGroup, name=name)
    require_staff(request, "change resource groups")
    if request.method == "GET":
        context = {
            "section": GROUPS_SECTION,
            "group": group,
            "in_use": services.group_in_use_reason(group),
        }
        return render(request, "serving/resource_group_delete.html", context)
    try:
        services.delete_resource_group(group)
    except services.GroupRefused as refused:
        messages.error(request, str(refused))
        return redirect("serving:resource_group_edit", name=group.name)
    messages.success(request, f"Deleted resource group {name}.")
    return redirect("serving:resource_group_list")
