"""Projects and their members through the admin API: staff create projects, owners run them."""

from __future__ import annotations

import pytest

from nexus.models import Membership, Project, Role
from tests.nexus.factories import make_user
from tests.support.personas import add_member, signed_in

pytestmark = pytest.mark.django_db


def test_staff_create_a_project_and_others_may_not() -> None:
    staff, someone = signed_in(make_user("ops", staff=True)), signed_in(make_user("someone"))

    created = staff.post("/api/v1/projects/", {"name": "acme"}, format="json")
    refused = someone.post("/api/v1/projects/", {"name": "mine"}, format="json")

    assert created.status_code == 201
    assert refused.json() == {"detail": "Only staff create projects."}
    assert list(Project.objects.values_list("name", flat=True)) == ["acme", "default"]


def test_an_owner_adds_a_member_who_then_sees_the_project() -> None:
    acme = Project.objects.create(name="acme")
    owner, newcomer = make_user("owner"), make_user("newcomer")
    add_member(acme, owner, Role.OWNER)

    before = signed_in(newcomer).get("/api/v1/projects/acme/")
    added = signed_in(owner).post(
        "/api/v1/projects/acme/members/", {"user": "newcomer", "role": "member"}, format="json"
    )
    after = signed_in(newcomer).get("/api/v1/projects/")

    assert before.status_code == 404
    assert added.status_code == 201
    assert [project["name"] for project in after.json()["results"]] == ["acme"]


def test_a_member_cannot_change_the_memberships_and_an_owner_changes_roles() -> None:
    acme = Project.objects.create(name="acme")
    owner, member = make_user("owner"), make_user("member")
    add_member(acme, owner, Role.OWNER)
    add_member(acme, member, Role.MEMBER)

    promoted = signed_in(member).patch(
        "/api/v1/projects/acme/members/member/", {"role": "owner"}, format="json"
    )
    demoted = signed_in(owner).patch(
        "/api/v1/projects/acme/members/member/", {"role": "viewer"}, format="json"
    )

    assert promoted.status_code == 403
    assert demoted.json()["role"] == "viewer"
    assert Membership.objects.get(user=member).role == Role.VIEWER


def test_a_user_is_a_member_once() -> None:
    acme = Project.objects.create(name="acme")
    owner = make_user("owner")
    add_member(acme, owner, Role.OWNER)

    again = signed_in(owner).post(
        "/api/v1/projects/acme/members/", {"user": "owner", "role": "viewer"}, format="json"
    )

    assert again.status_code == 400
    assert again.json() == {"user": ["Already a member; change their role."]}
