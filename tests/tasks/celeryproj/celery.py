import os

from emqtasks.celery import Celery, crontab

app = Celery("celeryproj")
app.config_from_object("celeryproj.settings", namespace="CELERY")
app.autodiscover_tasks(["celeryproj"])

# What the tests switch on in a worker's environment
_beat = os.environ.get("CELERYPROJ_BEAT")
if _beat == "fire":
    app.conf.beat_schedule = {
        "tick every second": {"task": "celeryproj.tasks.tick", "schedule": 1.0,
                              "args": ["beat"]},
        "nightly report": {"task": "celeryproj.tasks.tick",
                           "schedule": crontab(minute=30, hour=3, day_of_week="mon-fri"),
                           "args": ["nightly"], "options": {"queue": "celeryproj-reports"}},
    }
elif _beat == "unknown":
    app.conf.beat_schedule = {"typo": {"task": "celeryproj.tasks.no_such_task",
                                       "schedule": 10.0}}
elif _beat == "badcron":
    app.conf.beat_schedule = {"bad": {"task": "celeryproj.tasks.tick",
                                      "schedule": crontab(minute="*", hour=24)}}
elif _beat == "periodic":
    # Celery's periodic-tasks example: entries added by a receiver of on_after_configure
    @app.on_after_configure.connect
    def setup_periodic_tasks(sender: Celery, **kwargs: object) -> None:
        from .tasks import tick

        sender.add_periodic_task(1.0, tick.s("added"), name="tick added every second")
        sender.add_periodic_task(crontab(hour=7, minute=30, day_of_week=1),
                                 tick.s("Happy Mondays!"))
if os.environ.get("CELERYPROJ_EAGER"):
    app.conf.task_always_eager = True
