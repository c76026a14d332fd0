package idempotency_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	idempotency "github.com/idempotency/idempotency-go"
)

// TestExtensionVersion: the compatibility rule (docs/clients.md, "Versions")
// on a database of its own whose extension is 0.5.0, then updated: the
// middleware, RunPhases and Once refuse it with both versions in the
// message and write nothing; after ALTER EXTENSION UPDATE the next request
// goes through; the version is asked once per *sql.DB.
func TestExtensionVersion(t *testing.T) {
	admin, err := sql.Open("postgres", dsn())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	name := fmt.Sprintf("compat_go_%d", os.Getpid())
	admin.Exec("DROP DATABASE IF EXISTS " + name) //nolint:errcheck // absent is fine
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	defer admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)") //nolint:errcheck // best effort
	db, err := sql.Open("postgres", strings.Replace(dsn(), "dbname="+os.Getenv("DATABASE_NAME"), "dbname="+name, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{"CREATE EXTENSION idempotency VERSION '0.5.0'", "CREATE TABLE written (n int)"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var logged []string
	h := idempotency.Middleware(db, idempotency.WithScope("compat"), idempotency.WithLogger(func(f string, a ...any) {
		mu.Lock()
		logged = append(logged, fmt.Sprintf(f, a...))
		mu.Unlock()
	}))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := idempotency.Tx(r.Context()).ExecContext(r.Context(), "INSERT INTO written VALUES (1)"); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.WriteHeader(201)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()

	want := "idempotency-go 0.6.0 needs the idempotency extension 0.6.0 or newer; " +
		"this database has 0.5.0 (ALTER EXTENSION idempotency UPDATE; a plain install: the portable upgrade script)"
	r := post(t, srv.URL, "k1", `{}`)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, perr := idempotency.RunPhases(ctx, db, idempotency.PhasesOptions{Key: "k2", Scope: "compat",
		Phases:   []idempotency.Phase{{Name: "a", Run: func(ctx context.Context, p *idempotency.PhaseContext) (any, error) { return 1, nil }}},
		Response: func(s idempotency.State) (any, error) { return map[string]int{}, nil }})
	_, oerr := idempotency.Once(ctx, db, "k3", map[string]int{}, "INSERT INTO written VALUES (1) RETURNING n")
	var n, keys int
	if err := db.QueryRow("SELECT (SELECT count(*) FROM written), (SELECT count(*) FROM idempotency.idempotency_key)").Scan(&n, &keys); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	log := strings.Join(logged, "\n")
	mu.Unlock()
	for _, e := range []error{perr, oerr} {
		var ve *idempotency.ExtensionVersionError
		if !errors.As(e, &ve) || e.Error() != want || ve.Found != "0.5.0" || ve.Needed != idempotency.ExtensionMin {
			t.Errorf("an extension older than the client: want %q, got %v", want, e)
		}
	}
	if r.status != 500 || !strings.Contains(log, want) || n != 0 || keys != 0 || idempotency.Version != "0.6.0" {
		t.Errorf("the middleware on 0.5.0: want 500 and %q logged, nothing written; got %d %q, %d rows, %d keys",
			want, r.status, log, n, keys)
	}

	if _, err := db.Exec("ALTER EXTENSION idempotency UPDATE"); err != nil {
		t.Fatal(err)
	}
	before := idempotency.VersionQueries()
	for i := 0; i < 11; i++ {
		if r := post(t, srv.URL, fmt.Sprintf("after-%d", i), `{}`); r.status != 201 {
			t.Fatalf("after ALTER EXTENSION UPDATE, request %d: %d %s", i, r.status, r.body)
		}
	}
	if got := idempotency.VersionQueries() - before; got != 1 {
		t.Errorf("11 requests on one *sql.DB asked the version %d times, want 1", got)
	}
}
