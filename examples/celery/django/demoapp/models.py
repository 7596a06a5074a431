# Ported from celery/celery examples/django/demoapp/models.py (BSD-3-Clause, see LICENSE-celery).
from django.db import models


class Widget(models.Model):
    name = models.CharField(max_length=140)
