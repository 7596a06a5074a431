#!/usr/bin/env python
"""A Django site whose background work runs on emqtasks (see README.md beside this file).

    python manage.py migrate
    python manage.py runserver                       # the web process
    DJANGO_SETTINGS_MODULE=mysite.settings emqtasks worker --django -c 4   # the worker
"""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
