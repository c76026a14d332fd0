#!/usr/bin/env bash
# test/conformance/apps/express.sh: Express 5 (clients/node/examples/express.js) on node-postgres,
# the contract of test/conformance/README.md.  Installs clients/node's
# node_modules when missing (npm ci), then execs the server.
# packages: nodejs=node npm=npm
set -eu
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
if [ ! -f "$ROOT/clients/node/node_modules/.package-lock.json" ] ||
	[ "$ROOT/clients/node/package-lock.json" -nt "$ROOT/clients/node/node_modules/.package-lock.json" ]; then
	(cd "$ROOT/clients/node" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
exec node "$ROOT/clients/node/examples/express.js"
