"""The Django app: put ``"emqtasks.contrib.django"`` in INSTALLED_APPS."""

from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .conf import SETTING, SettingError, configure_default_app


class EmqtasksConfig(AppConfig):  # type: ignore[misc]  # Django has no types
    """Reads ``settings.EMQTASKS`` into the default App when Django starts (the web
    process, ``manage.py`` commands and ``emqtasks worker --django`` alike)."""

    name = "emqtasks.contrib.django"
    label = "emqtasks"
    verbose_name = "emqtasks"

    def ready(self) -> None:
        try:
            configure_default_app(getattr(settings, SETTING, None))
        except SettingError as exc:
            raise ImproperlyConfigured(str(exc)) from None
