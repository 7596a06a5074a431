"""Settings of the example site: emqtasks through its Django app and a django.tasks backend.

The MYSITE_* environment variables only let the test suite point the site at its own
server, database and queues; a real site writes its values here (and an operator can
still override the server with EMQ_REDIS_URL, which wins over EMQTASKS).
"""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "mysite.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "emqtasks.contrib.django",   # reads EMQTASKS below; `emqtasks worker --django` needs it
    "shop",
]
try:
    import django.tasks  # noqa: F401  (Django 6: the tasks framework is built in)
except ImportError:
    INSTALLED_APPS.append("django_tasks")   # Django 4.2 - 5.2: the django-tasks backport

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("MYSITE_DB", str(BASE_DIR / "db.sqlite3")),
    }
}

# The default App: what module-level @emqtasks.task functions enqueue on (every App option
# by its upper-case name: REDIS_URL, QUEUE, MAX_PAYLOAD_BYTES, MAX_RESULT_BYTES).
EMQTASKS = {
    "REDIS_URL": os.environ.get("MYSITE_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "QUEUE": os.environ.get("MYSITE_QUEUE", "mysite"),
}

# Django's own task API (django.tasks), run by the same emqtasks workers. A Django queue
# is the emqtasks queue QUEUE_PREFIX + its name; each call's group (its fair-share lane)
# is its `account_id` keyword argument.
TASKS = {
    "default": {
        "BACKEND": "emqtasks.contrib.django.TaskBackend",
        "QUEUES": ["default", "reports"],
        "OPTIONS": {
            "QUEUE_PREFIX": os.environ.get("MYSITE_QUEUE_PREFIX", "mysite-"),
            "GROUP_BY": "account_id",
        },
    }
}
