"""Model folders: directories of model files under the data dir, through the API and the pages."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import IntegrityError
from django.test import Client
from pytest_django.fixtures import Settings
from rest_framework.test import APIClient

from nexus.models import ApiToken
from nexus.scopes import AdminAccess, TokenKind
from serving import folders, services
from serving.models import ModelFolder, Revision, Service, ServiceLifecycle
from tests.nexus.factories import make_user
from tests.support.personas import default_viewer

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("data_dir")]

MODEL_DEFINITION = b"""models:
  - name: llama
    model_path: /models
    service:
      start_command: [python, -m, vllm.entrypoints.openai.api_server]
      port: 8000
"""
SERVICE_DEFINITION = b'[vllm.resource_slots]\ncpu = 4\nmem = "8gb"\n'
LIMIT = 1024
TOO_LARGE = (
    "The file is larger than the upload limit of 1.0\xa0KB (1024 bytes per file, set by"
    " NEXUS_MAX_UPLOAD_BYTES); nothing was written."
)
FOLDERS = "/api/v1/model-folders/"


def make_folder(name: str = "llama", **files: bytes) -> ModelFolder:
    """Create a model folder holding the given files (keyword: relative path with '__' for '/')."""
    folder = folders.create_folder(ModelFolder(name=name, owner=make_user(f"{name}-owner")))
    for key, content in files.items():
        folders.write_file(folder, key.replace("__", "/"), [content])
    return folder


def upload(client: APIClient, folder: str, name: str, content: bytes, path: str | None = None):
    """Upload one file to a folder through the API."""
    data: dict[str, object] = {"file": SimpleUploadedFile(name, content)}
    if path is not None:
        data["path"] = path
    return client.post(f"{FOLDERS}{folder}/files/", data, format="multipart")


def on_disk(folder: ModelFolder) -> list[str]:
    """Return every entry under the folder's directory, hidden ones included, sorted."""
    return sorted(p.relative_to(folder.path).as_posix() for p in folder.path.rglob("*"))


# Creating and deleting folders


def test_an_owner_creates_a_model_folder_with_an_empty_directory(
    owner: APIClient, data_dir: Path
) -> None:
    response = owner.post(
        FOLDERS, {"name": "llama-3.1-8b", "description": "Meta's 8B"}, format="json"
    )

    assert response.status_code == 201
    body = response.json()
    assert {k: v for k, v in body.items() if k not in ("created_at", "updated_at")} == {
        "name": "llama-3.1-8b",
        "owner": "owner",
        "project": "default",
        "usage": "model",
        "description": "Meta's 8B",
        "path": str(data_dir / "models" / "llama-3.1-8b"),
        "model_definition": None,
        "service_definition": None,
    }
    assert list((data_dir / "models" / "llama-3.1-8b").iterdir()) == []


def test_a_taken_name_is_refused_whatever_its_case(owner: APIClient) -> None:
    make_folder("llama")

    same = owner.post(FOLDERS, {"name": "llama"}, format="json")
    other_case = owner.post(FOLDERS, {"name": "LLAMA"}, format="json")

    assert same.status_code == 400
    assert same.json() == {"name": ["A model folder named 'llama' already exists."]}
    assert other_case.status_code == 400
    assert other_case.json() == {"name": ["A model folder named 'LLAMA' already exists."]}
    assert ModelFolder.objects.count() == 1


def test_a_directory_already_on_disk_is_not_taken_over(owner: APIClient, data_dir: Path) -> None:
    orphan = data_dir / "models" / "orphan"
    orphan.mkdir(parents=True)
    (orphan / "weights.bin").write_bytes(b"someone's")

    response = owner.post(FOLDERS, {"name": "orphan"}, format="json")

    assert response.status_code == 400
    assert response.json() == {
        "name": [
            f"A directory named 'orphan' already exists in {data_dir / 'models'} without being"
            " a registered model folder; move it away or choose another name."
        ]
    }
    assert not ModelFolder.objects.exists()
    assert (orphan / "weights.bin").read_bytes() == b"someone's"


@pytest.mark.parametrize(
    "name", ["..", ".", ".hidden", "../etc", "a/b", "a b", "", "-x", "name\x00", "x" * 101]
)
def test_a_name_that_is_not_one_safe_directory_name_is_refused(
    owner: APIClient, data_dir: Path, name: str
) -> None:
    response = owner.post(FOLDERS, {"name": name}, format="json")

    assert response.status_code == 400
    assert list(response.json()) == ["name"]
    assert not ModelFolder.objects.exists()
    assert not (data_dir / "models").exists() or list((data_dir / "models").iterdir()) == []


def test_a_failed_insert_removes_the_directory_it_made(
    monkeypatch: pytest.MonkeyPatch, data_dir: Path
) -> None:
    # A row without its directory, as a concurrent creation would leave for a moment.
    ModelFolder.objects.create(name="llama")
    monkeypatch.setattr(folders, "check_name_free", lambda name: None)

    with pytest.raises(folders.FolderExists, match="'llama' already exists"):
        folders.create_folder(ModelFolder(name="llama"))

    assert not (data_dir / "models" / "llama").exists()
    assert ModelFolder.objects.count() == 1


def test_a_failed_mkdir_leaves_no_row(monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> None:
    (data_dir / "models" / "llama").mkdir(parents=True)
    monkeypatch.setattr(folders, "check_name_free", lambda name: None)

    with pytest.raises(folders.FolderExists):
        folders.create_folder(ModelFolder(name="llama"))

    assert not ModelFolder.objects.exists()


def test_an_owner_deletes_a_folder_with_its_directory_and_files(
    owner: APIClient, data_dir: Path
) -> None:
    make_folder("llama", weights__part_1=b"1", **{"model-definition.yaml": MODEL_DEFINITION})

    response = owner.delete(f"{FOLDERS}llama/")

    assert response.status_code == 204
    assert not ModelFolder.objects.exists()
    assert list((data_dir / "models").iterdir()) == []


def test_a_folder_a_live_service_uses_is_kept_and_the_refusal_names_the_service(
    owner: APIClient,
) -> None:
    folder = make_folder("llama", weights=b"1")
    services.create_service(name="chat", model_folder=folder, runtime_variant="vllm")

    response = owner.delete(f"{FOLDERS}llama/")

    assert response.status_code == 409
    assert response.json() == {
        "detail": "The model folder llama is used by the service chat; delete it first."
    }
    assert on_disk(folder) == ["weights"]


def test_a_folder_only_destroyed_services_used_is_deleted_and_they_keep_its_name(
    owner: APIClient,
) -> None:
    folder = make_folder("llama", weights=b"1")
    service = services.create_service(name="chat", model_folder=folder, runtime_variant="vllm")
    Service.objects.filter(pk=service.pk).update(lifecycle=ServiceLifecycle.DESTROYED)

    response = owner.delete(f"{FOLDERS}llama/")

    assert response.status_code == 204
    assert not folder.path.exists()
    revision = Revision.objects.get(service=service)
    assert (revision.model_folder, revision.model_folder_name) == (None, "llama")
    page = owner.get("/serving/services/chat/")
    assert "llama (deleted)" in page.content.decode()


def test_a_failed_row_deletion_puts_the_directory_back(monkeypatch: pytest.MonkeyPatch) -> None:
    folder = make_folder("llama", weights=b"1")

    def refuse(self: ModelFolder) -> None:
        raise IntegrityError("referenced")

    monkeypatch.setattr(ModelFolder, "delete", refuse)
    with pytest.raises(IntegrityError):
        folders.delete_folder(folder)

    assert on_disk(folder) == ["weights"]
    assert sorted(p.name for p in folder.path.parent.iterdir()) == ["llama"]


def test_the_detail_says_which_definition_files_the_folder_holds(teammate: APIClient) -> None:
    make_folder("llama", **{"model-definition.yml": MODEL_DEFINITION})
    make_folder("qwen", **{"service-definition.toml": SERVICE_DEFINITION})

    llama = teammate.get(f"{FOLDERS}llama/").json()
    qwen = teammate.get(f"{FOLDERS}qwen/").json()

    assert (llama["model_definition"], llama["service_definition"]) == (
        "model-definition.yml",
        None,
    )
    assert (qwen["model_definition"], qwen["service_definition"]) == (
        None,
        "service-definition.toml",
    )


def test_folders_are_listed_by_name(teammate: APIClient) -> None:
    make_folder("qwen")
    make_folder("llama.3")

    response = teammate.get(FOLDERS)

    assert [folder["name"] for folder in response.json()["results"]] == ["llama.3", "qwen"]


# Files


def test_an_owner_uploads_a_model_definition(owner: APIClient) -> None:
    folder = make_folder("llama")

    response = upload(owner, "llama", "model-definition.yaml", MODEL_DEFINITION)

    assert response.status_code == 201
    assert response.json()["path"] == "model-definition.yaml"
    assert response.json()["size"] == len(MODEL_DEFINITION)
    assert (folder.path / "model-definition.yaml").read_bytes() == MODEL_DEFINITION
    assert on_disk(folder) == ["model-definition.yaml"]
    assert owner.get(f"{FOLDERS}llama/").json()["model_definition"] == "model-definition.yaml"


def test_an_upload_goes_to_the_path_asked_for_making_directories(owner: APIClient) -> None:
    folder = make_folder("llama")

    response = upload(owner, "llama", "ignored.bin", b"\x00\x01", path="weights/part-1.bin")

    assert response.status_code == 201
    assert response.json()["path"] == "weights/part-1.bin"
    assert (folder.path / "weights" / "part-1.bin").read_bytes() == b"\x00\x01"


def test_an_upload_without_a_file_says_where_the_file_goes(owner: APIClient) -> None:
    make_folder("llama")

    response = owner.post(f"{FOLDERS}llama/files/", {"path": "a.txt"}, format="multipart")

    assert response.status_code == 400
    assert response.json() == {"detail": "Attach the file in the multipart field 'file'."}


def test_files_are_listed_recursively_by_path_without_staged_uploads(teammate: APIClient) -> None:
    folder = make_folder("llama", weights__b=b"bb", weights__a=b"a", **{"config.json": b"{}"})
    (folder.path / f"{folders.STAGING_PREFIX}crashed").write_bytes(b"half")

    response = teammate.get(f"{FOLDERS}llama/files/")

    assert response.status_code == 200
    assert response.json()["truncated"] is False
    assert [(f["path"], f["size"]) for f in response.json()["files"]] == [
        ("config.json", 2),
        ("weights/a", 1),
        ("weights/b", 2),
    ]


def test_a_listing_stops_at_its_bound() -> None:
    folder = make_folder("llama", a=b"", b=b"", c=b"")

    listing = folders.list_files(folder, limit=2)

    assert [entry.path for entry in listing.files] == ["a", "b"]
    assert listing.truncated is True


def test_a_text_file_is_previewed(teammate: APIClient) -> None:
    make_folder("llama", **{"model-definition.yaml": MODEL_DEFINITION})

    response = teammate.get(f"{FOLDERS}llama/files/model-definition.yaml")

    assert response.status_code == 200
    body = response.json()
    assert body["text"] == MODEL_DEFINITION.decode()
    assert (body["path"], body["size"], body["binary"], body["truncated"]) == (
        "model-definition.yaml",
        len(MODEL_DEFINITION),
        False,
        False,
    )


def test_a_binary_file_is_flagged_not_shown(teammate: APIClient) -> None:
    make_folder("llama", **{"model.gguf": b"GGUF\x00\x03\xff"})

    body = teammate.get(f"{FOLDERS}llama/files/model.gguf").json()

    assert (body["binary"], body["text"], body["size"]) == (True, None, 7)


def test_a_long_text_is_cut_at_the_preview_bound_between_characters() -> None:
    # 'é' is two bytes: the bound falls inside the last one, which is left out whole.
    content = b"a" + "é".encode() * folders.PREVIEW_BYTES
    folder = make_folder("llama", **{"notes.txt": content})

    preview = folders.read_file(folder, "notes.txt")

    assert (preview.binary, preview.truncated, preview.size) == (False, True, len(content))
    assert preview.text == "a" + "é" * (folders.PREVIEW_BYTES // 2 - 1)


def test_a_file_is_downloaded_whole(teammate: APIClient) -> None:
    make_folder("llama", **{"model.gguf": b"GGUF\x00\x03"})

    response = teammate.get(f"{FOLDERS}llama/files/model.gguf?download=1")

    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"GGUF\x00\x03"
    assert response.headers["Content-Disposition"] == 'attachment; filename="model.gguf"'


def test_an_upload_replaces_the_file_at_its_path(owner: APIClient) -> None:
    folder = make_folder("llama", **{"model-definition.yaml": b"old: true\n"})

    response = upload(owner, "llama", "model-definition.yaml", MODEL_DEFINITION)

    assert response.status_code == 201
    assert (folder.path / "model-definition.yaml").read_bytes() == MODEL_DEFINITION
    assert on_disk(folder) == ["model-definition.yaml"]


def test_a_put_writes_the_raw_body_replacing_the_file(owner: APIClient) -> None:
    folder = make_folder("llama", **{"service-definition.toml": b"old = 1\n"})

    response = owner.put(
        f"{FOLDERS}llama/files/service-definition.toml",
        SERVICE_DEFINITION,
        content_type="application/octet-stream",
    )
    nested = owner.put(
        f"{FOLDERS}llama/files/tokenizer/vocab.txt", b"a\nb\n", content_type="text/plain"
    )

    assert response.status_code == 200
    assert response.json()["size"] == len(SERVICE_DEFINITION)
    assert nested.status_code == 200
    assert (folder.path / "service-definition.toml").read_bytes() == SERVICE_DEFINITION
    assert (folder.path / "tokenizer" / "vocab.txt").read_bytes() == b"a\nb\n"
    assert on_disk(folder) == ["service-definition.toml", "tokenizer", "tokenizer/vocab.txt"]


def test_a_put_without_a_content_length_is_refused(owner: APIClient) -> None:
    folder = make_folder("llama")

    response = owner.put(
        f"{FOLDERS}llama/files/a.txt", b"chunked", content_type="text/plain", CONTENT_LENGTH=""
    )

    assert response.status_code == 411
    assert response.json() == {"detail": "Send the body with a Content-Length header."}
    assert on_disk(folder) == []


def test_an_upload_into_a_directory_on_another_file_system_is_copied_across(
    owner: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = make_folder("llama")
    replace = os.replace
    refused: list[Path] = []

    def across_mounts(source: str | Path, destination: str | Path) -> None:
        # The staged file sits at the folder's top; a rename into `weights/` crosses a mount.
        if Path(source).parent == folders.folder_root(folder):
            refused.append(Path(source))
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        replace(source, destination)

    monkeypatch.setattr(folders.os, "replace", across_mounts)
    response = upload(owner, "llama", "model.bin", b"weights", path="weights/model.bin")

    assert response.status_code == 201
    assert len(refused) == 1
    assert (folder.path / "weights" / "model.bin").read_bytes() == b"weights"
    assert on_disk(folder) == ["weights", "weights/model.bin"]


def test_an_owner_deletes_a_file_and_the_directories_it_leaves_empty(owner: APIClient) -> None:
    folder = make_folder("llama", weights__deep__a=b"1", **{"config.json": b"{}"})

    response = owner.delete(f"{FOLDERS}llama/files/weights/deep/a")
    again = owner.delete(f"{FOLDERS}llama/files/weights/deep/a")

    assert response.status_code == 204
    assert on_disk(folder) == ["config.json"]
    assert again.status_code == 404
    assert again.json() == {"detail": "No file 'weights/deep/a' in model folder 'llama'."}


def test_a_missing_file_or_a_directory_cannot_be_read(teammate: APIClient) -> None:
    make_folder("llama", weights__a=b"1")

    missing = teammate.get(f"{FOLDERS}llama/files/nothing.txt")
    directory = teammate.get(f"{FOLDERS}llama/files/weights")

    assert missing.status_code == 404
    assert missing.json() == {"detail": "No file 'nothing.txt' in model folder 'llama'."}
    assert directory.status_code == 400
    assert directory.json() == {"detail": "'weights' is a directory, not a file."}


# Paths that try to leave the folder


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the data dir, with a secret, that a symbolic link in a folder leads to."""
    place = tmp_path / "outside"
    place.mkdir()
    (place / "secret.txt").write_text("do not read")
    return place


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        (
            "../secret.txt",
            "'../secret.txt' contains '..'; paths must stay inside the model folder.",
        ),
        ("a/../../x", "'a/../../x' contains '..'; paths must stay inside the model folder."),
        ("/etc/passwd", "'/etc/passwd' is absolute; give a path relative to the model folder."),
        (
            "escape/secret.txt",
            "'escape/secret.txt' leads outside the model folder through a symbolic link.",
        ),
        (".nexus-upload-x", "Names starting with '.nexus-upload-' are reserved for uploads."),
    ],
)
def test_a_path_leading_outside_the_folder_is_refused_everywhere(
    owner: APIClient, outside: Path, path: str, detail: str
) -> None:
    folder = make_folder("llama")
    os.symlink(outside, folder.path / "escape")
    url = f"{FOLDERS}llama/files/{path}"

    responses = {
        "upload": upload(owner, "llama", "x.txt", b"written", path=path),
        "get": owner.get(url),
        "put": owner.put(url, b"written", content_type="application/octet-stream"),
    }

    for what, response in responses.items():
        assert (what, response.status_code, response.json()) == (what, 400, {"detail": detail})
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "do not read"
    assert on_disk(folder) == ["escape"]


def test_deleting_a_link_removes_the_link_not_what_it_leads_to(
    owner: APIClient, outside: Path
) -> None:
    folder = make_folder("llama")
    os.symlink(outside, folder.path / "escape")

    through = owner.delete(f"{FOLDERS}llama/files/escape/secret.txt")
    link = owner.delete(f"{FOLDERS}llama/files/escape")

    assert through.status_code == 400
    assert link.status_code == 204
    assert on_disk(folder) == []
    assert (outside / "secret.txt").read_text() == "do not read"


def test_a_link_inside_the_folder_may_be_read(teammate: APIClient) -> None:
    folder = make_folder("llama", **{"model-definition.yaml": MODEL_DEFINITION})
    os.symlink(folder.path / "model-definition.yaml", folder.path / "model-definition.yml")

    response = teammate.get(f"{FOLDERS}llama/files/model-definition.yml")

    assert response.status_code == 200
    assert response.json()["text"] == MODEL_DEFINITION.decode()


# The upload limit


def test_an_upload_over_the_limit_is_refused_and_leaves_nothing(
    owner: APIClient, settings: Settings
) -> None:
    settings.NEXUS_MAX_UPLOAD_BYTES = LIMIT
    folder = make_folder("llama")

    at_limit = upload(owner, "llama", "fits.bin", b"x" * LIMIT)
    over = upload(owner, "llama", "big.bin", b"x" * (LIMIT + 1))

    assert at_limit.status_code == 201
    assert over.status_code == 413
    assert over.json() == {"detail": TOO_LARGE}
    assert on_disk(folder) == ["fits.bin"]


def test_a_body_far_over_the_limit_is_refused_before_a_byte_is_staged(
    owner: APIClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.NEXUS_MAX_UPLOAD_BYTES = LIMIT
    folder = make_folder("llama")
    staged: list[Path] = []
    monkeypatch.setattr(folders, "staging_file", lambda directory: staged.append(directory))

    response = upload(owner, "llama", "big.bin", b"x" * (folders.MULTIPART_SLACK_BYTES + LIMIT))

    assert response.status_code == 413
    assert response.json() == {"detail": TOO_LARGE}
    assert staged == []
    assert on_disk(folder) == []


def test_a_refused_upload_keeps_the_file_it_would_have_replaced(
    owner: APIClient, settings: Settings
) -> None:
    settings.NEXUS_MAX_UPLOAD_BYTES = LIMIT
    folder = make_folder("llama", **{"model.bin": b"the good one"})

    over = upload(owner, "llama", "model.bin", b"x" * (LIMIT + 1))
    put = owner.put(
        f"{FOLDERS}llama/files/model.bin", b"x" * (LIMIT + 1), content_type="text/plain"
    )

    assert (over.status_code, put.status_code) == (413, 413)
    assert put.json() == {"detail": TOO_LARGE}
    assert (folder.path / "model.bin").read_bytes() == b"the good one"
    assert on_disk(folder) == ["model.bin"]


def test_a_stream_longer_than_the_limit_is_cut_off_and_discarded() -> None:
    folder = make_folder("llama")

    with pytest.raises(folders.UploadTooLarge):
        folders.write_file(folder, "weights/model.bin", [b"x" * 600, b"x" * 600], limit=LIMIT)

    assert on_disk(folder) == ["weights"]


# Who may do what


def test_a_teammate_reads_folders_and_files_but_cannot_change_them(teammate: APIClient) -> None:
    folder = make_folder("llama", **{"model-definition.yaml": MODEL_DEFINITION})
    file_url = f"{FOLDERS}llama/files/model-definition.yaml"

    reads = [
        teammate.get(FOLDERS),
        teammate.get(f"{FOLDERS}llama/"),
        teammate.get(f"{FOLDERS}llama/files/"),
        teammate.get(file_url),
    ]
    writes = [
        teammate.post(FOLDERS, {"name": "qwen"}, format="json"),
        upload(teammate, "llama", "x.bin", b"x"),
        teammate.put(file_url, b"changed", content_type="text/plain"),
        teammate.delete(file_url),
        teammate.delete(f"{FOLDERS}llama/"),
    ]

    assert [r.status_code for r in reads] == [200, 200, 200, 200]
    assert [r.status_code for r in writes] == [403, 403, 403, 403, 403]
    assert list(ModelFolder.objects.values_list("name", flat=True)) == ["llama"]
    assert on_disk(folder) == ["model-definition.yaml"]
    assert (folder.path / "model-definition.yaml").read_bytes() == MODEL_DEFINITION


def test_an_outsider_sees_nothing(outsider: APIClient) -> None:
    make_folder("llama", **{"model-definition.yaml": MODEL_DEFINITION})

    responses = [
        outsider.get(FOLDERS),
        outsider.get(f"{FOLDERS}llama/"),
        outsider.get(f"{FOLDERS}llama/files/"),
        outsider.get(f"{FOLDERS}llama/files/model-definition.yaml"),
        upload(outsider, "llama", "x.bin", b"x"),
    ]

    assert [r.status_code for r in responses] == [401] * 5
    assert responses[0].json() == {"detail": "Authentication credentials were not provided."}


def test_a_session_upload_without_its_csrf_token_is_refused_and_leaves_nothing() -> None:
    folder = make_folder("llama")
    browser = APIClient(enforce_csrf_checks=True)
    browser.force_login(make_user("owner", staff=True))

    response = upload(browser, "llama", "x.bin", b"x")

    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
    assert on_disk(folder) == []


def test_a_staff_admin_token_uploads_without_a_session() -> None:
    folder = make_folder("llama")
    _, secret = ApiToken.issue(
        "ci",
        kind=TokenKind.ADMIN,
        access=AdminAccess.WRITE,
        created_by=make_user("robot", staff=True),
    )
    robot = APIClient()
    robot.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")

    response = upload(robot, "llama", "model-definition.yaml", MODEL_DEFINITION)

    assert response.status_code == 201
    assert on_disk(folder) == ["model-definition.yaml"]


# Pages (the browser flow itself is in tests/e2e/test_model_folders_page.py)


@pytest.fixture
def staff_browser() -> Client:
    client = Client()
    client.force_login(make_user("owner", staff=True))
    return client


def test_the_page_creates_a_folder_and_shows_it(staff_browser: Client) -> None:
    created = staff_browser.post("/serving/models/", {"name": "llama", "project": "default"})

    assert created.status_code == 302
    assert created.headers["Location"] == "/serving/models/llama/"
    page = staff_browser.get("/serving/models/")
    assert page.context["section"] == "models"
    assert [folder.name for folder in page.context["folders"]] == ["llama"]


def test_the_page_says_why_an_upload_over_the_limit_was_refused(
    staff_browser: Client, settings: Settings
) -> None:
    settings.NEXUS_MAX_UPLOAD_BYTES = LIMIT
    folder = make_folder("llama")

    response = staff_browser.post(
        "/serving/models/llama/upload/",
        {"file": SimpleUploadedFile("big.bin", b"x" * (LIMIT + 1))},
        follow=True,
    )

    assert [str(m) for m in response.context["messages"]] == [TOO_LARGE]
    assert on_disk(folder) == []


def test_a_teammate_cannot_change_folders_through_the_pages() -> None:
    folder = make_folder("llama", weights=b"1")
    browser = Client()
    browser.force_login(default_viewer("teammate"))

    responses = [
        browser.post("/serving/models/", {"name": "qwen", "project": "default"}),
        browser.post("/serving/models/llama/upload/", {"file": SimpleUploadedFile("x", b"x")}),
        browser.post("/serving/models/llama/delete-file/", {"path": "weights"}),
        browser.post("/serving/models/llama/delete/"),
    ]

    assert [r.status_code for r in responses] == [403, 403, 403, 403]
    assert browser.get("/serving/models/llama/").status_code == 200
    assert on_disk(folder) == ["weights"]


def test_the_delete_page_says_which_service_uses_the_folder(staff_browser: Client) -> None:
    folder = make_folder("llama", weights=b"1")
    services.create_service(name="chat", model_folder=folder, runtime_variant="vllm")

    asked = staff_browser.get("/serving/models/llama/delete/")
    refused = staff_browser.post("/serving/models/llama/delete/")

    reason = "The model folder llama is used by the service chat; delete it first."
    assert asked.context["in_use"] == reason
    assert refused.status_code == 409
    assert reason in refused.content.decode()
    assert on_disk(folder) == ["weights"]


def test_the_create_form_says_why_a_name_is_taken(staff_browser: Client) -> None:
    make_folder("llama")

    response = staff_browser.post(
        "/serving/models/", {"name": "Llama", "project": "default"}, HTTP_HX_REQUEST="true"
    )

    assert response.status_code == 200
    assert not response.content.startswith(b"<!doctype")
    assert "A model folder named &#x27;Llama&#x27; already exists." in response.content.decode()
    assert ModelFolder.objects.count() == 1


def test_the_admin_makes_and_removes_the_directory(data_dir: Path) -> None:
    admin = Client()
    admin.force_login(make_user("root", superuser=True))

    added = admin.post("/admin/serving/modelfolder/add/", {"name": "llama", "project": "default"})
    folder = ModelFolder.objects.get()
    deleted = admin.post(f"/admin/serving/modelfolder/{folder.pk}/delete/", {"post": "yes"})

    assert (added.status_code, deleted.status_code) == (302, 302)
    assert folder.owner is not None and folder.owner.get_username() == "root"
    assert not ModelFolder.objects.exists()
    assert list((data_dir / "models").iterdir()) == []


def test_the_admin_refuses_to_delete_a_folder_a_live_service_uses(data_dir: Path) -> None:
    folder = make_folder("llama", weights=b"1")
    services.create_service(name="chat", model_folder=folder, runtime_variant="vllm")
    admin = Client()
    admin.force_login(make_user("root", superuser=True))

    page = admin.post(f"/admin/serving/modelfolder/{folder.pk}/delete/", {"post": "yes"})

    assert page.status_code == 200
    assert "The model folder llama is used by the service chat" in page.content.decode()
    assert ModelFolder.objects.filter(pk=folder.pk).exists()
    assert on_disk(folder) == ["weights"]
