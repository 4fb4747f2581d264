"""The stateless view, the cache-aware one, and one for logged-in users, each behind its own
socket path (django_site/asgi.py)."""

from django.urls import path
from responses_app import views

urlpatterns = [
    path("v1/responses", views.create_response),
    path("cached/v1/responses", views.create_cached_response),
    path("private/v1/responses", views.create_private_response),
]
