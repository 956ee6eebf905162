"""The pools pages: signed-in only, every target shown, no secret ever rendered."""

from __future__ import annotations

import pytest
from django.test import Client

from nexus.models import Project, Role, default_project_pk
from tests.nexus.factories import make_pool, make_target, make_user
from tests.support.personas import add_member, default_viewer, signed_in

pytestmark = pytest.mark.django_db

PROVIDER_KEY = "sk-provider-0123456789abcdef"


@pytest.fixture
def teammate() -> Client:
    client = Client()
    client.force_login(default_viewer("teammate"))
    return client


def test_an_outsider_is_sent_to_sign_in() -> None:
    response = Client().get("/pools/")

    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/pools/"


def test_the_sign_in_page_renders() -> None:
    response = Client().get("/login/?next=/pools/")

    assert response.status_code == 200
    assert 'name="username"' in response.content.decode()
    assert 'name="next" value="/pools/"' in response.content.decode()


def test_the_pools_page_lists_each_pool_with_its_targets(teammate: Client) -> None:
    pool = make_pool("chat", name="Chat models", strategy="least_busy")
    make_target(pool, "gpu-a", model_id="qwen2.5-7b", priority=1, capacity_weight=8)
    make_target(pool, "openai", credential=PROVIDER_KEY, priority=2, enabled=False)

    response = teammate.get("/pools/")
    page = response.content.decode()

    assert response.status_code == 200
    assert response.templates[0].name == "pools/pool_list.html"
    for text in [
        "Chat models",
        "@pool/chat",
        'data-copy="@pool/chat"',
        "Least busy",
        "Exact replicas",
        "gpu-a",
        "http://gpu-a.lan:8000/v1",
        "qwen2.5-7b",
        '<td class="num">8</td>',
        "<td>stored</td>",
    ]:
        assert text in page, text
    assert PROVIDER_KEY not in page


def test_an_empty_pools_page_offers_staff_the_next_step() -> None:
    owner = Client()
    owner.force_login(make_user("owner", staff=True))

    page = owner.get("/pools/").content.decode()

    assert '<p class="empty-title">No pools yet</p>' in page
    assert "apps call it by one name, @pool/&lt;slug&gt;." in page
    assert '<a class="button primary" href="/pools/new/">Add pool</a>' in page


def test_add_pool_is_offered_to_whoever_may_create_one() -> None:
    """The wizard's rule: anyone who may change some project; a viewer may not."""
    project = Project.objects.get(pk=default_project_pk())
    owner = make_user("project-owner")
    add_member(project, owner, Role.OWNER)
    add_pool = '<a class="button primary" href="/pools/new/">Add pool</a>'

    assert add_pool in signed_in(owner).get("/pools/").content.decode()
    assert add_pool not in signed_in(default_viewer("viewer")).get("/pools/").content.decode()


def test_an_htmx_request_gets_only_the_pools_table(teammate: Client) -> None:
    make_pool("chat")

    response = teammate.get("/pools/", headers={"HX-Request": "true"})
    page = response.content.decode()

    assert page.lstrip().startswith('<section id="pools-table">')
    assert "<html" not in page
    assert "hx-swap-oob" not in page
    assert response["Vary"] == "HX-Request, Cookie"


def test_every_hx_get_keeps_a_real_link(teammate: Client) -> None:
    page = teammate.get("/pools/").content.decode()

    assert '<a class="button" href="/pools/" hx-get="/pools/"' in page


def test_the_navigation_shows_coming_pages_without_links(teammate: Client) -> None:
    page = teammate.get("/pools/").content.decode()

    assert '<a href="/pools/" aria-current="page">Pools</a>' in page
    assert '<a href="/nodes/">Nodes</a>' in page
    assert '<a href="/deployments/">Deployments</a>' in page
    assert '<a href="/serving/services/">Services</a>' in page
    assert '<a href="/chat/">Chat</a>' in page
    assert '<a href="/live/">Live</a>' in page
    assert '<a href="/history/">History</a>' in page
    for name in ["Projects"]:
        soon = f'<span class="soon" aria-disabled="true">{name} <small title="Coming soon">soon'
        assert soon in page
    assert '<form method="post" action="/logout/">' in page


def test_signing_out_is_a_post(teammate: Client) -> None:
    response = teammate.post("/logout/")

    assert response.status_code == 302
    assert teammate.get("/pools/").status_code == 302


def test_a_pool_page_shows_its_settings_and_targets(teammate: Client) -> None:
    pool = make_pool("chat", name="Chat models")
    make_target(pool, "openai", credential=PROVIDER_KEY)

    response = teammate.get("/pools/chat/")
    page = response.content.decode()

    assert response.status_code == 200
    assert "Chat models" in page
    assert "openai" in page
    assert "· key stored</small>" in page
    assert PROVIDER_KEY not in page


def test_an_unknown_pool_is_not_found(teammate: Client) -> None:
    assert teammate.get("/pools/nope/").status_code == 404


def test_the_pools_page_costs_a_fixed_number_of_queries(
    teammate: Client, django_assert_num_queries
) -> None:
    for slug in ["a", "b", "c"]:
        pool = make_pool(slug)
        make_target(pool, "x")
        make_target(pool, "y")

    # Session, user, whether they may create a pool, pools, their targets: the same for 3 pools
    # as for 300.
    with django_assert_num_queries(5):
        teammate.get("/pools/")
