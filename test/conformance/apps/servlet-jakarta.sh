#!/usr/bin/env bash
# test/conformance/apps/servlet-jakarta.sh: the servlet filter
# (jakarta.servlet, org.idempotency.servlet.jakarta.IdempotencyFilter) in
# Debian's embedded Tomcat 10.1: clients/java/servlet/example
# (PaymentServlet turned jakarta by a sed over the package names,
# TomcatMain), on the jar built by the Maven build, cached under
# $CONFORMANCE_BUILD/servlet-jakarta (servlet/example/build.sh); then execs
# the server.  `servlet-jakarta.sh --build` only builds.
# debian: bookworm
# packages: default-jdk-headless=javac maven=mvn junit5 libmaven-compiler-plugin-java libsurefire-java libmaven-jar-plugin-java libmaven-source-plugin-java libmaven-resources-plugin-java libpostgresql-jdbc-java libservlet-api-java libjakarta-servlet-api-java libjetty9-java libtomcat10-embed-java libjakarta-annotation-api-java libhikaricp-java
set -euo pipefail
cp=$(bash "$(dirname "$0")/../../../clients/java/servlet/example/build.sh" jakarta)
[ "${1:-}" = --build ] && exit 0
exec java -cp "$cp" TomcatMain
