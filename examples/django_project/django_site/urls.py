"""Two routes: the stateless view, and the cache-aware one behind its own socket path."""

from django.urls import path
from responses_app import views

urlpatterns = [
    path("v1/responses", views.create_response),
    path("cached/v1/responses", views.create_cached_response),
]
