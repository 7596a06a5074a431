"""The shop's background work: found by `emqtasks worker --django` (it imports the tasks
module of every installed app)."""

import emqtasks

try:
    from django.tasks import task  # Django 6
except ImportError:
    from django_tasks import task  # the backport, Django 4.2 - 5.2

from .models import Order


@emqtasks.task
def send_receipt(order_id: int) -> str:
    """Enqueued with delay_on_commit: the order's row exists by the time this runs."""
    order = Order.objects.get(pk=order_id)
    Order.objects.filter(pk=order_id).update(receipt_sent=True)
    return f"receipt for order {order.pk} sent to {order.email}"


@task(queue_name="reports")
def account_report(account_id: str) -> dict[str, int]:
    """A django.tasks task; its group is the account (GROUP_BY in settings.TASKS)."""
    orders = Order.objects.filter(account=account_id)
    return {"orders": orders.count(), "total": sum(o.total for o in orders)}
