"""The example Django project, set up once per test process on a database of its own.

Django reads its settings once per process: every test that runs the project calls `setup()`
first, so the database is a temporary SQLite file (`DJANGO_DB_PATH`, inherited by servers run
in child processes), never a file in the repository.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

from tests.servers import ROOT

DJANGO_DIR = ROOT / "examples" / "django_project"


@functools.cache
def database_path() -> Path:
    """This process's SQLite file, set as `DJANGO_DB_PATH` (removed when the process exits)."""
    folder = Path(tempfile.mkdtemp(prefix="ws-mode-django-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "db.sqlite3"
    os.environ["DJANGO_DB_PATH"] = str(path)
    return path


@functools.cache
def setup() -> Path:
    """Set the project up in this process (settings, apps, migrated database); its database."""
    path = database_path()
    if str(DJANGO_DIR) not in sys.path:
        sys.path.insert(0, str(DJANGO_DIR))
    os.environ["DJANGO_SETTINGS_MODULE"] = "django_site.settings"
    import django
    from django.conf import settings
    from django.core.management import call_command

    django.setup()
    assert settings.DATABASES["default"]["NAME"] == str(path), "Django was set up before"
    call_command("migrate", verbosity=0, interactive=False)
    return path
