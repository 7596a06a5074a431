"""A Celery-style project (proj/celery.py + proj/tasks.py) ported to emqtasks.celery by its
import lines only: ``emqtasks worker -A celeryproj`` finds celeryproj.celery's app, as
``celery -A proj worker`` does (tests/test_celery_compat.py)."""
