"""The agent's identity: a key made once, an OpenSSH-style fingerprint, signed challenges."""

from __future__ import annotations

import base64
import hashlib
import stat
from pathlib import Path

import pytest

from nodes.agent.identity import Identity, fingerprint_of, verify_challenge


def test_the_first_start_makes_a_pem_key_only_its_owner_can_read(tmp_path: Path) -> None:
    Identity.load_or_create(tmp_path)

    key_file = tmp_path / "identity.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert key_file.read_text().startswith("-----BEGIN PRIVATE KEY-----\n")


def test_a_later_start_keeps_the_key_and_so_the_fingerprint(tmp_path: Path) -> None:
    first = Identity.load_or_create(tmp_path)
    second = Identity.load_or_create(tmp_path)

    assert second.public_key == first.public_key
    assert second.fingerprint == first.fingerprint


def test_the_fingerprint_is_sha256_of_the_raw_public_key_in_unpadded_base64(
    tmp_path: Path,
) -> None:
    identity = Identity.load_or_create(tmp_path)

    raw = base64.b64decode(identity.public_key)
    digest = base64.b64encode(hashlib.sha256(raw).digest()).decode()
    assert len(raw) == 32
    assert identity.fingerprint == "SHA256:" + digest.rstrip("=")
    assert len(identity.fingerprint) == len("SHA256:") + 43  # 32 bytes, unpadded
    assert fingerprint_of(identity.public_key) == identity.fingerprint


def test_a_signed_challenge_verifies_with_the_public_key(tmp_path: Path) -> None:
    identity = Identity.load_or_create(tmp_path)

    signature = identity.sign_challenge("c0ffee")

    assert verify_challenge(identity.public_key, "c0ffee", signature)


def test_the_signature_covers_the_prefixed_challenge(tmp_path: Path) -> None:
    identity = Identity.load_or_create(tmp_path)

    signature = base64.b64decode(identity.sign_challenge("c0ffee"))

    identity.private_key.public_key().verify(signature, b"nexus-agent-challenge:c0ffee")


FORGED_SIGNATURE = base64.b64encode(b"x" * 64).decode()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("challenge", "c0ffef"),
        ("signature", FORGED_SIGNATURE),
        ("signature", "not base64!"),
        ("public_key", "AAAA"),
    ],
    ids=["other-challenge", "forged-signature", "malformed-signature", "malformed-key"],
)
def test_a_tampered_or_malformed_challenge_does_not_verify(
    tmp_path: Path, field: str, value: str
) -> None:
    identity = Identity.load_or_create(tmp_path)
    signed = {
        "public_key": identity.public_key,
        "challenge": "c0ffee",
        "signature": identity.sign_challenge("c0ffee"),
    }
    signed[field] = value

    assert not verify_challenge(signed["public_key"], signed["challenge"], signed["signature"])


def test_another_agents_key_does_not_verify_the_signature(tmp_path: Path) -> None:
    ours = Identity.load_or_create(tmp_path / "ours")
    theirs = Identity.load_or_create(tmp_path / "theirs")

    signature = theirs.sign_challenge("c0ffee")

    assert not verify_challenge(ours.public_key, "c0ffee", signature)
    assert ours.fingerprint != theirs.fingerprint
