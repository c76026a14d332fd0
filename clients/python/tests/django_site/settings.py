"""The Django project of tests/test_django.py: the `shop` app on two aliases
of one database, "default" (no ATOMIC_REQUESTS) and "atomic"
(ATOMIC_REQUESTS = True), so the guard runs both as the transaction and as
a savepoint inside Django's.  Database from DATABASE_HOST/PORT/USER and
DJANGO_DATABASE (created by the test); IDEMPOTENCY_PORTABLE_SCRIPT, the
portable edition's script, where the server has no extension to create."""
import os

_db = {
    "ENGINE": "django.db.backends.postgresql",
    "HOST": os.environ["DATABASE_HOST"], "PORT": os.environ["DATABASE_PORT"],
    "NAME": os.environ["DJANGO_DATABASE"], "USER": os.environ["DATABASE_USER"],
}
DEBUG = False
SECRET_KEY = "test"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
ROOT_URLCONF = "django_site.shop.urls"
INSTALLED_APPS = ["django_site.shop", "rest_framework"]
MIDDLEWARE = []
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": dict(_db), "atomic": dict(_db, ATOMIC_REQUESTS=True,
                                                   TEST={"MIRROR": "default"})}
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "OPTIONS": {"loaders": [("django.template.loaders.locmem.Loader", {
        "order.txt": "order {{ order.id }} of {{ order.amount }}, created {{ order.created_at.isoformat }}",
    })]},
}]
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "loggers": {"django.server": {"level": "CRITICAL"},
                       "django.request": {"level": "CRITICAL"}}}
REST_FRAMEWORK = {"UNAUTHENTICATED_USER": None, "DEFAULT_AUTHENTICATION_CLASSES": [],
                  "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"]}
IDEMPOTENCY_PORTABLE_SCRIPT = os.environ.get("IDEMPOTENCY_PORTABLE_SCRIPT")
