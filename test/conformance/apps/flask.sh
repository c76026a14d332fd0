#!/usr/bin/env bash
# test/conformance/apps/flask.sh: Flask on psycopg 3 under werkzeug's threaded server
# (clients/python/examples/flask_app.py), the contract of test/conformance/README.md;
# the package from the checkout (PYTHONPATH) on Debian's python3.
# packages: python3-flask python3-psycopg python3-psycopg-pool
set -eu
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
export PYTHONPATH=$ROOT/clients/python${PYTHONPATH:+:$PYTHONPATH}
exec /usr/bin/python3 "$ROOT/clients/python/examples/flask_app.py"
