import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from .models import Order
from .tasks import account_report, send_receipt


@csrf_exempt
def place_order(request: HttpRequest) -> JsonResponse:
    """Save an order and send its receipt once the order is committed: a worker never
    looks for an order that is not there yet (nor mails one that was rolled back)."""
    body = json.loads(request.body)
    with transaction.atomic():
        order = Order.objects.create(account=body["account"], email=body["email"],
                                     total=body["total"])
        job = send_receipt.delay_on_commit(order.pk)
    return JsonResponse({"order": order.pk, "job": job.id})


def order(request: HttpRequest, order_id: int) -> JsonResponse:
    o = Order.objects.get(pk=order_id)
    return JsonResponse({"order": o.pk, "receipt_sent": o.receipt_sent})


@csrf_exempt
def start_report(request: HttpRequest) -> JsonResponse:
    result = account_report.enqueue(account_id=json.loads(request.body)["account"])
    return JsonResponse({"result": result.id, "status": str(result.status)})


def report(request: HttpRequest, result_id: str) -> JsonResponse:
    result = account_report.get_result(result_id)
    body = {"result": result.id, "status": str(result.status)}
    if result.is_finished and not result.errors:
        body["value"] = result.return_value
    return JsonResponse(body)
