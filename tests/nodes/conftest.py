"""Agents shared by a test module: two real agents with their own data dirs and credentials."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.nodes.fleet import agent_args
from tests.support.agent import RunningAgent, running_agent


@pytest.fixture(scope="module")
def agent_one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    with running_agent(tmp_path_factory.mktemp("fleet"), name="one", args=agent_args()) as agent:
        yield agent


@pytest.fixture(scope="module")
def agent_two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    with running_agent(
        tmp_path_factory.mktemp("fleet"), name="two", credential="second-secret", args=agent_args()
    ) as agent:
        yield agent
