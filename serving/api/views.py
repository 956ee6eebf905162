"""Admin API for model folders (by name) and the files inside them."""

from __future__ import annotations

from typing import Any

from django.http import FileResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.generics import GenericAPIView
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer
from rest_framework.views import APIView

from serving import folders
from serving.api.serializers import (
    FileEntrySerializer,
    FileListingSerializer,
    FilePreviewSerializer,
    ModelFolderSerializer,
    UploadSerializer,
)
from serving.models import ModelFolder

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

    queryset = ModelFolder.objects.select_related("owner")
    serializer_class = ModelFolderSerializer
    lookup_field = "name"
    lookup_value_regex = r"[^/]+"

    def perform_create(self, serializer: BaseSerializer[ModelFolder]) -> None:
        serializer.save(owner=self.request.user)

    def perform_destroy(self, instance: ModelFolder) -> None:
        folders.delete_folder(instance)


class FolderFilesMixin(FolderErrorsAsResponses):
    """Find the folder named in the URL."""

    def get_folder(self) -> ModelFolder:
        return get_object_or_404(ModelFolder, name=self.kwargs["name"])


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
