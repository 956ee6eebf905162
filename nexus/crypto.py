"""Encryption at rest for provider keys and node credentials."""

from __future__ import annotations

import base64
import functools
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


class UndecryptableSecret(Exception):
    """A stored secret cannot be decrypted with the configured key."""


@functools.cache
def _fernet(key_material: str) -> Fernet:
    digest = hashlib.sha256(f"nexus-secrets:{key_material}".encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def _key_material() -> str:
    # A dedicated key lets operators rotate SECRET_KEY (sessions) without losing stored secrets.
    return settings.NEXUS_ENCRYPTION_KEY or settings.SECRET_KEY


def encrypt(plaintext: str) -> str:
    """Return the secret encrypted for storage."""
    return _fernet(_key_material()).encrypt(plaintext.encode()).decode()


def decrypt(ciphertext: str) -> str:
    """Return the stored secret in plain text."""
    try:
        return _fernet(_key_material()).decrypt(ciphertext.encode()).decode()
    except InvalidToken:
        raise UndecryptableSecret("stored secret does not match NEXUS_ENCRYPTION_KEY") from None
