#!/usr/bin/env bash
# test/conformance/apps/django.sh: Django on its own connection (psycopg2) under runserver's threaded WSGI server
# (clients/python/examples/django_app.py), the contract of test/conformance/README.md;
# the package from the checkout (PYTHONPATH) on Debian's python3.
# packages: python3-django python3-psycopg2
set -eu
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
export PYTHONPATH=$ROOT/clients/python${PYTHONPATH:+:$PYTHONPATH}
exec /usr/bin/python3 "$ROOT/clients/python/examples/django_app.py"
