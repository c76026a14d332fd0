#!/usr/bin/env bash
# clients/java/maven-versions.sh: prints "-Dname=version ..." for each version
# pom.xml names, from what this Debian release's Maven repository
# (/usr/share/maven-repo) holds; pom.xml's defaults are bookworm's.  Used by
# test/packages/run, test/javaweb/run and servlet/example/build.sh:
#   mvn -o ... $(bash maven-versions.sh) package
repo=${MAVEN_REPO:-/usr/share/maven-repo}
for prop_path in pgjdbc.version:org/postgresql/postgresql \
	junit.version:org/junit/jupiter/junit-jupiter-api \
	resources.plugin.version:org/apache/maven/plugins/maven-resources-plugin \
	compiler.plugin.version:org/apache/maven/plugins/maven-compiler-plugin \
	surefire.plugin.version:org/apache/maven/plugins/maven-surefire-plugin \
	jar.plugin.version:org/apache/maven/plugins/maven-jar-plugin \
	source.plugin.version:org/apache/maven/plugins/maven-source-plugin \
	servlet.version:javax/servlet/javax.servlet-api \
	jakarta.servlet.version:jakarta/servlet/jakarta.servlet-api \
	jetty.version:org/eclipse/jetty/jetty-servlet; do
	prop=${prop_path%%:*}
	path=${prop_path#*:}
	# real versions only (not Debian's generic "debian" or "9.x")
	v=$(ls "$repo/$path" 2>/dev/null | grep -E '^[0-9]+\.[0-9]' | sort -V | tail -n 1)
	[ -n "$v" ] && printf -- '-D%s=%s ' "$prop" "$v"
done
echo
