"""The model store's pages, mounted under /store/."""

from __future__ import annotations

from django.urls import path

from serving import store_views

app_name = "store"
urlpatterns = [
    path("", store_views.store_list, name="list"),
    path("<str:name>/", store_views.store_card, name="card"),
    path("<str:name>/deploy/", store_views.store_deploy, name="deploy"),
    # A service's name, not a card's: the wait is for the endpoint just deployed ("-" starts
    # no folder name).
    path("-/deploying/<slug:name>/", store_views.store_deploy_wait, name="deploy_wait"),
]
