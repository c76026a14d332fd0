#!/usr/bin/env bash
# test/conformance/apps/go-chi.sh: the chi example of clients/go
# (clients/go/examples/chi), built offline from Debian's Go packages into
# ${CONFORMANCE_BUILD:-/tmp/idempotency-conformance-build}/go-chi, then run.
# With --build it only builds (a cold build of Go's standard library, the
# driver and the framework takes 20-30 s of CPU: longer than a harness may
# wait for "listening").
# debian: bookworm
# packages: golang-go golang-github-lib-pq-dev golang-github-jackc-pgx-v4-dev golang-github-go-chi-chi-dev golang-github-gin-gonic-gin-dev
set -eu
root=$(cd "$(dirname "$0")/../../.." && pwd)
bin=$(bash "$root/clients/go/build.sh" chi "${CONFORMANCE_BUILD:-/tmp/idempotency-conformance-build}/go-chi")
[ "${1:-}" = --build ] && exit 0
exec "$bin"
