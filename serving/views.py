"""Model serving pages: model folders, their files, uploads and deletions."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import filesizeformat
from django.utils.cache import patch_vary_headers
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.middleware import HtmxDetails

from serving import folders
from serving.forms import ModelFolderForm
from serving.models import ModelFolder

FOLDER_LIST = "serving/model_folder_list.html"
FOLDERS_SECTION = f"{FOLDER_LIST}#model-folders"
FOLDER_DETAIL = "serving/model_folder_detail.html"
FILES_TABLE = f"{FOLDER_DETAIL}#files-table"
SECTION = "models"


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def require_staff(request: HttpRequest) -> None:
    """Refuse a change by someone who is not staff."""
    if not request.user.is_staff:
        raise PermissionDenied("Only staff may change model folders.")


def files_context(folder: ModelFolder) -> dict[str, Any]:
    """Return what the files-table partial needs: the listing, or why there is none."""
    try:
        return {"folder": folder, "listing": folders.list_files(folder), "problem": None}
    except folders.FolderError as problem:
        return {"folder": folder, "listing": None, "problem": str(problem)}


@require_http_methods(["GET", "POST"])
@login_required
def model_folder_list(request: HtmxHttpRequest) -> HttpResponse:
    """Render the model folders with a form to create one; create one on POST."""
    form = ModelFolderForm()
    created = None
    if request.method == "POST":
        require_staff(request)
        form = ModelFolderForm(request.POST)
        if form.is_valid():
            try:
                created = folders.create_folder(
                    ModelFolder(owner=request.user, **form.cleaned_data)
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
        "folders": ModelFolder.objects.select_related("owner"),
    }
    response = render(request, FOLDERS_SECTION if request.htmx else FOLDER_LIST, context)
    patch_vary_headers(response, ["HX-Request"])
    return response


@require_GET
@login_required
def model_folder_detail(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Render a folder with its files, or only the files table for an htmx request."""
    folder = get_object_or_404(ModelFolder.objects.select_related("owner"), name=name)
    context = {"section": SECTION, **files_context(folder)}
    response = render(request, FILES_TABLE if request.htmx else FOLDER_DETAIL, context)
    patch_vary_headers(response, ["HX-Request"])
    return response


# Exempt here, checked in store_upload: the CSRF check reads the body, and the upload handler
# that streams it into the folder must be in place before that.
@csrf_exempt
@require_POST
@login_required
def model_folder_upload(request: HttpRequest, name: str) -> HttpResponse:
    """Store an uploaded file in the folder, then show the folder."""
    folder = get_object_or_404(ModelFolder, name=name)
    require_staff(request)
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
    folder = get_object_or_404(ModelFolder, name=name)
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
    folder = get_object_or_404(ModelFolder, name=name)
    require_staff(request)
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
    folder = get_object_or_404(ModelFolder, name=name)
    require_staff(request)
    if request.method == "POST":
        folders.delete_folder(folder)
        messages.success(request, f"Deleted model folder {name} and its files.")
        return redirect("serving:model_folder_list")
    context = {"section": SECTION, "folder": folder, **files_context(folder)}
    return render(request, "serving/model_folder_delete.html", context)
