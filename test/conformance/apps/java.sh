#!/usr/bin/env bash
# test/conformance/apps/java.sh: the raw JDBC helper (clients/java, Idempotency.run;
# Phases.serve for POST /transfers)
# behind a hand-written endpoint on com.sun.net.httpserver
# (clients/java/examples/PaymentServer.java), the contract of
# test/conformance/README.md.  Compiled with javac against Debian's pgjdbc into
# $CONFORMANCE_BUILD/java, again only when a source changed; then execs the server.
# packages: default-jdk-headless=javac libpostgresql-jdbc-java
set -eu
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
JDBC=/usr/share/java/postgresql.jar
OUT=${CONFORMANCE_BUILD:-/tmp/idempotency-conformance-build}/java
mapfile -t src < <(find "$ROOT/clients/java/src" "$ROOT/clients/java/examples" -name '*.java' | sort)
sum=$(cat "${src[@]}" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$OUT/.sources" 2>/dev/null)" != "$sum" ]; then
	rm -rf "$OUT" && mkdir -p "$OUT/classes"
	javac -nowarn -d "$OUT/classes" -cp "$JDBC" "${src[@]}" >&2
	echo "$sum" >"$OUT/.sources"
fi
exec java -cp "$OUT/classes:$JDBC" PaymentServer
