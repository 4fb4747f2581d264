"""Settings of the example project: no Channels, only what the API needs.

Django's own authentication (users, sessions) is installed for the private socket path, whose
`authenticate` hook looks the handshake's session up in the database (`responses_app/auth.py`).
The database is SQLite, at `DJANGO_DB_PATH` (default: `db.sqlite3` here); create it with
`python manage.py migrate`. The public paths never touch it.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "insecure-example-key-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",")

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "responses_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    # Kept on purpose: the API views are exempt (clients send no CSRF token), the rest is not.
    "django.middleware.csrf.CsrfViewMiddleware",
    # Inside ws_mode, so socket turns get `request.user` from the handshake's session cookie.
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]

ROOT_URLCONF = "django_site.urls"
ASGI_APPLICATION = "django_site.asgi.application"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DJANGO_DB_PATH", str(BASE_DIR / "db.sqlite3")),
    }
}
USE_TZ = True
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django": {"handlers": ["console"], "level": "WARNING"}},
}
