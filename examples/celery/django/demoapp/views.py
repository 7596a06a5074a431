# Ported from celery/celery examples/django/demoapp/views.py (BSD-3-Clause, see LICENSE-celery).
# Create your views here.
