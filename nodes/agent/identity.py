"""The agent's identity: an Ed25519 key pair, its fingerprint and challenge signatures.

Pure: the controller imports `verify_challenge` and `fingerprint_of` without aiohttp or Django.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

KEY_FILE = "identity.key"
# Signatures cover this prefix too, so the key cannot be used to sign anything else verbatim.
CHALLENGE_PREFIX = b"nexus-agent-challenge:"


def challenge_message(challenge: str) -> bytes:
    """Return the bytes an agent signs for a challenge."""
    return CHALLENGE_PREFIX + challenge.encode()


def fingerprint_of(public_key_b64: str) -> str:
    """Return the OpenSSH-style fingerprint (`SHA256:` + unpadded base64) of a raw public key."""
    digest = hashlib.sha256(base64.b64decode(public_key_b64, validate=True)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def verify_challenge(public_key_b64: str, challenge: str, signature_b64: str) -> bool:
    """Return whether the signature is the key's signature of the challenge."""
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key_b64, validate=True))
        key.verify(base64.b64decode(signature_b64, validate=True), challenge_message(challenge))
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True


@dataclass(frozen=True)
class Identity:
    """The agent's private key and what it shows of it."""

    private_key: Ed25519PrivateKey

    @classmethod
    def load_or_create(cls, data_dir: Path) -> Identity:
        """Load `<data_dir>/identity.key`, making it (mode 0600) on first start."""
        path = data_dir / KEY_FILE
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            pem = path.read_bytes()
        except FileNotFoundError:
            key = Ed25519PrivateKey.generate()
            pem = key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            write_private_file(path, pem)
            return cls(key)
        loaded = serialization.load_pem_private_key(pem, password=None)
        if not isinstance(loaded, Ed25519PrivateKey):
            raise ValueError(f"{path} does not hold an Ed25519 private key")
        return cls(loaded)

    @property
    def public_key(self) -> str:
        """Return the raw 32-byte public key, base64."""
        raw = self.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return base64.b64encode(raw).decode()

    @property
    def fingerprint(self) -> str:
        """Return the fingerprint the operator confirms."""
        return fingerprint_of(self.public_key)

    def sign_challenge(self, challenge: str) -> str:
        """Return the base64 signature of the challenge."""
        return base64.b64encode(self.private_key.sign(challenge_message(challenge))).decode()


def write_private_file(path: Path, content: bytes) -> None:
    """Create a file only its owner can read; refuse to replace one that appeared meanwhile.

    The mode is set at creation, so the secret is never readable by others, whatever the umask.
    """
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(content)
