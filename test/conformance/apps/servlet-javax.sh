#!/usr/bin/env bash
# test/conformance/apps/servlet-javax.sh: the servlet filter (javax.servlet,
# org.idempotency.servlet.javax.IdempotencyFilter) in Debian's Jetty 9.4:
# clients/java/servlet/example (PaymentServlet, JettyMain), on the jar built
# by the Maven build (mvn -o, Debian's Maven repository), cached under
# $CONFORMANCE_BUILD/servlet-javax (servlet/example/build.sh); then execs the
# server.  `servlet-javax.sh --build` only builds.
# debian: bookworm
# packages: default-jdk-headless=javac maven=mvn junit5 libmaven-compiler-plugin-java libsurefire-java libmaven-jar-plugin-java libmaven-source-plugin-java libmaven-resources-plugin-java libpostgresql-jdbc-java libservlet-api-java libjakarta-servlet-api-java libjetty9-java libhikaricp-java
set -euo pipefail
cp=$(bash "$(dirname "$0")/../../../clients/java/servlet/example/build.sh" javax)
[ "${1:-}" = --build ] && exit 0
exec java -cp "$cp" JettyMain
