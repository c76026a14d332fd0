package idempotency_test

// Against a real PostgreSQL with the extension (DATABASE_HOST/PORT/NAME/USER,
// as test/go/run sets them; IDEMPOTENCY_BOUNCER=1 behind PgBouncer in
// transaction mode), over real HTTP (httptest.Server), once with lib/pq and
// once with pgx v4's stdlib driver.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/stdlib"
	_ "github.com/lib/pq"

	idempotency "github.com/idempotency/idempotency-go"
)

var prefix = fmt.Sprintf("gotest-%d-", time.Now().UnixNano()%1e9)

func dsn() string {
	return fmt.Sprintf("host=%s port=%s dbname=%s user=%s sslmode=disable",
		os.Getenv("DATABASE_HOST"), os.Getenv("DATABASE_PORT"), os.Getenv("DATABASE_NAME"), os.Getenv("DATABASE_USER"))
}

func open(t testing.TB, driver string) *sql.DB {
	var db *sql.DB
	switch driver {
	case "pgx":
		s := dsn()
		if os.Getenv("IDEMPOTENCY_BOUNCER") == "1" {
			s += " statement_cache_mode=describe"
		}
		cfg, err := pgx.ParseConfig(s)
		if err != nil {
			t.Fatal(err)
		}
		db = stdlib.OpenDB(*cfg)
	default:
		s := dsn()
		if os.Getenv("IDEMPOTENCY_BOUNCER") == "1" {
			// one round trip per query with parameters (Parse, Bind,
			// Execute, Sync), not Parse+Sync then Bind+Sync, between which
			// PgBouncer may hand the next statement to another server
			s += " binary_parameters=yes"
		}
		var err error
		if db, err = sql.Open("postgres", s); err != nil {
			t.Fatal(err)
		}
	}
	db.SetMaxOpenConns(8)
	if err := db.Ping(); err != nil {
		t.Fatalf("%s: %v", driver, err)
	}
	return db
}

func TestMain(m *testing.M) {
	if os.Getenv("DATABASE_HOST") == "" {
		fmt.Fprintln(os.Stderr, "DATABASE_HOST/PORT/NAME/USER must name a database with the extension (test/go/run sets them)")
		os.Exit(2)
	}
	db, err := sql.Open("postgres", dsn())
	if err == nil {
		_, err = db.Exec("CREATE TABLE IF NOT EXISTS go_item (id bigserial PRIMARY KEY, idem_key text NOT NULL, note text NOT NULL CHECK (note <> 'bad'))")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	db.Close()
	os.Exit(m.Run())
}

// counts: business rows and key rows of a key
func counts(t *testing.T, db *sql.DB, key string) (items, keys int) {
	t.Helper()
	if err := db.QueryRow("SELECT (SELECT count(*) FROM go_item WHERE idem_key = $1), "+
		"(SELECT count(*) FROM idempotency.idempotency_key WHERE key = $1)", key).Scan(&items, &keys); err != nil {
		t.Fatal(err)
	}
	return
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func post(t *testing.T, url, key, body string, header ...string) resp {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp{res.StatusCode, res.Header, b}
}

func replayed(r resp) bool { return r.header.Get("Idempotent-Replayed") == "true" }

func same(a, b resp) bool {
	return a.status == b.status && bytes.Equal(a.body, b.body) &&
		a.header.Get("Content-Type") == b.header.Get("Content-Type") && a.header.Get("Location") == b.header.Get("Location")
}

// item: the handler under test: inserts one go_item row on the guarded
// transaction, then answers as the body asks
type item struct {
	Note    string  `json:"note"`
	Status  int     `json:"status"`
	Panic   bool    `json:"panic"`
	Flush   bool    `json:"flush"`
	Big     int     `json:"big"`
	Wait    bool    `json:"wait"`
	SleepMs float64 `json:"sleep_ms"`
}

type server struct {
	*httptest.Server
	db      *sql.DB
	entered chan struct{} // a handler with {"wait": true} is inside its transaction
	release chan struct{} // and goes on
	mu      sync.Mutex
	seen    []*idempotency.Info
}

func newServer(t *testing.T, db *sql.DB, opts ...idempotency.Option) *server {
	s := &server{db: db, entered: make(chan struct{}, 10), release: make(chan struct{})}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g := idempotency.FromContext(r.Context())
		s.mu.Lock()
		s.seen = append(s.seen, g)
		s.mu.Unlock()
		if g == nil { // Optional(), no key: unguarded
			w.WriteHeader(http.StatusNoContent)
			return
		}
		var it item
		if err := json.NewDecoder(r.Body).Decode(&it); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		var id int64
		if err := idempotency.Tx(r.Context()).QueryRowContext(r.Context(),
			"INSERT INTO go_item (idem_key, note) VALUES ($1, $2) RETURNING id", g.Key, it.Note).Scan(&id); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if it.Wait {
			s.entered <- struct{}{}
			<-s.release
		}
		if it.Panic {
			panic("handler panics after its insert")
		}
		if it.Flush {
			w.Write([]byte("partial"))
			w.(http.Flusher).Flush()
		}
		if it.Big > 0 {
			w.Write(bytes.Repeat([]byte("x"), it.Big))
			return
		}
		if it.Status == 0 {
			it.Status = 201
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/items/%d", id))
		w.Header().Set("X-Extra", "not stored by default")
		w.WriteHeader(it.Status)
		fmt.Fprintf(w, `{"id":%d,"note":%q,"outcome":%q,"attempts":%d}`, id, it.Note, g.Outcome, g.Attempts)
	})
	guarded := idempotency.Middleware(db, opts...)(h)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil { // as chi's Recoverer or gin.Recovery do
				http.Error(w, fmt.Sprint(p), 500)
			}
		}()
		guarded.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func TestMiddleware(t *testing.T) {
	for _, driver := range []string{"postgres", "pgx"} {
		driver := driver
		t.Run(driver, func(t *testing.T) { testMiddleware(t, driver) })
	}
}

func testMiddleware(t *testing.T, driver string) {
	db := open(t, driver)
	defer db.Close()
	P := prefix + driver + "-"
	s := newServer(t, db, idempotency.WithScope("items"))

	t.Run("new then replay: byte-identical, Idempotent-Replayed, one row, committed with the key", func(t *testing.T) {
		k := P + "new"
		a := post(t, s.URL+"/items?x=1", k, `{"note":"one"}`)
		b := post(t, s.URL+"/items?x=1", `"`+k+`"`, `{"note":  "one"}`) // sf-string key; equal JSON
		items, keys := counts(t, db, k)
		if a.status != 201 || replayed(a) || !replayed(b) || !same(a, b) || items != 1 || keys != 1 {
			t.Fatalf("a=%d %s b=%d %s replayed=%v items=%d keys=%d", a.status, a.body, b.status, b.body, replayed(b), items, keys)
		}
		if !strings.Contains(string(a.body), `"outcome":"new","attempts":1`) {
			t.Fatalf("Info: %s", a.body)
		}
		if a.header.Get("X-Extra") == "" || b.header.Get("X-Extra") != "" {
			t.Fatalf("X-Extra: sent %q, replayed %q (stored only with WithHeaders)", a.header.Get("X-Extra"), b.header.Get("X-Extra"))
		}
	})

	t.Run("stored as idempotency.http_response builds it, fingerprinted as the Node and Python clients do", func(t *testing.T) {
		k := P + "compat"
		a := post(t, s.URL+"/items?q=%C3%A9", k, `{"note":"café ✓ <&>"}`)
		var sameResponse, sameRequest bool
		err := db.QueryRow(`SELECT response = idempotency.http_response($1::int, $2::text, $3::jsonb),
				request_hash = idempotency.fingerprint($4::jsonb)
			FROM idempotency.idempotency_key WHERE key = $5 AND scope = 'items'`,
			a.status, string(a.body), fmt.Sprintf(`{"Content-Type":"application/json","Location":%q}`, a.header.Get("Location")),
			`{"method":"POST","path":"/items?q=%C3%A9","body":{"note":"café ✓ <&>"}}`, k).Scan(&sameResponse, &sameRequest)
		if err != nil || !sameResponse || !sameRequest {
			t.Fatalf("err=%v response as http_response()=%v request as {method,path,body}=%v", err, sameResponse, sameRequest)
		}
	})

	t.Run("a body that is not JSON is fingerprinted as base64; another body under the key is 422", func(t *testing.T) {
		k := P + "raw"
		a := post(t, s.URL+"/items", k, `{"note":"raw"}`)
		c := post(t, s.URL+"/items", k, "\xff not json")
		items, keys := counts(t, db, k)
		var fp bool
		db.QueryRow(`SELECT request_hash = idempotency.fingerprint('{"method":"POST","path":"/items","body":{"note":"raw"}}')
			FROM idempotency.idempotency_key WHERE key = $1`, k).Scan(&fp)
		if a.status != 201 || c.status != 422 || items != 1 || keys != 1 || !fp {
			t.Fatalf("a=%d c=%d %s items=%d keys=%d fp=%v", a.status, c.status, c.body, items, keys, fp)
		}
		if RequestBody := idempotency.RequestJSON("POST", "/", []byte("\xff\x00")); RequestBody == nil {
			t.Fatal("RequestJSON")
		}
	})

	t.Run("mismatch: same key, different request -> 422 problem+json, nothing written", func(t *testing.T) {
		k := P + "mismatch"
		// the card number must not reach the server's log with the IK001
		// ERROR (test/go/run greps the log for it)
		post(t, s.URL+"/items", k, `{"note":"a","card":"4111111111111111"}`)
		r := post(t, s.URL+"/items", k, `{"note":"b","card":"4111111111111111"}`)
		items, keys := counts(t, db, k)
		if r.status != 422 || r.header.Get("Content-Type") != "application/problem+json" || items != 1 || keys != 1 {
			t.Fatalf("%d %s items=%d keys=%d", r.status, r.body, items, keys)
		}
	})

	t.Run("busy: a duplicate while the first is in its transaction -> 409 with Retry-After, then the replay", func(t *testing.T) {
		k := P + "busy"
		first := make(chan resp, 1)
		go func() { first <- post(t, s.URL+"/items", k, `{"note":"w","wait":true}`) }()
		<-s.entered
		// not visible to others while in flight: neither the row nor the key
		items, keys := counts(t, db, k)
		r := post(t, s.URL+"/items", k, `{"note":"w","wait":true}`)
		s.release <- struct{}{}
		f := <-first
		again := post(t, s.URL+"/items", k, `{"note":"w","wait":true}`)
		items2, keys2 := counts(t, db, k)
		if items != 0 || keys != 0 || r.status != 409 || r.header.Get("Retry-After") != "1" ||
			f.status != 201 || !replayed(again) || !same(f, again) || items2 != 1 || keys2 != 1 {
			t.Fatalf("in flight items=%d keys=%d; dup %d %q %s; first %d; again %d replayed=%v; items=%d keys=%d",
				items, keys, r.status, r.header.Get("Retry-After"), r.body, f.status, again.status, replayed(again), items2, keys2)
		}
	})

	t.Run("a key under another worker's lease -> 409 with the lease's Retry-After (idempotency.lookup)", func(t *testing.T) {
		k := P + "lease"
		if _, err := db.Exec("SELECT * FROM idempotency.begin($1, NULL, 'items', NULL, '40 seconds')", k); err != nil {
			t.Fatal(err)
		}
		r := post(t, s.URL+"/items", k, `{"note":"l"}`)
		if ra := r.header.Get("Retry-After"); r.status != 409 || ra < "30" || ra > "40" || len(ra) != 2 {
			t.Fatalf("%d Retry-After %q %s", r.status, ra, r.body)
		}
	})

	t.Run("invalid keys -> 400, nothing written", func(t *testing.T) {
		for _, k := range []string{"", `"unterminated`, `"a"b`, `"bad\escape"`, strings.Repeat("x", 256)} {
			r := post(t, s.URL+"/items", k, `{"note":"k"}`)
			if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("key %.20q: %d %s", k, r.status, r.body)
			}
		}
		r := post(t, s.URL+"/items", P+"two", `{"note":"k"}`, "Idempotency-Key", "other")
		if r.status != 400 {
			t.Fatalf("two keys: %d %s", r.status, r.body)
		}
		if items, keys := counts(t, db, strings.Repeat("x", 256)); items != 0 || keys != 0 {
			t.Fatalf("written: %d %d", items, keys)
		}
		r = post(t, s.URL+"/items", strings.Repeat("y", 255), `{"note":"k"}`)
		if r.status != 201 {
			t.Fatalf("a key of 255 characters: %d %s", r.status, r.body)
		}
	})

	t.Run("5xx, 429, 409 and a panic roll back: neither the handler's row nor the key; the resend runs", func(t *testing.T) {
		for i, c := range []string{`{"note":"x","status":500}`, `{"note":"x","status":503}`, `{"note":"x","status":429}`,
			`{"note":"x","status":409}`, `{"note":"x","panic":true}`, `{"note":"bad"}`} {
			k := P + "rollback-" + fmt.Sprint(i)
			r := post(t, s.URL+"/items", k, c)
			items, keys := counts(t, db, k)
			if r.status < 409 || replayed(r) || items != 0 || keys != 0 {
				t.Fatalf("%s: %d %s items=%d keys=%d", c, r.status, r.body, items, keys)
			}
			r = post(t, s.URL+"/items", k, c)
			if replayed(r) {
				t.Fatalf("%s: a resend was replayed", c)
			}
		}
	})

	t.Run("4xx other than 408/409/425/429 is stored and replayed", func(t *testing.T) {
		k := P + "402"
		a := post(t, s.URL+"/items", k, `{"note":"d","status":402}`)
		b := post(t, s.URL+"/items", k, `{"note":"d","status":402}`)
		items, keys := counts(t, db, k)
		if a.status != 402 || !replayed(b) || !same(a, b) || items != 1 || keys != 1 {
			t.Fatalf("%d %d items=%d keys=%d", a.status, b.status, items, keys)
		}
	})

	t.Run("a streamed response (Flush) and one over the cap are refused: 500, nothing written", func(t *testing.T) {
		small := newServer(t, db, idempotency.WithScope("items"), idempotency.WithMaxResponseBytes(100))
		for name, c := range map[string]string{"flush": `{"note":"s","flush":true}`, "big": `{"note":"s","big":101}`} {
			k := P + "stream-" + name
			r := post(t, small.URL+"/items", k, c)
			items, keys := counts(t, db, k)
			if r.status != 500 || !strings.Contains(string(r.body), "refused") || items != 0 || keys != 0 {
				t.Fatalf("%s: %d %s items=%d keys=%d", name, r.status, r.body, items, keys)
			}
		}
		k := P + "stream-fits"
		if r := post(t, small.URL+"/items", k, `{"note":"s","big":100}`); r.status != 200 || len(r.body) != 100 {
			t.Fatalf("100 bytes: %d %d", r.status, len(r.body))
		}
	})

	t.Run("a request body over WithMaxRequestBytes -> 413, nothing run", func(t *testing.T) {
		small := newServer(t, db, idempotency.WithMaxRequestBytes(10))
		k := P + "413"
		r := post(t, small.URL+"/items", k, `{"note":"longer than ten"}`)
		if items, keys := counts(t, db, k); r.status != 413 || items != 0 || keys != 0 {
			t.Fatalf("%d items=%d keys=%d", r.status, items, keys)
		}
	})

	t.Run("options: WithUser scopes per user, WithTTL, WithHeaders, WithStore, Optional", func(t *testing.T) {
		o := newServer(t, db, idempotency.WithScope("opts"), idempotency.WithTTL(90*time.Minute),
			idempotency.WithUser(func(r *http.Request) string { return r.Header.Get("X-User") }),
			idempotency.WithHeaders("x-extra"), idempotency.WithStore(func(s int) bool { return s == 201 }), idempotency.Optional())
		k := P + "opts"
		a := post(t, o.URL, k, `{"note":"u"}`, "X-User", "alice")
		b := post(t, o.URL, k, `{"note":"u"}`, "X-User", "bob")
		a2 := post(t, o.URL, k, `{"note":"u"}`, "X-User", "alice")
		var scopes string
		var ttl float64
		db.QueryRow(`SELECT string_agg(scope, ',' ORDER BY scope), max(extract(epoch FROM expires_at - created_at))
			FROM idempotency.idempotency_key WHERE key = $1`, k).Scan(&scopes, &ttl)
		if a.status != 201 || b.status != 201 || replayed(b) || !replayed(a2) || !same(a, a2) ||
			scopes != "opts|user:alice,opts|user:bob" || ttl != 5400 || a2.header.Get("X-Extra") == "" {
			t.Fatalf("a=%d b=%d a2 replayed=%v scopes=%q ttl=%v x-extra=%q", a.status, b.status, replayed(a2), scopes, ttl, a2.header.Get("X-Extra"))
		}
		k = P + "opts-402"
		post(t, o.URL, k, `{"note":"u","status":402}`)
		if _, keys := counts(t, db, k); keys != 0 {
			t.Fatalf("WithStore: a 402 was stored")
		}
		if r := post(t, o.URL, "", `{}`); r.status != 204 {
			t.Fatalf("Optional without a key: %d %s", r.status, r.body)
		}
	})

	t.Run("WithScopeFunc (a tenant) and WithRequest (a fingerprint of one's own)", func(t *testing.T) {
		o := newServer(t, db, idempotency.WithScopeFunc(func(r *http.Request) string { return "tenant:" + r.Header.Get("X-Tenant") }),
			idempotency.WithRequest(func(r *http.Request, body []byte) any { return map[string]string{"tenant_path": r.URL.Path} }))
		k := P + "tenant"
		a := post(t, o.URL+"/items", k, `{"note":"t"}`, "X-Tenant", "acme")
		b := post(t, o.URL+"/items", k, `{"note":"t"}`, "X-Tenant", "globex")
		a2 := post(t, o.URL+"/items", k, `{"note":"other body, same fingerprint"}`, "X-Tenant", "acme")
		m := post(t, o.URL+"/other", k, `{"note":"t"}`, "X-Tenant", "acme")
		var scopes string
		var fp bool
		db.QueryRow(`SELECT string_agg(scope, ',' ORDER BY scope), bool_and(request_hash = idempotency.fingerprint('{"tenant_path":"/items"}'))
			FROM idempotency.idempotency_key WHERE key = $1`, k).Scan(&scopes, &fp)
		if a.status != 201 || b.status != 201 || replayed(b) || !replayed(a2) || !same(a, a2) || m.status != 422 ||
			scopes != "tenant:acme,tenant:globex" || !fp {
			t.Fatalf("a=%d b=%d a2=%d replayed=%v m=%d scopes=%q fingerprint=%v", a.status, b.status, a2.status, replayed(a2), m.status, scopes, fp)
		}
	})

	t.Run("the database unreachable -> 503 with Retry-After, logged by WithLogger", func(t *testing.T) {
		gone := open(t, driver)
		gone.Close()
		var logged []string
		o := newServer(t, gone, idempotency.WithLogger(func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) }))
		r := post(t, o.URL+"/items", P+"gone", `{"note":"g"}`)
		if r.status != 503 || r.header.Get("Retry-After") != "1" || len(logged) != 1 || !strings.Contains(logged[0], "closed") {
			t.Fatalf("%d %q %s logged %q", r.status, r.header.Get("Retry-After"), r.body, logged)
		}
	})

	t.Run("WithLockWait: a duplicate waits for the first and replays it", func(t *testing.T) {
		w := newServer(t, db, idempotency.WithScope("items"), idempotency.WithLockWait(10*time.Second))
		k := P + "lockwait"
		first := make(chan resp, 1)
		go func() { first <- post(t, w.URL+"/items", k, `{"note":"w","wait":true}`) }()
		<-w.entered
		second := make(chan resp, 1)
		go func() { second <- post(t, w.URL+"/items", k, `{"note":"w","wait":true}`) }()
		// a positive signal that the duplicate waits: its begin() is blocked on the key's lock
		deadline := time.Now().Add(10 * time.Second)
		for {
			var waiting int
			db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%idempotency.begin%'`).Scan(&waiting)
			if waiting > 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		w.release <- struct{}{}
		f, d := <-first, <-second
		if items, _ := counts(t, db, k); f.status != 201 || !replayed(d) || !same(f, d) || items != 1 {
			t.Fatalf("first %d, duplicate %d replayed=%v, items=%d", f.status, d.status, replayed(d), items)
		}
	})
}

func TestOnce(t *testing.T) {
	for _, driver := range []string{"postgres", "pgx"} {
		driver := driver
		t.Run(driver, func(t *testing.T) { testOnce(t, driver) })
	}
}

func testOnce(t *testing.T, driver string) {
	db := open(t, driver)
	defer db.Close()
	ctx := context.Background()
	P := prefix + driver + "-once-"
	const ins = "INSERT INTO go_item (idem_key, note) VALUES ($1, $2) RETURNING id, note"

	t.Run("new, then replay without running the statement", func(t *testing.T) {
		k := P + "a"
		r1, err1 := idempotency.Once(ctx, db, k, map[string]any{"note": "n"}, ins, k, "n")
		r2, err2 := idempotency.Once(ctx, db, k, json.RawMessage(`{"note": "n"}`), ins, k, "n")
		items, keys := counts(t, db, k)
		if err1 != nil || err2 != nil || r1.Outcome != "new" || r1.Replayed() || !r2.Replayed() ||
			!bytes.Equal(r1.Response, r2.Response) || items != 1 || keys != 1 {
			t.Fatalf("%v %v %+v %+v items=%d keys=%d", err1, err2, r1, r2, items, keys)
		}
		var got struct {
			ID   int64  `json:"id"`
			Note string `json:"note"`
		}
		if json.Unmarshal(r1.Response, &got) != nil || got.ID == 0 || got.Note != "n" {
			t.Fatalf("response %s", r1.Response)
		}
	})

	t.Run("typed arguments are sent as text and typed by the statement", func(t *testing.T) {
		k := P + "typed"
		r, err := idempotency.Once(ctx, db, k, nil,
			"SELECT $1::int + 1 AS i, $2::numeric AS n, $3::boolean AS b, $4::timestamptz = '2026-01-02T03:04:05Z' AS t, $5::text IS NULL AS z, $6::bytea AS y",
			41, 2.5, true, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), nil, []byte("ab"))
		if err != nil || string(r.Response) != `{"b": true, "i": 42, "n": 2.5, "t": true, "y": "\\x6162", "z": true}` {
			t.Fatalf("%v %s", err, r.Response)
		}
	})

	t.Run("stores an http_response() byte for byte", func(t *testing.T) {
		k := P + "http"
		r, err := idempotency.Once(ctx, db, k, nil,
			`SELECT idempotency.http_response(201, $1, jsonb_build_object('Content-Type', 'application/json'))`, `{"b":1, "a":2}`)
		var h struct {
			Status int    `json:"status"`
			Body   string `json:"body"`
		}
		if err != nil || json.Unmarshal(r.Response, &h) != nil || h.Status != 201 || h.Body != `{"b":1, "a":2}` {
			t.Fatalf("%v %s", err, r.Response)
		}
	})

	t.Run("errors: IK001 -> ErrMismatch (422), IK003 -> ErrInvalidKey (400), nothing written", func(t *testing.T) {
		k := P + "err"
		idempotency.Once(ctx, db, k, "one", ins, k, "e")
		_, err := idempotency.Once(ctx, db, k, "two", ins, k, "e")
		var e *idempotency.Error
		if !errors.Is(err, idempotency.ErrMismatch) || idempotency.HTTPStatus(err) != 422 || !errors.As(err, &e) ||
			e.Code != "IK001" || idempotency.SQLState(err) != "IK001" {
			t.Fatalf("mismatch: %v", err)
		}
		_, err = idempotency.Once(ctx, db, "", nil, ins, k, "e")
		if !errors.Is(err, idempotency.ErrInvalidKey) || idempotency.HTTPStatus(err) != 400 {
			t.Fatalf("empty key: %v", err)
		}
		if items, keys := counts(t, db, k); items != 1 || keys != 1 {
			t.Fatalf("items=%d keys=%d", items, keys)
		}
	})

	t.Run("an error in the statement stores nothing; the next try is new", func(t *testing.T) {
		k := P + "bad"
		_, err := idempotency.Once(ctx, db, k, nil, ins, k, "bad")
		if idempotency.SQLState(err) != "23514" || errors.Is(err, idempotency.ErrMismatch) {
			t.Fatalf("check violation: %v", err)
		}
		if items, keys := counts(t, db, k); items != 0 || keys != 0 {
			t.Fatalf("items=%d keys=%d", items, keys)
		}
		r, err := idempotency.Once(ctx, db, k, nil, ins, k, "good")
		if err != nil || r.Outcome != "new" {
			t.Fatalf("%v %+v", err, r)
		}
	})

	t.Run("IK002 -> ErrInProgress (409) while another transaction holds the key", func(t *testing.T) {
		k := P + "busy"
		holder, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback()
		if _, err := holder.ExecContext(ctx, "SELECT * FROM idempotency.begin($1, NULL)", k); err != nil {
			t.Fatal(err)
		}
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// lock_wait is the session's setting for once(); SET LOCAL has no
		// transaction to live in under autocommit, so use a transaction
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "SET LOCAL idempotency.lock_wait = 0"); err != nil {
			t.Fatal(err)
		}
		_, err = idempotency.Once(ctx, tx, k, nil, ins, k, "busy")
		var e *idempotency.Error
		if !errors.Is(err, idempotency.ErrInProgress) || idempotency.HTTPStatus(err) != 409 || !errors.As(err, &e) || e.RetryAfter < 1 {
			t.Fatalf("%v", err)
		}
	})

	t.Run("IK002 under another worker's lease: Error.RetryAfter from idempotency.lookup", func(t *testing.T) {
		k := P + "lease"
		if _, err := db.Exec("SELECT * FROM idempotency.begin($1, NULL, '', NULL, '40 seconds')", k); err != nil {
			t.Fatal(err)
		}
		_, err := idempotency.Once(ctx, db, k, nil, ins, k, "lease")
		var e *idempotency.Error
		if !errors.Is(err, idempotency.ErrInProgress) || !errors.As(err, &e) || e.RetryAfter < 30 || e.RetryAfter > 40 {
			t.Fatalf("%v %+v", err, e)
		}
	})

	t.Run("inside the caller's transaction: the statement commits or rolls back with it", func(t *testing.T) {
		k := P + "intx"
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := idempotency.Once(ctx, tx, k, nil, ins, k, "t"); err != nil {
			t.Fatal(err)
		}
		tx.Rollback()
		if items, keys := counts(t, db, k); items != 0 || keys != 0 {
			t.Fatalf("after rollback items=%d keys=%d", items, keys)
		}
	})
}

func TestParseKey(t *testing.T) {
	for _, c := range []struct {
		in   []string
		key  string
		fail bool
	}{
		{[]string{"abc"}, "abc", false}, {[]string{`"abc"`}, "abc", false}, {[]string{` "a\"b\\c" `}, `a"b\c`, false},
		{nil, "", true}, {[]string{""}, "", true}, {[]string{"a", "b"}, "", true}, {[]string{`"abc`}, "", true},
		{[]string{`"a"b`}, "", true}, {[]string{`"a\b"`}, "", true}, {[]string{"\"caf\u00e9\""}, "", true},
	} {
		k, err := idempotency.ParseKey(c.in)
		if k != c.key || (err != nil) != c.fail {
			t.Errorf("ParseKey(%q) = %q, %v", c.in, k, err)
		}
	}
	if _, err := idempotency.ParseKey(nil); err != idempotency.ErrKeyMissing {
		t.Errorf("missing: %v", err)
	}
}
