# Ported from celery/celery examples/next-steps/proj/tasks.py (BSD-3-Clause, see LICENSE-celery).
from .celery import app


@app.task
def add(x, y):
    return x + y


@app.task
def mul(x, y):
    return x * y


@app.task
def xsum(numbers):
    return sum(numbers)
