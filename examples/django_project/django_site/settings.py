"""Settings of the example project: no database, no Channels, only what the API needs."""

from __future__ import annotations

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "insecure-example-key-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",")

INSTALLED_APPS = ["responses_app"]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    # Kept on purpose: the API views are exempt (clients send no CSRF token), the rest is not.
    "django.middleware.csrf.CsrfViewMiddleware",
]

ROOT_URLCONF = "django_site.urls"
ASGI_APPLICATION = "django_site.asgi.application"

DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django": {"handlers": ["console"], "level": "WARNING"}},
}
