from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from . import views

urlpatterns = [
    path("orders", views.orders),
    path("orders-atomic", views.orders_atomic),
    path("orders-429", views.orders_store_429),
    path("orders-optional", views.orders_optional),
    path("orders-template", views.orders_template),
    path("orders-class", views.OrderView.as_view()),
    path("orders-method", csrf_exempt(views.OrderMethodView.as_view())),
    path("orders-drf", views.orders_drf),
    path("orders-drf-wrong", views.orders_drf_wrong),
]
