"""The test process's password hasher (tests/settings.py): Django's PBKDF2, one iteration."""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class OneIterationPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """`pbkdf2_sha256` hashes that take microseconds to make and to check."""

    iterations = 1
