"""The controller's side of folders that follow replicas: the manifest a revision fixes, and the
signed, resumable file links agents fetch from."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from django.test import Client
from pytest_django.fixtures import Settings

from serving import folder_sync, folders
from serving.models import ModelFolder

pytestmark = pytest.mark.django_db
WEIGHTS = bytes(range(256)) * 64


@pytest.fixture
def folder(settings: Settings, tmp_path: Path) -> ModelFolder:
    settings.DATA_DIR = tmp_path
    folder = folders.create_folder(ModelFolder(name="llama"))
    folders.write_file(folder, "weights/model.bin", [WEIGHTS])
    folders.write_file(folder, "config.json", [b"{}"])
    return folder


def link(folder: ModelFolder, path: str, node_id: int = 7) -> str:
    digest = folder_sync.manifest(folder)["digest"]
    base = folder_sync.download_url(folder, digest, node_id)
    return base.split("127.0.0.1:8000", 1)[-1] + "/" + path


def test_the_manifest_names_every_file_with_its_checksum_and_the_folders_digest(
    folder: ModelFolder,
) -> None:
    made = folder_sync.manifest(folder)

    assert made["files"] == [
        {"path": "config.json", "size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()},
        {
            "path": "weights/model.bin",
            "size": len(WEIGHTS),
            "sha256": hashlib.sha256(WEIGHTS).hexdigest(),
        },
    ]
    lines = "".join(f"{f['sha256']}  {f['path']}\n" for f in made["files"])
    assert made["digest"] == "sha256:" + hashlib.sha256(lines.encode()).hexdigest()
    # A changed file changes the digest.
    folders.write_file(folder, "config.json", [b'{"a": 1}'])
    assert folder_sync.manifest(folder)["digest"] != made["digest"]


def test_an_agent_fetches_a_file_whole_or_from_a_byte_on(folder: ModelFolder) -> None:
    url = link(folder, "weights/model.bin")

    whole = Client().get(url)
    rest = Client().get(url, HTTP_RANGE="bytes=1000-")

    assert (whole.status_code, b"".join(whole.streaming_content)) == (200, WEIGHTS)
    assert whole["Accept-Ranges"] == "bytes"
    assert rest.status_code == 206
    assert rest["Content-Range"] == f"bytes 1000-{len(WEIGHTS) - 1}/{len(WEIGHTS)}"
    assert b"".join(rest.streaming_content) == WEIGHTS[1000:]
    assert Client().get(url, HTTP_RANGE=f"bytes={len(WEIGHTS)}-").status_code == 416


def test_without_a_valid_token_nothing_is_sent(folder: ModelFolder) -> None:
    url = link(folder, "config.json")
    token = url.split("/")[3]
    forged = url.replace(token, token[:-2] + ("AA" if not token.endswith("AA") else "BB"))

    assert Client().get(forged).status_code == 403
    assert Client().get("/serving/folder-sync/x/config.json").json() == {
        "detail": "The folder link is invalid or expired."
    }
    assert Client().get(link(folder, "../secret_key")).status_code == 404


def test_a_token_expires(folder: ModelFolder, monkeypatch: pytest.MonkeyPatch) -> None:
    url = link(folder, "config.json")
    monkeypatch.setattr(folder_sync, "TOKEN_MAX_AGE_S", -1)

    assert Client().get(url).status_code == 403
