#!/usr/bin/env bash
# clients/go/build.sh: build one example server offline, from Debian's Go
# toolchain and Go packages, installing them first when missing (as root).
#
#   bash clients/go/build.sh EXAMPLE DIR     EXAMPLE: nethttp, chi or gin
#
# Prints the binary's path, DIR/bin/EXAMPLE.  Built again only when a file
# under clients/go is newer than the binary (DIR is a cache: the direct and
# the PgBouncer runs of the conformance suite build once); concurrent calls
# on one DIR take turns (flock).  Go's build cache is Go's own (go env
# GOCACHE, ~/.cache/go-build: keyed by content, kept between runs, so only
# the first build on a machine compiles the standard library, the driver and
# gin: 20-30 s of CPU), or $IDEMPOTENCY_GOCACHE.
set -eu
example=$1
dir=$2
src=$(cd "$(dirname "$0")" && pwd)

# the Debian packages this module builds from
GO_PACKAGES="golang-go golang-github-lib-pq-dev golang-github-jackc-pgx-v4-dev golang-github-go-chi-chi-dev golang-github-gin-gonic-gin-dev"
missing=()
for p in $GO_PACKAGES; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "missing Debian packages: ${missing[*]} (run as root to install them)" >&2
		exit 1
	fi
	echo "# installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	{ apt-get install -y -qq "${missing[@]}" || { apt-get update -qq && apt-get install -y -qq "${missing[@]}"; }; } >/dev/null
fi

mkdir -p "$dir/bin"
exec 9>"$dir/.lock"
flock 9
bin=$dir/bin/$example
if [ ! -x "$bin" ] || [ -n "$(find "$src" -newer "$bin" -print -quit)" ]; then
	cache=${IDEMPOTENCY_GOCACHE:-$(go env GOCACHE 2>/dev/null || true)}
	[ -n "$cache" ] && [ "$cache" != off ] || cache=$dir/cache
	. "$src/gopath.sh" "$dir" "$cache"
	(cd "$IDEMPOTENCY_GO" && go build -o "$bin.tmp" "./examples/$example") >&2
	mv "$bin.tmp" "$bin"
fi
echo "$bin"
