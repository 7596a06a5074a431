"""Django-style settings: the Celery ones under the CELERY_ namespace."""

import os

DEBUG = True
INSTALLED_APPS = ["celeryproj"]
CELERY_BROKER_URL = os.environ.get("EMQ_REDIS_URL", "redis://127.0.0.1:6399/0")
CELERY_RESULT_BACKEND = CELERY_BROKER_URL
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_TIMEZONE = "Europe/Paris"
CELERY_TASK_DEFAULT_RETRY_DELAY = 0.05
CELERY_TASK_ROUTES = {"celeryproj.tasks.routed": {"queue": "celeryproj-routed"},
                      "celeryproj.reports.*": "celeryproj-reports"}
CELERY_TASK_SOFT_TIME_LIMIT = 30
CELERY_TASK_TIME_LIMIT = 60
