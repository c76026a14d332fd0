#!/usr/bin/env bash
# test/conformance/apps/gin.sh: the gin example of clients/go
# (clients/go/examples/gin), built offline from Debian's Go packages into
# ${CONFORMANCE_BUILD:-/tmp/idempotency-conformance-build}/gin, then run.
set -eu
root=$(cd "$(dirname "$0")/../../.." && pwd)
bin=$(bash "$root/clients/go/build.sh" gin "${CONFORMANCE_BUILD:-/tmp/idempotency-conformance-build}/gin")
exec "$bin"
