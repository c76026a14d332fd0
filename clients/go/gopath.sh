# clients/go/gopath.sh: build this module offline with Debian's Go toolchain
# and Debian's Go packages (golang-go, golang-github-*-dev, whose sources
# live in /usr/share/gocode/src).  Debian builds its own Go packages this way
# (dh-golang: GOPATH mode), and it needs no module proxy, no module cache and
# no go.sum: `import "github.com/go-chi/chi/v5"` finds /usr/share/gocode/src/
# github.com/go-chi/chi through GOPATH mode's minimal module compatibility.
#
#   . clients/go/gopath.sh DIR [CACHE]     (sourced)
#
# copies the module to DIR/gopath/src/github.com/idempotency/idempotency-go
# (a copy, not a symlink: `go test ./...` does not follow links) and exports
# GO111MODULE=off GOPROXY=off GOFLAGS= GOPATH=DIR/gopath:/usr/share/gocode
# GOCACHE=CACHE (default DIR/cache: only a cache, keyed by content), and IDEMPOTENCY_GO (the copy's path) for `cd`.
_idem_src=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_idem_dir=$1
_idem_cache=${2:-$1/cache}
mkdir -p "$_idem_dir/gopath/src/github.com/idempotency" "$_idem_cache"
IDEMPOTENCY_GO=$_idem_dir/gopath/src/github.com/idempotency/idempotency-go
rm -rf "$IDEMPOTENCY_GO.new"
cp -R "$_idem_src" "$IDEMPOTENCY_GO.new" && rm -rf "$IDEMPOTENCY_GO" && mv "$IDEMPOTENCY_GO.new" "$IDEMPOTENCY_GO"
export IDEMPOTENCY_GO GO111MODULE=off GOPROXY=off GOFLAGS= GOTOOLCHAIN=local \
	GOPATH=$_idem_dir/gopath:/usr/share/gocode GOCACHE=$_idem_cache
unset _idem_src _idem_dir _idem_cache
