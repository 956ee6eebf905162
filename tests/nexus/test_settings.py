"""Settings come from the environment through typed helpers that refuse bad values."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from nexus.env import data_dir, env_bool, env_int, env_list, env_str, persistent_secret


def test_unset_variables_take_the_embedded_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEXUS_TEST_VALUE", raising=False)

    assert env_str("NEXUS_TEST_VALUE", "fallback") == "fallback"
    assert env_bool("NEXUS_TEST_VALUE", True) is True
    assert env_int("NEXUS_TEST_VALUE", 7) == 7
    assert env_list("NEXUS_TEST_VALUE", ["a"]) == ["a"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("TRUE", True), (" yes ", True), ("on", True), ("0", False), ("off", False),
     ("", False)],
)  # fmt: skip
def test_booleans_accept_clear_words(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool
) -> None:
    monkeypatch.setenv("NEXUS_TEST_VALUE", raw)

    assert env_bool("NEXUS_TEST_VALUE", not expected) is expected


def test_a_boolean_that_is_neither_yes_nor_no_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEXUS_DEBUG", "maybe")

    with pytest.raises(ImproperlyConfigured, match=r"NEXUS_DEBUG='maybe' is not a boolean"):
        env_bool("NEXUS_DEBUG", False)


def test_integers_are_parsed_and_an_empty_value_means_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NEXUS_PORT", "8123")
    assert env_int("NEXUS_PORT", 8000, minimum=1) == 8123

    monkeypatch.setenv("NEXUS_PORT", " ")
    assert env_int("NEXUS_PORT", 8000, minimum=1) == 8000


def test_a_value_that_is_not_an_integer_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEXUS_PORT", "eighty")

    with pytest.raises(ImproperlyConfigured, match=r"NEXUS_PORT='eighty' is not an integer"):
        env_int("NEXUS_PORT", 8000, minimum=1)


def test_an_integer_below_its_minimum_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEXUS_MAX_BODY_BYTES", "10")

    with pytest.raises(ImproperlyConfigured, match=r"NEXUS_MAX_BODY_BYTES=10 is below the minimum"):
        env_int("NEXUS_MAX_BODY_BYTES", 16 * 1024 * 1024, minimum=1024)


def test_lists_are_comma_separated_without_blanks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEXUS_ALLOWED_HOSTS", " a.example , ,b.example,")

    assert env_list("NEXUS_ALLOWED_HOSTS", []) == ["a.example", "b.example"]


def test_the_data_dir_is_created_and_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NEXUS_DATA_DIR", "nested/data")

    path = data_dir()

    assert path == tmp_path / "nested" / "data"
    assert path.is_dir()


def test_the_secret_is_generated_once_readable_only_by_its_owner(tmp_path: Path) -> None:
    path = tmp_path / "secret_key"

    first = persistent_secret(path)
    second = persistent_secret(path)

    assert len(first) >= 50
    assert second == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_existing_secret_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "secret_key"
    path.write_text("operator-chosen\n")

    assert persistent_secret(path) == "operator-chosen"
