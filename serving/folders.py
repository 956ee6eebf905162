"""Model folders on disk: create, list, read, write and delete files inside one folder, safely.

Two invariants hold for every operation here:
- a path a user gives is resolved and must stay inside the folder (no `..`, no absolute path, no
  symbolic link leading out);
- a written file appears whole or not at all: bytes go to a hidden temporary file in the folder,
  which `os.replace` puts in place once complete.
"""

from __future__ import annotations

import codecs
import errno
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import IO, Any

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler
from django.db import IntegrityError, transaction
from django.template.defaultfilters import filesizeformat

from serving.models import (
    ModelFolder,
    Service,
    ServiceLifecycle,
    make_models_root,
    models_root,
)

logger = logging.getLogger(__name__)

# Temporary files carry this prefix; listings hide them and user paths may not use it.
STAGING_PREFIX = ".nexus-upload-"
MAX_LISTED_FILES = 10_000
MAX_PATH_CHARS = 1024
PREVIEW_BYTES = 256 * 1024
CHUNK_BYTES = 1024 * 1024
# Room for the multipart framing and the `path` field around the file in an upload's body.
MULTIPART_SLACK_BYTES = 1024 * 1024


class FolderError(Exception):
    """A refused folder operation; the message says why and is safe to show to the user."""

    status_code = 400


class FolderExists(FolderError):
    """The name is taken, by a registered folder or by a directory on disk."""


class InvalidPath(FolderError):
    """A user-given path is malformed or leads outside the folder."""


class NotAFile(FolderError):
    """The path names a directory where a file is needed, or the other way round."""


class FileMissing(FolderError):
    """Nothing exists at the path."""

    status_code = 404


class DirectoryMissing(FolderError):
    """The folder is registered but its directory is gone from disk."""

    status_code = 409


class FolderInUse(FolderError):
    """A service that is not destroyed runs, or is to run, the folder."""

    status_code = 409


class LengthRequired(FolderError):
    """A raw body came without its length."""

    status_code = 411


class UploadTooLarge(FolderError):
    """The file is over the per-file upload limit."""

    status_code = 413

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"The file is larger than the upload limit of {filesizeformat(limit)} ({limit} bytes"
            " per file, set by NEXUS_MAX_UPLOAD_BYTES); nothing was written."
        )


@dataclass(frozen=True)
class FileEntry:
    """One file in a folder, by its path relative to the folder."""

    path: str
    size: int
    modified: datetime


@dataclass(frozen=True)
class FileListing:
    """A folder's files, sorted by path; truncated when there were more than MAX_LISTED_FILES."""

    files: list[FileEntry]
    truncated: bool


@dataclass(frozen=True)
class FilePreview:
    """The start of a file: its text when it is UTF-8, nothing when it is binary."""

    path: str
    size: int
    modified: datetime
    binary: bool
    truncated: bool
    text: str | None


def max_upload_bytes() -> int:
    """Return the per-file upload limit in bytes."""
    return settings.NEXUS_MAX_UPLOAD_BYTES


def check_name_free(name: str) -> None:
    """Refuse a name taken by a folder (ignoring case) or by a directory on disk."""
    if ModelFolder.objects.filter(name__iexact=name).exists():
        raise FolderExists(f"A model folder named {name!r} already exists.")
    if (models_root() / name).exists():
        raise FolderExists(
            f"A directory named {name!r} already exists in {models_root()} without being a"
            " registered model folder; move it away or choose another name."
        )


def create_folder(folder: ModelFolder) -> ModelFolder:
    """Make the folder's directory and save its row; either both exist afterwards or neither."""
    check_name_free(folder.name)
    make_models_root()
    # The exclusive mkdir is the lock: of two concurrent creations, one gets FileExistsError.
    try:
        folder.path.mkdir()
    except FileExistsError:
        raise FolderExists(f"A model folder named {folder.name!r} already exists.") from None
    try:
        with transaction.atomic():
            folder.save()
    except IntegrityError:
        folder.path.rmdir()
        raise FolderExists(f"A model folder named {folder.name!r} already exists.") from None
    except BaseException:
        folder.path.rmdir()
        raise
    return folder


def in_use_reason(folder: ModelFolder) -> str:
    """Say which services that are not destroyed mount the folder; "" when none does.

    Any revision counts, not only the latest: an older one may still have replicas running.
    """
    using = sorted(
        Service.objects.exclude(lifecycle=ServiceLifecycle.DESTROYED)
        .filter(revisions__model_folder=folder)
        .values_list("name", flat=True)
        .distinct()
    )
    if not using:
        return ""
    several = len(using) > 1
    return (
        f"The model folder {folder.name} is used by the service{'s' if several else ''} "
        f"{', '.join(using)}; delete {'them' if several else 'it'} first."
    )


def delete_folder(folder: ModelFolder) -> None:
    """Delete the folder's row and its directory with every file in it.

    Refused while a service that is not destroyed uses it; the revisions of destroyed services
    keep the folder's name.
    """
    reason = in_use_reason(folder)
    if reason:
        raise FolderInUse(reason)
    root = folder.path
    # Move the directory aside first: a failure then leaves either the whole folder or none of it.
    aside = root.with_name(f".deleting-{root.name}-{secrets.token_hex(4)}")
    moved = root.exists() or root.is_symlink()
    if moved:
        os.rename(root, aside)
    try:
        with transaction.atomic():
            folder.delete()
    except BaseException:
        if moved:
            os.rename(aside, root)
        raise
    if not moved:
        return
    try:
        # A folder that an operator linked to another disk loses the link, not that disk's files.
        if aside.is_symlink():
            aside.unlink()
        else:
            shutil.rmtree(aside)
    except OSError as error:
        logger.warning("Model folder %s deleted, but %s is left on disk: %s", folder, aside, error)


def folder_root(folder: ModelFolder) -> Path:
    """Return the folder's resolved directory, which must exist."""
    root = folder.path.resolve()
    if not root.is_dir():
        raise DirectoryMissing(
            f"The directory of model folder {folder.name!r} is missing: {folder.path}."
        )
    return root


def checked_relative(relative: str) -> PurePosixPath:
    """Return a user-given relative path after refusing the malformed and the escaping."""
    if not relative or not relative.strip():
        raise InvalidPath("A file path is required.")
    if len(relative) > MAX_PATH_CHARS:
        raise InvalidPath(f"A file path has at most {MAX_PATH_CHARS} characters.")
    if "\x00" in relative:
        raise InvalidPath("A file path may not contain a NUL character.")
    pure = PurePosixPath(relative)
    if pure.is_absolute():
        raise InvalidPath(f"{relative!r} is absolute; give a path relative to the model folder.")
    if ".." in pure.parts:
        raise InvalidPath(f"{relative!r} contains '..'; paths must stay inside the model folder.")
    if not pure.parts:
        raise InvalidPath(f"{relative!r} names the model folder itself, not a file in it.")
    if any(part.startswith(STAGING_PREFIX) for part in pure.parts):
        raise InvalidPath(f"Names starting with {STAGING_PREFIX!r} are reserved for uploads.")
    return pure


def resolve_inside(folder: ModelFolder, relative: str) -> Path:
    """Return where relative leads inside the folder, following links; refuse any way out."""
    root = folder_root(folder)
    pure = checked_relative(relative)
    try:
        resolved = (root / pure).resolve()
    except (OSError, RuntimeError):
        raise InvalidPath(f"{relative!r} goes through a loop of symbolic links.") from None
    if resolved == root or not resolved.is_relative_to(root):
        raise InvalidPath(f"{relative!r} leads outside the model folder through a symbolic link.")
    return resolved


def list_files(folder: ModelFolder, *, limit: int = MAX_LISTED_FILES) -> FileListing:
    """Return the folder's files, recursively, at most limit of them."""
    root = folder_root(folder)
    files: list[FileEntry] = []
    # Links are listed as files when they lead to a file inside; directory links are not walked,
    # so a link loop cannot make the walk endless.
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for filename in sorted(filenames):
            if filename.startswith(STAGING_PREFIX):
                continue
            full = Path(dirpath, filename)
            try:
                target = full.resolve()
                stat = target.stat()
            except (OSError, RuntimeError):
                continue
            if not target.is_relative_to(root) or not target.is_file():
                continue
            if len(files) == limit:
                return FileListing(files=files, truncated=True)
            files.append(
                FileEntry(
                    path=full.relative_to(root).as_posix(),
                    size=stat.st_size,
                    modified=datetime.fromtimestamp(stat.st_mtime, tz=UTC),
                )
            )
    return FileListing(files=files, truncated=False)


def existing_file(folder: ModelFolder, relative: str) -> Path:
    """Return the file that relative names inside the folder."""
    path = resolve_inside(folder, relative)
    if path.is_dir():
        raise NotAFile(f"{relative!r} is a directory, not a file.")
    if not path.is_file():
        raise FileMissing(f"No file {relative!r} in model folder {folder.name!r}.")
    return path


def read_file(folder: ModelFolder, relative: str) -> FilePreview:
    """Return the start of a file, as text unless it is binary."""
    path = existing_file(folder, relative)
    with path.open("rb") as handle:
        stat = os.fstat(handle.fileno())
        head = handle.read(PREVIEW_BYTES)
    truncated = stat.st_size > len(head)
    text = as_text(head, complete=not truncated)
    return FilePreview(
        path=PurePosixPath(relative).as_posix(),
        size=stat.st_size,
        modified=datetime.fromtimestamp(stat.st_mtime, tz=UTC),
        binary=text is None,
        truncated=truncated,
        text=text,
    )


def as_text(head: bytes, *, complete: bool) -> str | None:
    """Return bytes as UTF-8 text, or None when they look binary."""
    if b"\x00" in head:
        return None
    try:
        # Incremental: a character cut in half at the end of an incomplete head is left out.
        return codecs.getincrementaldecoder("utf-8")().decode(head, final=complete)
    except UnicodeDecodeError:
        return None


def write_file(
    folder: ModelFolder, relative: str, chunks: Iterable[bytes], *, limit: int | None = None
) -> FileEntry:
    """Write chunks to a file in the folder, replacing it whole; refuse more than limit bytes."""
    destination = writable_destination(folder, relative)
    limit = max_upload_bytes() if limit is None else limit
    handle = staging_file(destination.parent)
    try:
        written = 0
        for chunk in chunks:
            written += len(chunk)
            if written > limit:
                raise UploadTooLarge(limit)
            handle.write(chunk)
        finish_staging(handle)
        os.replace(handle.name, destination)
    except BaseException:
        discard(handle)
        raise
    return entry(folder, destination)


def install_file(folder: ModelFolder, relative: str, staged: Path) -> FileEntry:
    """Move a complete staged file into place at relative, replacing what was there."""
    destination = writable_destination(folder, relative)
    try:
        os.replace(staged, destination)
    except OSError as error:
        # A directory inside the folder may be another mount: copy across, then replace.
        if error.errno != errno.EXDEV:
            raise
        with staged.open("rb") as source, staging_file(destination.parent) as copy:
            try:
                shutil.copyfileobj(source, copy, CHUNK_BYTES)
                finish_staging(copy)
                os.replace(copy.name, destination)
            except BaseException:
                discard(copy)
                raise
        staged.unlink()
    return entry(folder, destination)


def delete_path(folder: ModelFolder, relative: str) -> None:
    """Delete a file (a link itself, not what it leads to) or a directory with its contents."""
    root = folder_root(folder)
    path = root / checked_relative(relative)
    # The last component is not followed, so deleting a link never touches its target.
    if not path.parent.resolve().is_relative_to(root):
        raise InvalidPath(f"{relative!r} leads outside the model folder through a symbolic link.")
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    else:
        raise FileMissing(f"No file {relative!r} in model folder {folder.name!r}.")
    prune_empty_parents(path.parent, root)


def prune_empty_parents(directory: Path, root: Path) -> None:
    """Remove directories left empty, up to (not including) the folder's root."""
    while directory != root and directory.is_relative_to(root):
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent


def writable_destination(folder: ModelFolder, relative: str) -> Path:
    """Return where a file may be written at relative, creating its parent directories."""
    destination = resolve_inside(folder, relative)
    if destination.is_dir():
        raise NotAFile(f"{relative!r} is a directory; give a file path inside it.")
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise NotAFile(f"A parent of {relative!r} is a file, not a directory.") from None
    return destination


def entry(folder: ModelFolder, path: Path) -> FileEntry:
    """Return the listing entry of a file inside the folder."""
    stat = path.stat()
    return FileEntry(
        path=path.relative_to(folder_root(folder)).as_posix(),
        size=stat.st_size,
        modified=datetime.fromtimestamp(stat.st_mtime, tz=UTC),
    )


def staging_file(directory: Path) -> IO[bytes]:
    """Open a new hidden temporary file in directory, on the same file system as its target."""
    return tempfile.NamedTemporaryFile(  # noqa: SIM115  (closed by finish_staging or discard)
        mode="wb", prefix=STAGING_PREFIX, dir=directory, delete=False
    )


def finish_staging(handle: IO[bytes]) -> None:
    """Make a staged file durable and readable like any other, before it replaces anything."""
    handle.flush()
    os.fsync(handle.fileno())
    os.chmod(handle.name, 0o644)
    handle.close()


def discard(handle: IO[bytes]) -> None:
    """Close and remove a staged file that will not be installed."""
    handle.close()
    Path(handle.name).unlink(missing_ok=True)


class StagedUpload(UploadedFile):
    """An uploaded file already streamed, complete, into a hidden file in its model folder."""

    name: str  # always given, and UploadedFile keeps a given name a string

    def __init__(self, handle: IO[bytes], name: str, content_type: str, size: int) -> None:
        super().__init__(handle, name, content_type, size)
        self.staged_path = Path(handle.name)


class FolderUploadHandler(FileUploadHandler):
    """Stream one multipart file straight into a hidden file in the model folder, counting bytes.

    Set it as the request's only upload handler before anything reads the body; the caller calls
    `discard()` once done, which removes the staged file unless it was installed.
    """

    FIELD = "file"

    def __init__(self, folder: ModelFolder | None, request: Any = None) -> None:
        super().__init__(request)
        self.folder = folder
        self.limit = max_upload_bytes()
        self.handle: IO[bytes] | None = None
        self.staged: StagedUpload | None = None

    def handle_raw_input(
        self,
        input_data: Any,
        META: dict[str, Any],  # noqa: N803  (Django's name)
        content_length: int,
        boundary: bytes,  # type: ignore[override]  # django-stubs says str; Django passes bytes
        encoding: str | None = None,
    ) -> None:
        # Refuse at once a body too long to hold a file within the limit.
        if content_length > self.limit + MULTIPART_SLACK_BYTES:
            raise UploadTooLarge(self.limit)

    def new_file(self, field_name: str, file_name: str, *args: Any, **kwargs: Any) -> None:
        super().new_file(field_name, file_name, *args, **kwargs)
        if field_name != self.FIELD:
            raise FolderError(f"Send the file in the multipart field {self.FIELD!r}.")
        if self.handle is not None or self.staged is not None:
            raise FolderError("Send one file per upload.")
        if self.folder is None:
            raise FileMissing("No such model folder.")
        self.handle = staging_file(folder_root(self.folder))

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        assert self.handle is not None
        if start + len(raw_data) > self.limit:
            self.discard()
            raise UploadTooLarge(self.limit)
        self.handle.write(raw_data)

    def file_complete(self, file_size: int) -> StagedUpload | None:
        if self.handle is None:
            return None
        finish_staging(self.handle)
        self.staged = StagedUpload(
            open(self.handle.name, "rb"),  # noqa: SIM115  (closed with the upload)
            self.file_name or "upload",
            self.content_type or "application/octet-stream",
            file_size,
        )
        self.handle = None
        return self.staged

    def discard(self) -> None:
        """Remove whatever this handler staged and nobody installed."""
        if self.handle is not None:
            discard(self.handle)
            self.handle = None
        if self.staged is not None:
            self.staged.close()
            self.staged.staged_path.unlink(missing_ok=True)
            self.staged = None
