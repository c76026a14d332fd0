#!/usr/bin/env bash
# test/conformance/apps/go-chi.sh: the chi example of clients/go
# (clients/go/examples/chi), built offline from Debian's Go packages into
# ${CONFORMANCE_BUILD:-/tmp/idempotency-conformance-build}/go-chi, then run.
set -eu
root=$(cd "$(dirname "$0")/../../.." && pwd)
bin=$(bash "$root/clients/go/build.sh" chi "${CONFORMANCE_BUILD:-/tmp/idempotency-conformance-build}/go-chi")
exec "$bin"
