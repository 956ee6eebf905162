"""Root URLs: pages, the admin API and its schema, the Django admin, health, metrics."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from nexus import views
from pools.views import metrics_view

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("pools/", include("pools.urls")),
    path("nodes/", include("nodes.urls")),
    path("deployments/", include("deployments.urls")),
    path("serving/", include("serving.urls")),
    path("store/", include("serving.store_urls")),
    path("chat/", include("serving.chat_urls")),
    path("tokens/", include("pools.token_urls")),
    path("history/", include("pools.history_urls")),
    path("live/", include("pools.live_urls")),
    path("ui/", include("nexus.ui.urls")),
    path("api/v1/", include("nexus.api.urls")),
    path("api/v1/", include("pools.api.urls")),
    path("api/v1/", include("nodes.api.urls")),
    path("api/v1/", include("deployments.api.urls")),
    path("api/v1/", include("serving.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("admin/", admin.site.urls),
]
