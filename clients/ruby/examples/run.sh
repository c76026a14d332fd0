#!/usr/bin/env bash
# clients/ruby/examples/run.sh LABEL APP.rb: builds the gem offline (gem
# build), installs it into a fresh GEM_HOME under
# ${CONFORMANCE_BUILD:-/tmp/idempotency-conformance-build}/LABEL (once: again
# only when clients/ruby changed) and execs the example app with nothing of
# the checkout on Ruby's load path.  Installs Debian's Ruby packages when
# missing.  Used by test/conformance/apps/rails.sh and sinatra.sh.
set -eu
label=$1
app=$2
here=$(cd "$(dirname "$0")/.." && pwd)	# clients/ruby
build=${CONFORMANCE_BUILD:-/tmp/idempotency-conformance-build}/$label

pkgs=()
for p in ruby ruby-pg ruby-rack ruby-rails ruby-sinatra puma; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || pkgs+=("$p")
done
if [ ${#pkgs[@]} -gt 0 ]; then
	[ "$(id -u)" = 0 ] || { echo "missing Debian packages: ${pkgs[*]}" >&2; exit 2; }
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq "${pkgs[@]}" >/dev/null >&2
fi

mkdir -p "$build"
exec 9>"$build/.lock"
flock 9
stamp=$(cd "$here" && find lib examples pg_idempotency.gemspec -type f -newer "$build/.built" 2>/dev/null | head -1)
if [ ! -f "$build/.built" ] || [ -n "$stamp" ]; then
	rm -rf "$build/gems" "$build/pg_idempotency.gem" "$build/examples"
	(cd "$here" && gem build pg_idempotency.gemspec -o "$build/pg_idempotency.gem") >"$build/build.log" 2>&1 ||
		{ cat "$build/build.log" >&2; exit 2; }
	GEM_HOME="$build/gems" gem install --local --no-document "$build/pg_idempotency.gem" >>"$build/build.log" 2>&1 ||
		{ cat "$build/build.log" >&2; exit 2; }
	cp -R "$here/examples" "$build/examples"
	touch "$build/.built"
fi
flock -u 9
exec 9>&-
export GEM_HOME="$build/gems"
exec ruby "$build/examples/$app"
