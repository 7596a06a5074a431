# Ported from celery/celery examples/next-steps/proj/celery.py (BSD-3-Clause, see LICENSE-celery).
from emqtasks.celery import Celery

app = Celery('proj',
             broker='amqp://',
             backend='rpc://',
             include=['proj.tasks'])

# Optional configuration, see the application user guide.
app.conf.update(
    result_expires=3600,
)

if __name__ == '__main__':
    app.start()
