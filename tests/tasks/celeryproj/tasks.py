"""The project's tasks, written against Celery's API (only the import line changed)."""

from typing import Any

from emqtasks.celery import Reject, Task, shared_task

from .celery import app


def _note(task: Any, key: str, value: Any) -> None:
    """Record what happened, on the worker's own server (the tests read it)."""
    task.app.client.rpush(f"celeryproj:{key}", str(value))


@shared_task
def add(x: int, y: int) -> int:
    return x + y


@app.task(bind=True)
def flaky(self: Task, tag: str, until: int) -> int:
    n = int(self.app.client.incr(f"celeryproj:tries:{tag}"))
    if n < until:
        raise self.retry(countdown=0.05)
    return self.request.retries


@shared_task(bind=True)
def fails(self: Task, tag: str) -> None:
    self.app.client.incr(f"celeryproj:tries:{tag}")
    raise ValueError(f"no automatic retry for {tag}")


@shared_task(bind=True)
def retries_forever(self: Task, tag: str) -> None:
    self.app.client.incr(f"celeryproj:tries:{tag}")
    raise self.retry(countdown=0.05)


class Recording(Task):
    """A Celery base class: options as class attributes, and the handlers."""

    autoretry_for = (KeyError,)
    retry_kwargs = {"max_retries": 1, "countdown": 0.05}

    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        _note(self, task_id, f"success {retval} {args}")

    def on_retry(self, exc: BaseException, task_id: str, args: Any, kwargs: Any,
                 einfo: Any) -> None:
        _note(self, task_id, f"retry {type(exc).__name__}")

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any,
                   einfo: Any) -> None:
        _note(self, task_id, f"failure {type(exc).__name__} {exc} "
                             f"{'Traceback' in einfo.traceback}")

    def after_return(self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any,
                     einfo: Any) -> None:
        _note(self, task_id, f"after {status}")


@app.task(base=Recording)
def recorded(what: str) -> str:
    if what == "key":
        raise KeyError(what)
    return what.upper()


@shared_task(bind=True, autoretry_for=(Exception,))
def rejects(self: Task, requeue: bool) -> int:
    if self.request.retries == 0:
        raise Reject("not now", requeue=requeue)
    return self.request.retries


@shared_task
def routed(x: int) -> int:
    return x * 10


@shared_task
def tick(label: str) -> None:
    app.client.rpush(f"celeryproj:ticks:{label}", "1")


class ContextTask(Task):
    """Flask's pattern: __call__ wraps each run (in an app context there)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return ["in context", super().__call__(*args, **kwargs)]


@app.task(bind=True, base=ContextTask)
def in_context(self: ContextTask, x: int) -> list[Any]:
    return [type(self).__name__, self.run.__name__, x]
