#!/usr/bin/env bash
# clients/go/tests/fresh_app.sh DIR: the module as a user gets it.  Packs
# clients/go (without its examples and tests) into DIR/idempotency-go.tar.gz,
# installs it into a fresh GOPATH (DIR/gopath, beside Debian's
# /usr/share/gocode), builds a new application there offline (chi, gin, a
# phased endpoint and Once in one server), runs it against
# DATABASE_HOST/PORT/NAME/USER and sends a guarded request twice: 201, then
# its replay.  Prints "fresh app ok".
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
dir=$1
rm -rf "$dir" && mkdir -p "$dir"
tar -C "$src" --exclude=./examples --exclude=./tests --exclude='*_test.go' -czf "$dir/idempotency-go.tar.gz" .
lib=$dir/gopath/src/github.com/idempotency/idempotency-go
mkdir -p "$lib" "$dir/gopath/src/example.com/shop"
tar -C "$lib" -xzf "$dir/idempotency-go.tar.gz"
# a go.mod, as every application has: in GOPATH mode it is what lets
# "github.com/go-chi/chi/v5" resolve to Debian's github.com/go-chi/chi
# (minimal module compatibility applies to code under a go.mod)
printf 'module example.com/shop\n\ngo 1.19\n' >"$dir/gopath/src/example.com/shop/go.mod"
cat >"$dir/gopath/src/example.com/shop/main.go" <<'GO'
package main

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"os"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	idempotency "github.com/idempotency/idempotency-go"
	"github.com/idempotency/idempotency-go/ginidempotency"
	_ "github.com/lib/pq"
)

func main() {
	db, err := sql.Open("postgres", os.Getenv("DSN"))
	if err != nil {
		panic(err)
	}
	_, err = db.Exec("CREATE TABLE IF NOT EXISTS shop_order (id bigserial PRIMARY KEY, idem_key text)")
	if err != nil {
		panic(err)
	}
	g := gin.New()
	g.POST("/gin", ginidempotency.Middleware(db, idempotency.WithScope("gin")), func(c *gin.Context) {
		var id int64
		ginidempotency.Tx(c).QueryRow("INSERT INTO shop_order (idem_key) VALUES ($1) RETURNING id", ginidempotency.Info(c).Key).Scan(&id)
		c.JSON(201, gin.H{"id": id})
	})
	r := chi.NewRouter()
	r.With(idempotency.Middleware(db, idempotency.WithScope("chi"))).Post("/chi", func(w http.ResponseWriter, r *http.Request) {
		var id int64
		idempotency.Tx(r.Context()).QueryRow("INSERT INTO shop_order (idem_key) VALUES ($1) RETURNING id", idempotency.FromContext(r.Context()).Key).Scan(&id)
		w.WriteHeader(201)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})
	r.Post("/once", func(w http.ResponseWriter, r *http.Request) {
		res, err := idempotency.Once(context.Background(), db, r.Header.Get("Idempotency-Key"), nil,
			"INSERT INTO shop_order (idem_key) VALUES ($1) RETURNING id", r.Header.Get("Idempotency-Key"))
		if err != nil {
			http.Error(w, err.Error(), idempotency.HTTPStatus(err))
			return
		}
		w.WriteHeader(201)
		fmt.Fprintf(w, "%s %s", res.Outcome, res.Response)
	})
	r.Handle("/gin", g)
	r.Method("POST", "/phases", idempotency.PhasesHandler(db, []idempotency.Phase{
		{Name: "order", Run: func(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
			var id int64
			err := p.Tx.QueryRowContext(ctx, "INSERT INTO shop_order (idem_key) VALUES ($1) RETURNING id", p.Key).Scan(&id)
			return id, err
		}},
		{Name: "ship", External: true, Run: func(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
			return p.DeriveKey(ctx, "ship")
		}},
	}, func(w http.ResponseWriter, r *http.Request, state idempotency.State) {
		w.WriteHeader(201)
		fmt.Fprintf(w, `{"id":%s,"ship":%s"}`, state["order"], state["ship"][:5])
	}, idempotency.WithScope("phases")))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Printf("listening %d\n", l.Addr().(*net.TCPAddr).Port)
	panic(http.Serve(l, r))
}
GO
export GO111MODULE=off GOPROXY=off GOFLAGS= GOTOOLCHAIN=local GOPATH=$dir/gopath:/usr/share/gocode \
	GOCACHE=${IDEMPOTENCY_GOCACHE:-$dir/cache}
(cd "$dir/gopath/src/example.com/shop" && go build -o "$dir/shop" .)
echo "built $dir/shop from $(basename "$dir/idempotency-go.tar.gz") ($(tar -tzf "$dir/idempotency-go.tar.gz" | grep -c '\.go$') Go files)"

export DSN="host=$DATABASE_HOST port=$DATABASE_PORT dbname=$DATABASE_NAME user=$DATABASE_USER sslmode=disable"
"$dir/shop" >"$dir/out" 2>"$dir/err" &
pid=$!
trap 'kill $pid 2>/dev/null' EXIT
port=""
for _ in $(seq 100); do
	port=$(sed -n 's/^listening //p' "$dir/out")
	[ -n "$port" ] && break
	sleep 0.1
done
[ -n "$port" ] || { cat "$dir/err"; exit 1; }
key="fresh-$$-$RANDOM"
fail=0
for path in chi gin phases; do
	a=$(curl -s -D "$dir/h1" -H "Idempotency-Key: $key" -d '{"n":1}' "http://127.0.0.1:$port/$path")
	b=$(curl -s -D "$dir/h2" -H "Idempotency-Key: $key" -d '{"n":1}' "http://127.0.0.1:$port/$path")
	echo "$path: $(head -1 "$dir/h1" | tr -d '\r') $a / $(head -1 "$dir/h2" | tr -d '\r') $b $(grep -i '^Idempotent-Replayed' "$dir/h2" | tr -d '\r')"
	grep -q '^HTTP/1.1 201' "$dir/h1" && [ "$a" = "$b" ] && grep -qi '^Idempotent-Replayed: true' "$dir/h2" || fail=1
done
a=$(curl -s -H "Idempotency-Key: $key" -X POST "http://127.0.0.1:$port/once")
b=$(curl -s -H "Idempotency-Key: $key" -X POST "http://127.0.0.1:$port/once")
echo "once: $a / $b"
case "$a|$b" in "new {\"id\": "*"|replay {\"id\": "*) ;; *) fail=1 ;; esac
[ $fail = 0 ] && echo "fresh app ok"
