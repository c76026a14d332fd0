#!/usr/bin/env bash
# test/conformance/apps/go-nethttp.sh: the nethttp example of clients/go
# (clients/go/examples/nethttp), built offline from Debian's Go packages into
# ${CONFORMANCE_BUILD:-/tmp/idempotency-conformance-build}/go-nethttp, then run.
set -eu
root=$(cd "$(dirname "$0")/../../.." && pwd)
bin=$(bash "$root/clients/go/build.sh" nethttp "${CONFORMANCE_BUILD:-/tmp/idempotency-conformance-build}/go-nethttp")
exec "$bin"
