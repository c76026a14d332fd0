#!/usr/bin/env bash
# The servlet filter (javax.servlet) in Debian's Jetty 9.4: clients/java/
# examples/servlet (PaymentServlet, JettyMain), the jar built by Maven.
# `servlet-javax.sh --build` builds (cached) without starting the app.
set -euo pipefail
cp=$(bash "$(dirname "$0")/../../../clients/java/examples/servlet/build.sh" javax)
[ "${1:-}" = --build ] && exit 0
exec java -cp "$cp" JettyMain
