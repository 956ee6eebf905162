"""Admin API for model folders (by name) and their files, resource groups and presets, model
services (by name) with their routes, and definition checks."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from django.db.models import QuerySet
from django.http import FileResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import mixins, permissions, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.generics import GenericAPIView
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer
from rest_framework.views import APIView

from nexus import access
from nexus.auth import ApiTokenAuthentication, acting_user
from nexus.models import DEFAULT_PROJECT, project_named
from serving import folders, services, trials
from serving.api.serializers import (
    FileEntrySerializer,
    FileListingSerializer,
    FilePreviewSerializer,
    ModelFolderSerializer,
    ProblemsSerializer,
    ResourceGroupSerializer,
    ResourcePresetSerializer,
    RouteSerializer,
    ServiceCreateSerializer,
    ServiceDetailSerializer,
    ServiceSerializer,
    ServiceUpdateSerializer,
    TrialCreateSerializer,
    TrialSerializer,
    UploadSerializer,
    ValidateSerializer,
    ValidationResultSerializer,
)
from serving.definitions import (
    MODEL_DEFINITION_SCHEMA,
    CommandImportError,
    DefinitionError,
    import_command,
    parse_model_definition,
    parse_service_definition,
)
from serving.definitions.values import item_path, key_path
from serving.launch import LaunchError, LaunchProblem
from serving.models import (
    ModelFolder,
    ResourceGroup,
    ResourcePreset,
    Service,
    ServiceLifecycle,
    Trial,
)

REFUSED = OpenApiResponse(OpenApiTypes.OBJECT, description='`{"detail": "why"}`')
FILE_PATH = OpenApiParameter(
    "path",
    str,
    OpenApiParameter.PATH,
    description="The file's path relative to the folder; '/' separates directories.",
)
DOWNLOAD = OpenApiParameter(
    "download", bool, description="Send the file's bytes as an attachment instead of a preview."
)


class FolderErrorsAsResponses(APIView):
    """Answer a refused folder operation with its status code and message."""

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, folders.FolderError):
            return Response({"detail": str(exc)}, status=exc.status_code)
        return super().handle_exception(exc)


class ModelFolderViewSet(
    FolderErrorsAsResponses,
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Model folders: created with an empty directory, deleted with every file in it."""

    serializer_class = ModelFolderSerializer
    permission_classes = [access.ProjectRoles]
    lookup_field = "name"
    lookup_value_regex = r"[^/]+"

    def get_queryset(self) -> QuerySet[ModelFolder]:
        return visible_folders(self.request).select_related("owner")

    def project_of(self, folder: ModelFolder) -> str:
        return folder.project

    def perform_create(self, serializer: BaseSerializer[ModelFolder]) -> None:
        project = serializer.validated_data.get("project", DEFAULT_PROJECT)
        if not sees_project(self.request, project):
            raise ValidationError({"project": [f"No project is named {project!r}."]})
        access.require_change(self.request.user, project)
        serializer.save(owner=self.request.user)

    def perform_destroy(self, instance: ModelFolder) -> None:
        folders.delete_folder(instance)


def in_visible_projects(request: Request, found: QuerySet[Any]) -> QuerySet[Any]:
    """Keep the rows (services, model folders: they name their project) the caller sees."""
    return access.in_visible_projects(request.user, found)


def sees_project(request: Request, name: str) -> bool:
    """Say whether the project exists for the caller (the default one always exists)."""
    project = project_named(name)
    return (
        project is not None and access.visible_projects(request.user).filter(pk=project.pk).exists()
    )


def visible_folders(request: Request) -> QuerySet[ModelFolder]:
    """Return the model folders of the caller's projects (staff: all)."""
    return in_visible_projects(request, ModelFolder.objects.all())


class FolderFilesMixin(FolderErrorsAsResponses):
    """Find the folder named in the URL, among the caller's; changing it needs a changing role."""

    permission_classes = [access.ProjectRoles]

    def project_of(self, folder: ModelFolder) -> str:
        return folder.project

    def get_folder(self) -> ModelFolder:
        folder = get_object_or_404(visible_folders(self.request), name=self.kwargs["name"])
        self.check_object_permissions(self.request, folder)
        return folder


class ModelFolderFilesView(FolderFilesMixin, GenericAPIView):
    """A folder's files: list them, or upload one (multipart)."""

    parser_classes = [MultiPartParser]
    serializer_class = UploadSerializer

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        # Before anything reads the body (the CSRF check does, during authentication): the file
        # then streams, counted, into the folder itself instead of a temporary directory.
        self.upload = folders.FolderUploadHandler(
            ModelFolder.objects.filter(name=kwargs["name"]).first(), request._request
        )
        request._request.upload_handlers = [self.upload]
        super().initial(request, *args, **kwargs)

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        # Whatever happened, a staged file that was not installed goes away.
        if hasattr(self, "upload"):
            self.upload.discard()
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(operation_id="v1_model_folders_files_list", responses=FileListingSerializer)
    def get(self, request: Request, name: str) -> Response:
        """List the folder's files, recursively, sorted by path."""
        listing = folders.list_files(self.get_folder())
        return Response(FileListingSerializer(listing).data)

    @extend_schema(
        operation_id="v1_model_folders_files_create",
        request={"multipart/form-data": UploadSerializer},
        responses={201: FileEntrySerializer, 400: REFUSED, 404: REFUSED, 413: REFUSED},
    )
    def post(self, request: Request, name: str) -> Response:
        """Upload one file into the folder, replacing any file at the same path."""
        folder = self.get_folder()
        staged = request.FILES.get("file")
        if not isinstance(staged, folders.StagedUpload):
            raise folders.FolderError("Attach the file in the multipart field 'file'.")
        relative = request.data.get("path") or staged.name
        written = folders.install_file(folder, relative, staged.staged_path)
        return Response(FileEntrySerializer(written).data, status=status.HTTP_201_CREATED)


class ModelFolderFileView(FolderFilesMixin, GenericAPIView):
    """One file in a folder: read it, write it (the raw request body), delete it."""

    serializer_class = FilePreviewSerializer

    @extend_schema(
        operation_id="v1_model_folders_file_retrieve",
        parameters=[FILE_PATH, DOWNLOAD],
        responses={
            (200, "application/json"): FilePreviewSerializer,
            (200, "application/octet-stream"): OpenApiTypes.BINARY,
            400: REFUSED,
            404: REFUSED,
        },
    )
    def get(self, request: Request, name: str, path: str) -> Response | FileResponse:
        """Preview the file (text up to 256 KiB; binary flagged), or download it whole."""
        folder = self.get_folder()
        if request.query_params.get("download") in ("1", "true"):
            found = folders.existing_file(folder, path)
            return FileResponse(found.open("rb"), as_attachment=True, filename=found.name)
        return Response(FilePreviewSerializer(folders.read_file(folder, path)).data)

    @extend_schema(
        operation_id="v1_model_folders_file_update",
        parameters=[FILE_PATH],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={
            200: FileEntrySerializer,
            400: REFUSED,
            404: REFUSED,
            411: REFUSED,
            413: REFUSED,
        },
    )
    def put(self, request: Request, name: str, path: str) -> Response:
        """Write the request body to the file, replacing it whole; missing directories are made."""
        folder = self.get_folder()
        limit = folders.max_upload_bytes()
        length = request.headers.get("Content-Length", "")
        # Without it DRF offers no body at all, which would write an empty file.
        if not length.isdigit():
            raise folders.LengthRequired("Send the body with a Content-Length header.")
        if int(length) > limit:
            raise folders.UploadTooLarge(limit)
        # DRF gives no stream for an empty body: that writes an empty file.
        stream = request.stream
        body = iter(lambda: stream.read(folders.CHUNK_BYTES), b"") if stream else iter(())
        written = folders.write_file(folder, path, body, limit=limit)
        return Response(FileEntrySerializer(written).data)

    @extend_schema(
        operation_id="v1_model_folders_file_destroy",
        parameters=[FILE_PATH],
        responses={204: None, 400: REFUSED, 404: REFUSED},
    )
    def delete(self, request: Request, name: str, path: str) -> Response:
        """Delete the file, or a directory with everything in it."""
        folders.delete_path(self.get_folder(), path)
        return Response(status=status.HTTP_204_NO_CONTENT)


class LaunchErrorsAsResponses(APIView):
    """Answer a refused service operation with every problem, at its field or file path."""

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, LaunchError):
            status_code = getattr(exc, "status_code", status.HTTP_400_BAD_REQUEST)
            return Response(exc.to_dict(), status=status_code)
        return super().handle_exception(exc)


def checked(serializer: BaseSerializer[Any]) -> dict[str, Any]:
    """Return the serializer's data, or raise LaunchError naming every malformed field."""
    if serializer.is_valid():
        return dict(serializer.validated_data)
    raise LaunchError(list(field_problems(serializer.errors, "")))


def field_problems(errors: Any, path: str) -> Iterator[LaunchProblem]:
    """Yield DRF's nested field errors as problems at their key paths."""
    if isinstance(errors, Mapping):
        for key, nested in errors.items():
            # DRF's errors about the whole object have no field: they are at the parent's path.
            yield from field_problems(
                nested, path if key == "non_field_errors" else key_path(path, key)
            )
    elif isinstance(errors, list) and errors and not isinstance(errors[0], str):
        for index, nested in enumerate(errors):
            yield from field_problems(nested, item_path(path, index))
    else:
        for message in errors:
            yield LaunchProblem("", path, str(message))


def visible_services(request: Request) -> QuerySet[Service]:
    """Return the services of the caller's projects (staff: all)."""
    return in_visible_projects(request, Service.objects.all())


class ServiceChildViewSet(viewsets.GenericViewSet):
    """The routes under a service (its tokens, rules, scale events): the live service named in
    the URL among the caller's, 404 otherwise; its project decides who may change them."""

    def get_service(self) -> Service:
        name = self.kwargs["service_name"]
        service = (
            visible_services(self.request)
            .filter(name=name)
            .exclude(lifecycle=ServiceLifecycle.DESTROYED)
            .first()
        )
        if service is None:
            raise NotFound(f"No service named {name!r}.")
        return service

    def project_of(self, obj: Any) -> str:
        return self.get_service().project


def require_project_change(request: Request, project: str) -> None:
    """Refuse a change in a project the caller may not change: 400 when they do not see it."""
    if not sees_project(request, project):
        raise LaunchError([LaunchProblem("", "project", f"no project is named {project!r}")])
    access.require_change(request.user, project)


PROBLEMS = OpenApiResponse(ProblemsSerializer, description="Every problem, each at its path.")
LIFECYCLE = OpenApiParameter(
    "lifecycle",
    str,
    enum=["active", "destroyed"],
    description="active: running, starting or being destroyed; destroyed: gone.",
)


@extend_schema_view(
    list=extend_schema(parameters=[LIFECYCLE], responses=ServiceSerializer(many=True)),
    retrieve=extend_schema(responses=ServiceDetailSerializer),
    create=extend_schema(
        request=ServiceCreateSerializer, responses={201: ServiceDetailSerializer, 400: PROBLEMS}
    ),
    partial_update=extend_schema(
        request=ServiceUpdateSerializer,
        responses={200: ServiceDetailSerializer, 400: PROBLEMS, 409: PROBLEMS},
    ),
    destroy=extend_schema(request=None, responses={202: ServiceDetailSerializer, 409: PROBLEMS}),
)
class ServiceViewSet(
    LaunchErrorsAsResponses,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Model services by name: declare, change (a new revision, or a scale), delete."""

    serializer_class = ServiceSerializer
    permission_classes = [access.ProjectRoles]
    lookup_field = "name"
    lookup_value_regex = r"[-A-Za-z0-9_]+"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[Service]:
        found = services.with_ready_counts(visible_services(self.request))
        # Explicit: Meta.ordering does not apply to a query with GROUP BY (the ready count).
        found = found.select_related("owner", "latest_revision", "running_revision").order_by(
            "name", "id"
        )
        lifecycle = self.request.query_params.get("lifecycle")
        if self.action == "list" and lifecycle is not None:
            if lifecycle not in ("active", "destroyed"):
                raise LaunchError([LaunchProblem("", "lifecycle", "must be active or destroyed")])
            found = services.in_tab(found, lifecycle)
        return found

    def get_object(self) -> Service:
        found = self.get_queryset().filter(name=self.kwargs["name"])
        # Names are unique among services not destroyed; destroyed ones may share a name.
        service = found.exclude(lifecycle=ServiceLifecycle.DESTROYED).first()
        service = service or found.order_by("-created_at", "-id").first()
        if service is None:
            raise NotFound(f"No service named {self.kwargs['name']!r}.")
        self.check_object_permissions(self.request, service)
        return service

    def project_of(self, service: Service) -> str:
        return service.project

    def detail_response(self, service: Service, status_code: int = 200) -> Response:
        fresh = (
            self.get_queryset()
            .select_related(
                "latest_revision__model_folder",
                "latest_revision__resource_group",
                "latest_revision__preset",
                "running_revision__model_folder",
                "running_revision__resource_group",
                "running_revision__preset",
            )
            .get(pk=service.pk)
        )
        return Response(ServiceDetailSerializer(fresh).data, status=status_code)

    def retrieve(self, request: Request, name: str) -> Response:
        """A service with its routes, revisions, and the latest and running revision in full."""
        return self.detail_response(self.get_object())

    def create(self, request: Request) -> Response:
        """Declare a service; its first revision is resolved from the folder and settings now."""
        # The project first: a caller who may not launch there learns nothing from the body.
        project = request.data.get("project", DEFAULT_PROJECT)
        require_project_change(request, project if isinstance(project, str) else "")
        data = checked(ServiceCreateSerializer(data=request.data))
        owner = request.user if request.user.is_authenticated else None
        service = services.create_service(owner=owner, **data)
        return self.detail_response(service, status.HTTP_201_CREATED)

    @extend_schema(request=TrialCreateSerializer, responses={202: TrialSerializer, 400: PROBLEMS})
    @action(detail=False, methods=["post"], url_path="validate", url_name="validate")
    def validate(self, request: Request) -> Response:
        """Start a trial replica of these launch settings (Validate); follow it at
        /api/v1/trials/<id>/ until its state is passed or failed. Nothing of a service is made."""
        project = request.data.get("project", DEFAULT_PROJECT)
        require_project_change(request, project if isinstance(project, str) else "")
        data = checked(TrialCreateSerializer(data=request.data))
        owner = request.user if request.user.is_authenticated else None
        try:
            trial = trials.start_trial(owner, name="", **data)
        except trials.TrialRefused as refused:
            raise LaunchError([LaunchProblem("", "cluster_size", str(refused))]) from None
        return Response(TrialSerializer(trial).data, status=status.HTTP_202_ACCEPTED)

    def partial_update(self, request: Request, name: str) -> Response:
        """Change a service: launch settings make a new revision, replicas and access do not."""
        service = self.get_object()
        changes = checked(ServiceUpdateSerializer(data=request.data, partial=True))
        actor = request.user if request.user.is_authenticated else None
        services.update_service(service, actor=actor, **changes)
        return self.detail_response(service)

    def destroy(self, request: Request, name: str) -> Response:
        """Start destroying the service: its replicas are drained and stopped, then it is gone."""
        service = services.delete_service(self.get_object())
        return self.detail_response(service, status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: RouteSerializer, 404: REFUSED})
    @action(
        detail=True,
        methods=["post"],
        url_path=r"routes/(?P<route_id>\d+)/clear-errors",
        url_name="route-clear-errors",
    )
    def clear_errors(self, request: Request, name: str, route_id: str) -> Response:
        """Forget a route's errors and retry it now, without waiting out its backoff."""
        route = get_object_or_404(self.get_object().routes, pk=route_id)
        cleared = services.clear_route_errors(route, actor=acting_user(request))
        return Response(RouteSerializer(cleared).data)


class TrialViewSet(mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Trial replicas (Validate) of the caller's projects, by id."""

    serializer_class = TrialSerializer
    permission_classes = [access.ProjectRoles]

    def get_queryset(self) -> QuerySet[Trial]:
        return in_visible_projects(
            self.request, Trial.objects.select_related("node", "model_folder")
        )

    def project_of(self, trial: Trial) -> str:
        return trial.project


@extend_schema_view(destroy=extend_schema(responses={204: None, 409: OpenApiTypes.OBJECT}))
class ResourceGroupViewSet(viewsets.ModelViewSet):
    """Resource groups: the nodes a service's replicas may be placed on.

    Deleting one is refused (409) while it is the default group or any revision names it.
    """

    queryset = ResourceGroup.objects.prefetch_related("nodes")
    serializer_class = ResourceGroupSerializer
    lookup_field = "name"

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        try:
            services.delete_resource_group(self.get_object())
        except services.GroupRefused as refused:
            return Response({"detail": str(refused)}, status=status.HTTP_409_CONFLICT)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ResourcePresetViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Resource presets: named slot amounts a replica reserves."""

    queryset = ResourcePreset.objects.all()
    serializer_class = ResourcePresetSerializer
    lookup_field = "name"


class ChecksForEveryone(permissions.BasePermission):
    """Any signed-in user or admin token may check a definition: checking changes nothing."""

    def has_permission(self, request: Request, view: Any) -> bool:
        return bool(request.user and request.user.is_authenticated)


class ModelDefinitionSchemaView(APIView):
    """The JSON Schema of model-definition.yaml, public so that editors can fetch it.

    Anonymous callers read it; a token is still checked, so a client token is refused here as
    on every admin API route.
    """

    authentication_classes = [ApiTokenAuthentication]
    permission_classes = [permissions.AllowAny]

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        """Return the JSON Schema (draft 2020-12) of model-definition.yaml."""
        return Response(MODEL_DEFINITION_SCHEMA)


class ValidateDefinitionView(APIView):
    """Check a model definition, a service definition or a command line; store nothing."""

    permission_classes = [ChecksForEveryone]

    @extend_schema(
        request=ValidateSerializer,
        responses={200: ValidationResultSerializer, 400: OpenApiTypes.OBJECT},
    )
    def post(self, request: Request) -> Response:
        """Return whether the text is valid, every problem at its key path, and its reading.

        The answer is 200 whether or not the text is valid; 400 means the request itself is
        malformed (no text, an unknown kind).
        """
        asked = ValidateSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        kind, text = asked.validated_data["kind"], asked.validated_data["text"]
        return Response(check_definition(kind, text))


def check_definition(kind: str, text: str) -> dict[str, Any]:
    """Return the validation answer for one definition text of the given kind."""
    try:
        if kind == "model-definition":
            result = parse_model_definition(text).to_dict()
        elif kind == "service-definition":
            result = parse_service_definition(text).to_dict()
        else:
            result = import_command(text).to_dict()
    except DefinitionError as invalid:
        problems = [problem.to_dict() for problem in invalid.problems]
        return {"valid": False, "problems": problems, "result": None}
    except CommandImportError as unreadable:
        return {
            "valid": False,
            "problems": [{"path": "", "message": str(unreadable)}],
            "result": None,
        }
    return {"valid": True, "problems": [], "result": result}
