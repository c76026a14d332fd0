#!/usr/bin/env bash
# clients/java/servlet/example/build.sh javax|jakarta: builds the servlet
# example app, offline, from Debian's packages, and prints its classpath.
#   - the jar, by the Maven build (mvn -o, Debian's Maven repository) from a
#     copy of clients/java: both IdempotencyFilters and the JDBC helper;
#   - PaymentServlet and TransferServlet with JettyMain (javax: Debian's Jetty 9.4,
#     libjetty9-java) or, turned into jakarta.servlet by a sed over the
#     package names, with TomcatMain (jakarta: Debian's embedded Tomcat 10.1,
#     libtomcat10-embed-java, libjakarta-annotation-api-java); HikariCP
#     (libhikaricp-java) as the pool.
# Cached under ${CONFORMANCE_BUILD:-/tmp/idempotency-conformance-build}/
# servlet-FLAVOR, rebuilt when a source changes; Maven's output goes to stderr.
set -euo pipefail
flavor=${1:?javax or jakarta}
java=$(cd "$(dirname "$0")/../.." && pwd)	# clients/java
out=${CONFORMANCE_BUILD:-/tmp/idempotency-conformance-build}/servlet-$flavor
J=/usr/share/java
case $flavor in
javax) deps="$J/servlet-api.jar"; for m in server servlet http io util security; do deps+=":$J/jetty9-$m.jar"; done; main=JettyMain ;;
jakarta) deps="$J/tomcat10-embed-core.jar:$J/jakarta-annotation-api.jar"; main=TomcatMain ;;
*) echo "build.sh: javax or jakarta, not $flavor" >&2; exit 2 ;;
esac
deps+=":$J/HikariCP.jar:$J/slf4j-api.jar:$J/postgresql.jar"
for f in ${deps//:/ }; do [ -f "$f" ] || { echo "build.sh: $f is missing (Debian packages: see test/javaweb/run)" >&2; exit 2; }; done

mkdir -p "$out"
exec 9>"$out/lock"
flock 9
stamp=$(cd "$java" && cat pom.xml debian-settings.xml maven-versions.sh $(find src servlet -type f | sort) | sha256sum | cut -c1-64)
if [ "$(cat "$out/stamp" 2>/dev/null)" != "$stamp" ]; then
	rm -rf "$out/mvn" "$out/src" "$out/classes"
	mkdir -p "$out/mvn" "$out/src" "$out/classes"
	cp -R "$java/pom.xml" "$java/debian-settings.xml" "$java/src" "$java/servlet" "$out/mvn/"
	(cd "$out/mvn" && mvn -B -q -o -Daether.offline.protocols=file -s debian-settings.xml \
		-Dstyle.color=never -DskipTests -Dmaven.source.skip=true $(bash "$java/maven-versions.sh") package) >&2
	for servlet in PaymentServlet TransferServlet; do
		if [ "$flavor" = javax ]; then
			cp "$java/servlet/example/$servlet.java" "$out/src/"
		else
			sed -e 's/javax\.servlet/jakarta.servlet/g' -e 's/servlet\.javax/servlet.jakarta/g' \
				"$java/servlet/example/$servlet.java" >"$out/src/$servlet.java"
		fi
	done
	cp "$java/servlet/example/$main.java" "$out/src/"
	javac -Xlint:all -Werror -d "$out/classes" -cp "$out/mvn/build/idempotency-jdbc-0.6.0.jar:$deps" \
		"$out/src/PaymentServlet.java" "$out/src/TransferServlet.java" "$out/src/$main.java" >&2
	echo "$stamp" >"$out/stamp"
fi
echo "$out/classes:$out/mvn/build/idempotency-jdbc-0.6.0.jar:$deps"
