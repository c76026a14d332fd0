#!/usr/bin/env bash
# The servlet filter (jakarta.servlet) in Debian's embedded Tomcat 10.1:
# clients/java/examples/servlet (PaymentServlet turned jakarta by a sed,
# TomcatMain), the jar built by Maven.
# `servlet-jakarta.sh --build` builds (cached) without starting the app.
set -euo pipefail
cp=$(bash "$(dirname "$0")/../../../clients/java/examples/servlet/build.sh" jakarta)
[ "${1:-}" = --build ] && exit 0
exec java -cp "$cp" TomcatMain
