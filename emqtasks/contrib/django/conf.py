"""``settings.EMQTASKS``: the default App's options by their upper-case names.

``EMQTASKS = {"REDIS_URL": ..., "QUEUE": ..., "MAX_PAYLOAD_BYTES": ..., ...}`` configures
``emqtasks.default_app`` (the App module-level ``@emqtasks.task`` registers on) when Django
loads the app. The ``EMQ_*`` environment variables still win, as everywhere else: an
operator can point a deployed site at another server without editing its settings.
Every fault is one line that names the setting.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

import redis

from ...config import Settings
from ...errors import EmqError
from ...ops.embedded import is_embedded
from ...producer.app import App, default_app
from ...store.cluster import is_cluster_url, parse_url

SETTING = "EMQTASKS"
#: The App options, each by its upper-case name (App.__init__'s parameters: a new option of
#: App is a setting at once).
OPTIONS = tuple(p.upper() for p in inspect.signature(App.__init__).parameters if p != "self")
#: The options an environment variable overrides (Settings.from_env reads them).
ENVIRONMENT = {"REDIS_URL": "EMQ_REDIS_URL", "QUEUE": "EMQ_QUEUE"}


#: redis-py's URL parser (untyped): raises ValueError for a URL it cannot open.
_parse_url: Callable[[str], Any] = redis.connection.parse_url


class SettingError(EmqError):
    """A value of a Django setting emqtasks reads; the message names the setting."""


def where(key: str, setting: str = SETTING) -> str:
    return f"settings.{setting}[{key!r}]"


def check_url(url: object, name: str) -> str:
    """A Redis URL emqtasks can open, checked without connecting; SettingError naming
    ``name`` otherwise."""
    if not isinstance(url, str) or not url:
        raise SettingError(f"{name} must be a Redis URL (redis://host:port/db), not {url!r}")
    try:
        if is_cluster_url(url):
            parse_url(url)
        elif not is_embedded(url):
            _parse_url(url)
    except (ValueError, EmqError) as exc:
        raise SettingError(f"{name}: {exc}") from None
    return url


def app_options(value: object, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The App options ``settings.EMQTASKS`` gives (lower-case keys), each checked, less
    those an ``EMQ_*`` environment variable sets. SettingError names a bad one."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SettingError(f"settings.{SETTING} must be a dict of "
                           f"{', '.join(OPTIONS)}, not {type(value).__name__}")
    env = os.environ if environ is None else environ
    options: dict[str, Any] = {}
    for key, item in value.items():
        if key not in OPTIONS:
            raise SettingError(f"{where(key)} is not an option: one of {', '.join(OPTIONS)}")
        if key == "REDIS_URL":
            check_url(item, where(key))
        try:   # each on its own, so the message names the one that is wrong
            Settings.from_env({}, **{key.lower(): item})
        except (EmqError, TypeError) as exc:
            raise SettingError(f"{where(key)}: {exc}") from None
        if not env.get(ENVIRONMENT.get(key, "")):
            options[key.lower()] = item
    return options


def configure_default_app(value: object, environ: Mapping[str, str] | None = None) -> None:
    """Apply ``settings.EMQTASKS`` to the default App (AppConfig.ready)."""
    options = app_options(value, environ)
    if options:
        default_app.configure(**options)
