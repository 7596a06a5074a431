from django.urls import path
from shop import views

urlpatterns = [
    path("orders", views.place_order),
    path("orders/<int:order_id>", views.order),
    path("reports", views.start_report),
    path("reports/<str:result_id>", views.report),
]
