"""Exact replicas, enforced (issue 11, point 5): a target whose stored identity (its configured
model id, its node's digest of the model file) differs from the pool's other targets' is refused
at save time with the reason, by the services, the admin API and the pool page; one whose
identity cannot be proven (a provider) is still saved and needs the recorded confirmation; a
pool becomes Exact replicas only while its targets serve one model."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from nodes.models import Node, NodeModel, NodeTrust
from pools import services, validation
from pools.models import Pool, Target
from tests.nexus.factories import make_pool, make_target, make_user

pytestmark = pytest.mark.django_db

SMALL, LARGE = "smollm2-135m", "smollm2-360m"
DIGEST_A = "sha256:" + "ab" * 32
DIGEST_B = "sha256:" + "cd" * 32


def node_serving(name: str, digest: str) -> Node:
    """Return a trusted node whose inventory reports SMALL with this content digest."""
    node = Node.objects.create(
        name=name, address=f"http://{name}.local:7100", trust=NodeTrust.TRUSTED
    )
    NodeModel.objects.create(node=node, model_id=SMALL, digest=digest, seen_at=timezone.now())
    return node


def refusal_of(error: ValidationError) -> dict[str, list[str]]:
    return error.message_dict


# --- the services -----------------------------------------------------------------------------


def test_a_target_of_another_model_is_refused_by_an_exact_replicas_pool() -> None:
    pool = make_pool("chat", compatibility_mode="exact_replicas")
    make_target(pool, "t1", model_id=SMALL)

    with pytest.raises(ValidationError) as refused:
        services.add_target(
            pool, {"name": "t2", "base_url": "http://10.0.0.2:8000/v1", "model_id": LARGE}
        )

    assert refusal_of(refused.value) == {
        "model_id": [
            f"t2 serves {LARGE}, the pool's targets serve {SMALL}: an Exact-replicas pool's "
            "targets serve one model."
        ]
    }
    assert not Target.objects.filter(pool=pool, name="t2").exists()


def test_a_target_of_the_same_model_joins_and_an_equivalent_generation_pool_takes_any() -> None:
    exact = make_pool("chat", compatibility_mode="exact_replicas")
    make_target(exact, "t1", model_id=SMALL)
    services.add_target(
        exact, {"name": "t2", "base_url": "http://10.0.0.2:8000/v1", "model_id": SMALL}
    )

    loose = make_pool("mixed", compatibility_mode="equivalent_generation")
    make_target(loose, "t1", model_id=SMALL)
    services.add_target(
        loose, {"name": "t2", "base_url": "http://10.0.0.2:8000/v1", "model_id": LARGE}
    )

    assert exact.targets.count() == loose.targets.count() == 2


def test_the_first_target_of_a_pool_is_never_refused() -> None:
    pool = make_pool("chat", compatibility_mode="exact_replicas")

    target = services.add_target(
        pool, {"name": "t1", "base_url": "http://10.0.0.1:8000/v1", "model_id": LARGE}
    )

    assert target.pk is not None


def test_changing_a_targets_model_id_away_from_the_pools_is_refused() -> None:
    pool = make_pool("chat", compatibility_mode="exact_replicas")
    make_target(pool, "t1", model_id=SMALL)
    t2 = make_target(pool, "t2", model_id=SMALL)

    with pytest.raises(ValidationError) as refused:
        services.update_target(t2, {"model_id": LARGE})

    assert "t2 serves smollm2-360m, the pool's targets serve smollm2-135m" in str(refused.value)
    t2.refresh_from_db()
    assert t2.model_id == SMALL
    # Changes that do not touch the identity are not checked.
    services.update_target(t2, {"priority": 2})


def test_a_node_target_whose_model_file_digest_differs_is_refused() -> None:
    pool = make_pool("chat", compatibility_mode="exact_replicas")
    make_target(pool, "t1", node=node_serving("gpu-1", DIGEST_A), model_id=SMALL)

    with pytest.raises(ValidationError) as refused:
        services.add_target(
            pool,
            {"name": "t2", "node": node_serving("gpu-2", DIGEST_B), "base_url": "http://gpu-2/v1",
             "model_id": SMALL},
        )  # fmt: skip

    assert refusal_of(refused.value) == {
        "model_id": [
            "t2's model file has digest sha256:cdcdcdcdcdcd…, which differs from "
            "sha256:abababababab… on the pool's targets: an Exact-replicas pool's targets serve "
            "one model file."
        ]
    }


def test_a_target_whose_identity_cannot_be_proven_is_saved_and_needs_the_confirmation() -> None:
    pool = make_pool("chat", compatibility_mode="exact_replicas")
    make_target(pool, "t1", node=node_serving("gpu-1", DIGEST_A), model_id=SMALL)

    # A provider endpoint of the same model id: no digest to compare, nothing disproves it.
    services.add_target(
        pool, {"name": "provider", "base_url": "https://api.example/v1", "model_id": SMALL}
    )

    problems = validation.identity_problems([validation.identity_of(t) for t in pool.targets.all()])
    assert problems == [
        "No content digest for provider: a provider or a runtime URL does not show its build."
    ]


def test_a_pool_becomes_exact_replicas_only_while_its_targets_serve_one_model() -> None:
    pool = make_pool("mixed", compatibility_mode="equivalent_generation")
    make_target(pool, "t1", model_id=SMALL)
    make_target(pool, "t2", model_id=LARGE)

    with pytest.raises(ValidationError) as refused:
        services.update_pool_settings(pool, {"compatibility_mode": "exact_replicas"})

    assert refusal_of(refused.value) == {
        "compatibility_mode": [
            f"The targets serve different models (t1 serves {SMALL}; t2 serves {LARGE}): make "
            "them one model first."
        ]
    }
    pool.refresh_from_db()
    assert pool.compatibility_mode == "equivalent_generation"

    services.update_target(Target.objects.get(pool=pool, name="t2"), {"model_id": SMALL})
    services.update_pool_settings(pool, {"compatibility_mode": "exact_replicas"})
    assert Pool.objects.get(pk=pool.pk).compatibility_mode == "exact_replicas"


# --- the admin API ----------------------------------------------------------------------------


def test_the_api_answers_400_naming_the_models_when_a_target_of_another_model_is_added(
    owner: APIClient,
) -> None:
    pool = make_pool("chat", compatibility_mode="exact_replicas")
    make_target(pool, "t1", model_id=SMALL)

    answer = owner.post(
        "/api/v1/targets/",
        {"pool": "chat", "name": "t2", "base_url": "http://10.0.0.2:8000/v1", "model_id": LARGE},
        format="json",
    )

    assert answer.status_code == 400
    assert answer.json() == {
        "model_id": [
            f"t2 serves {LARGE}, the pool's targets serve {SMALL}: an Exact-replicas pool's "
            "targets serve one model."
        ]
    }


def test_the_api_answers_400_when_a_targets_model_id_is_changed_away_from_the_pools(
    owner: APIClient,
) -> None:
    pool = make_pool("chat", compatibility_mode="exact_replicas")
    make_target(pool, "t1", model_id=SMALL)
    t2 = make_target(pool, "t2", model_id=SMALL)

    answer = owner.patch(f"/api/v1/targets/{t2.pk}/", {"model_id": LARGE}, format="json")

    assert answer.status_code == 400
    assert list(answer.json()) == ["model_id"]
    assert Target.objects.get(pk=t2.pk).model_id == SMALL


def test_the_api_answers_400_when_a_mixed_pool_is_switched_to_exact_replicas(
    owner: APIClient,
) -> None:
    pool = make_pool("mixed", compatibility_mode="equivalent_generation")
    make_target(pool, "t1", model_id=SMALL)
    make_target(pool, "t2", model_id=LARGE)

    answer = owner.patch(
        "/api/v1/pools/mixed/", {"compatibility_mode": "exact_replicas"}, format="json"
    )

    assert answer.status_code == 400
    assert answer.json()["compatibility_mode"] == [
        f"The targets serve different models (t1 serves {SMALL}; t2 serves {LARGE}): make them "
        "one model first."
    ]


# --- the pool page ----------------------------------------------------------------------------


def test_the_pages_add_target_form_shows_the_refusal_on_the_model_id() -> None:
    pool = make_pool("chat", name="Chat", compatibility_mode="exact_replicas")
    make_target(pool, "t1", model_id=SMALL)
    operator = Client()
    operator.force_login(make_user("operator", staff=True))

    page = operator.post(
        "/pools/chat/targets/add/",
        {"name": "t2", "base_url": "http://10.0.0.2:8000/v1", "model_id": LARGE, "kinds": ["chat"],
         "priority": 1, "capacity_weight": 4},
    )  # fmt: skip

    assert page.status_code == 400
    assert f"t2 serves {LARGE}, the pool&#x27;s targets serve {SMALL}" in page.content.decode()
    assert not Target.objects.filter(pool=pool, name="t2").exists()
