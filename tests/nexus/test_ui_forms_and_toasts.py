"""Forms render with the kit (errors beside their fields, values kept, secrets never echoed) and
completed actions say so in a toast, from a full page or an htmx response."""

from __future__ import annotations

import json

import pytest
from django.contrib import messages
from django.contrib.messages.storage import default_storage
from django.contrib.sessions.backends.db import SessionStore
from django.http import HttpRequest, HttpResponse
from django.test import Client, RequestFactory
from django_htmx.middleware import HtmxDetails

from nexus.ui.middleware import HtmxMessagesMiddleware
from tests.nexus.factories import make_user

pytestmark = pytest.mark.django_db

KIT = "/ui/kit/"


@pytest.fixture
def owner() -> Client:
    client = Client()
    client.force_login(make_user("owner", staff=True))
    return client


def test_a_refused_form_shows_each_error_beside_its_field_and_keeps_the_values(
    owner: Client,
) -> None:
    response = owner.post(KIT, {"name": "taken", "replicas": "99", "api_key": "sk-typed-secret"})

    page = response.content.decode()
    assert response.status_code == 400
    assert (
        '<input type="text" name="name" value="taken" maxlength="64" required aria-invalid="true" '
        'aria-describedby="id_name_helptext id_name_error" id="id_name">\n  '
        '<ul class="errorlist" id="id_name_error"><li>A pool named taken exists.</li></ul>'
    ) in page
    assert 'name="replicas" value="99"' in page
    assert "Ensure this value is less than or equal to 64." in page
    assert "sk-typed-secret" not in page
    assert "Type it again: a secret is never sent back to the page." in page


def test_a_saved_form_redirects_and_its_toast_shows_on_the_next_page(owner: Client) -> None:
    response = owner.post(
        KIT, {"name": "chat", "replicas": "2", "strategy": "smart", "api_key": "sk-x"}
    )

    assert (response.status_code, response["Location"]) == (302, KIT)
    page = owner.get(KIT).content.decode()
    assert (
        '<div class="toast" data-level="success">\n        '
        '<span class="toast-text">Saved the sample chat (nothing stored).</span>'
    ) in page
    assert "Saved the sample chat" not in owner.get(KIT).content.decode()  # shown once


def test_the_style_guide_is_for_staff_only() -> None:
    teammate = Client()
    teammate.force_login(make_user("teammate"))

    assert teammate.get(KIT).status_code == 403
    assert Client().get(KIT).status_code == 302


def htmx_request(method: str = "post", **headers: str) -> HttpRequest:
    request = getattr(RequestFactory(), method)("/x/", headers={"HX-Request": "true", **headers})
    request.session = SessionStore()
    request._messages = default_storage(request)  # type: ignore[attr-defined]
    request.htmx = HtmxDetails(request)  # type: ignore[attr-defined]
    return request


def view_that_says(text: str, *, status: int = 200, trigger: str = "") -> object:
    def view(request: HttpRequest) -> HttpResponse:
        messages.success(request, text)
        response = HttpResponse(status=status)
        if trigger:
            response["HX-Trigger"] = trigger
        return response

    return view


def test_an_htmx_responses_messages_leave_as_toast_events() -> None:
    middleware = HtmxMessagesMiddleware(view_that_says("Drained fast."))  # type: ignore[arg-type]

    response = middleware(htmx_request())

    assert json.loads(response["HX-Trigger"]) == {
        "nexus:toasts": {
            "target": "body",
            "toasts": [{"text": "Drained fast.", "level": "success"}],
        }
    }


@pytest.mark.parametrize(
    ("header", "kept"),
    [
        ('{"pool-saved": {"slug": "chat"}}', {"pool-saved": {"slug": "chat"}}),
        ("pool-saved, refresh", {"pool-saved": None, "refresh": None}),
    ],
)
def test_events_a_view_triggers_itself_are_kept_beside_the_toasts(
    header: str, kept: dict[str, object]
) -> None:
    view = view_that_says("Saved.", trigger=header)
    middleware = HtmxMessagesMiddleware(view)  # type: ignore[arg-type]

    response = middleware(htmx_request())

    assert json.loads(response["HX-Trigger"]) == {
        **kept,
        "nexus:toasts": {"target": "body", "toasts": [{"text": "Saved.", "level": "success"}]},
    }


def test_a_redirect_or_a_full_page_keeps_its_messages_for_the_page() -> None:
    redirect = HtmxMessagesMiddleware(view_that_says("Moved.", status=302))  # type: ignore[arg-type]
    request = htmx_request()

    response = redirect(request)

    assert "HX-Trigger" not in response
    assert [str(m) for m in messages.get_messages(request)] == ["Moved."]
