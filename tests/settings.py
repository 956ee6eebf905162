"""Nexus's settings for the test suite: its own, after each pytest-xdist worker's environment is
made its own (tests/support/workers.py), so that workers never see each other's data."""

import os

from tests.support.workers import isolate_worker

isolate_worker()

from nexus.settings import *  # noqa: E402, F403

# The model store's seed folders would appear in every test's folder and service lists: a test
# that wants them calls serving.store_seed.seed_store itself.
NEXUS_MODEL_STORE_SEED = False

# The processes tests start (daphne, Celery, the agent) read Nexus's settings themselves, with
# this worker's environment.
os.environ["DJANGO_SETTINGS_MODULE"] = "nexus.settings"

# `flush` that truncates only the tables holding rows, for the tests that commit
# (tests/support/flushing): first, so that its command is the one found.
INSTALLED_APPS = ["tests.support.flushing", *INSTALLED_APPS]  # noqa: F405

# Django hashes a password with 1,000,000 PBKDF2 iterations (0.3 s here); the test process
# makes its users' passwords with one. The algorithm is the same, and the count is written in
# each hash, so a live server the tests start checks such a password at once and, as it would
# any outdated hash, re-hashes it at its full count on the first sign-in.
PASSWORD_HASHERS = ["tests.support.passwords.OneIterationPBKDF2PasswordHasher"]
