"""The model store's pages, mounted under /store/: the card gallery, a card's drawer, deploying."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from nexus.auth import acting_user
from nexus.pages import HtmxHttpRequest, render_page_or_fragment, require_staff
from nexus.ui import markdown
from serving import services, store
from serving.forms import StoreDeployForm
from serving.launch import LaunchError
from serving.models import Service

STORE = "serving/store.html"
STORE_CARDS = f"{STORE}#store-cards"
CARD = "serving/store_card.html"
CARD_DETAIL = f"{CARD}#card-detail"
DEPLOY = "serving/store_deploy.html"
DEPLOY_WAIT = f"{CARD}#deploy-wait"
SECTION = "store"


def project_or_404() -> Any:
    project = store.store_project()
    if project is None:
        raise Http404("The model store project was not found.")
    return project


def card_or_404(name: str) -> store.StoreCard:
    card = store.store_card(project_or_404(), name)
    if card is None:
        raise Http404(f"The model store has no model {name!r}.")
    return card


def _choice(value: str | None, allowed: Any, default: Any) -> Any:
    return value if value in allowed else default


@require_GET
@login_required
def store_list(request: HtmxHttpRequest) -> HttpResponse:
    """Render the card gallery, or only its cards for an htmx request (search, sort, pages)."""
    project = store.store_project()
    search = request.GET.get("q", "")
    sort = _choice(request.GET.get("sort"), store.SORTS, store.DEFAULT_SORT)
    per_page = int(_choice(request.GET.get("per_page"), {str(n) for n in store.PAGE_SIZES}, "10"))
    page = None
    if project is not None:
        cards = store.store_cards(project, search=search, sort=sort)
        page = Paginator(cards, per_page).get_page(request.GET.get("page"))
    context = {
        "section": SECTION,
        "project": project,
        "project_name": settings.NEXUS_MODEL_STORE_PROJECT,
        "page": page,
        "search": search,
        "sort": sort,
        "sorts": store.SORTS,
        "per_page": per_page,
        "page_sizes": store.PAGE_SIZES,
    }
    return render_page_or_fragment(request, STORE, STORE_CARDS, context)


def card_context(request: HtmxHttpRequest, card: store.StoreCard) -> dict[str, Any]:
    groups = list(store.resource_groups())
    source = store.readme(card.folder)
    return {
        "section": SECTION,
        "card": card,
        "readme": markdown.render(source) if source is not None else None,
        "one_click": store.one_click(card, groups),
        "groups": groups,
        "form": StoreDeployForm(card=card, groups=store.resource_groups()),
        "can_deploy": request.user.is_staff and not card.blocked,
    }


@require_GET
@login_required
def store_card(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Render a card's detail: the drawer's body for htmx, a page of its own otherwise."""
    card = card_or_404(name)
    return render_page_or_fragment(request, CARD, CARD_DETAIL, card_context(request, card))


@require_http_methods(["GET", "POST"])
@login_required
def store_deploy(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Ask for a preset and a resource group (GET); deploy the card as a service (POST).

    A one-click deploy from the drawer (htmx) answers with a fragment that waits for the
    endpoint to answer, then goes to it; the modal's form goes there at once with a toast.
    """
    card = card_or_404(name)
    require_staff(request, "deploy models")
    groups = store.resource_groups()
    form = StoreDeployForm(request.POST or None, card=card, groups=groups)
    if request.method == "POST" and not card.blocked and form.is_valid():
        try:
            service = store.deploy(
                card,
                form.chosen_option(),
                form.cleaned_data["resource_group"],
                owner=acting_user(request),
            )
        except LaunchError as refused:
            form.add_error(None, str(refused))
        else:
            if request.htmx:
                return render(request, DEPLOY_WAIT, {"service": service, "card": card})
            messages.success(request, f"Deployed {card.title} as {service.name}.")
            return redirect("serving:service_detail", name=service.name)
    if card.blocked:
        form.add_error(None, card.blocked)
    return render(request, DEPLOY, {"section": SECTION, "card": card, "form": form})


@require_GET
@login_required
def store_deploy_wait(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Say whether a just-deployed service answers yet; once it does, send the page to it."""
    service = Service.objects.filter(name=name).order_by("-pk").first()
    if service is None:
        raise Http404(f"No service named {name!r}.")
    require_staff(request, "deploy models")
    if services.ready_replicas(service):
        response = HttpResponse()
        response["HX-Redirect"] = reverse("serving:service_detail", args=[service.name])
        return response
    return render(request, DEPLOY_WAIT, {"service": service})
