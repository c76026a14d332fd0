// Package idempotency guards HTTP endpoints and SQL statements with the
// PostgreSQL extension idempotency (CREATE EXTENSION idempotency): the key
// is begun in the same transaction as the handler's writes, so the key, the
// stored answer and the writes commit together or not at all.
//
// A guarded request is one transaction on the application's *sql.DB (lib/pq
// or pgx's stdlib driver):
//
//	BEGIN
//	SELECT pg_catalog.set_config('idempotency.lock_wait', '200ms', true)
//	SELECT ... FROM idempotency.begin(key, request, scope, ttl)
//	  replay      -> ROLLBACK; the stored answer, Idempotent-Replayed: true
//	  new / retry -> the handler runs on this *sql.Tx (Tx(r.Context()));
//	                 its answer is held in memory, then
//	                 idempotency.complete(key, answer, scope); COMMIT; sent
//
// IK001 (the key with a different request) -> 422, IK002 (the key in flight
// elsewhere) -> 409 with Retry-After (from idempotency.lookup), IK003 (an
// invalid key) -> 400.  An answer that is not stored (by default 408, 409,
// 425, 429 and any 5xx), a handler that panics, or a streamed answer rolls
// everything back: a resend runs the handler again.
//
// Once guards a request whose work is one SQL statement (idempotency.once).
package idempotency

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/rand"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"
)

// The defaults of the options.
const (
	DefaultLockWait         = 200 * time.Millisecond
	DefaultRetries          = 3
	DefaultMaxRequestBytes  = 1 << 20
	DefaultMaxResponseBytes = 1 << 20
)

// DefaultHeaders are the response headers stored and replayed besides the
// status and body (WithHeaders adds more).
var DefaultHeaders = []string{"Content-Type", "Location"}

const (
	lockWaitSQL = "SELECT pg_catalog.set_config('idempotency.lock_wait', $1, true)"
	beginSQL    = "SELECT outcome, status, response::text, attempts " +
		"FROM idempotency.begin($1, $2::jsonb, $3, $4::interval)"
	completeSQL = "SELECT idempotency.complete($1, $2::jsonb, $3)"
	lookupSQL   = "SELECT retry_after FROM idempotency.lookup($1, $2)"
)

// DefaultStore is whether an answer with this status is stored and
// replayed: every status below 500 except 408, 409, 425 and 429 (Stripe's
// practice: those are not final, a resend should run again).
func DefaultStore(status int) bool {
	switch status {
	case 408, 409, 425, 429:
		return false
	}
	return status < 500
}

type config struct {
	scope            func(*http.Request) string
	user             func(*http.Request) string
	ttl              time.Duration
	lockWait         time.Duration
	retries          int
	optional         bool
	headers          []string
	store            func(int) bool
	maxRequestBytes  int64
	maxResponseBytes int
	request          func(r *http.Request, body []byte) any
	txOptions        *sql.TxOptions
	lease            time.Duration // PhasesHandler
	renewEvery       time.Duration // PhasesHandler
	logf             func(format string, args ...any)
}

// An Option sets one setting of Middleware.
type Option func(*config)

// WithScope sets the key space of the guarded route (default "", the
// extension's default scope).  Keys of different scopes never meet.
func WithScope(scope string) Option {
	return func(c *config) { c.scope = func(*http.Request) string { return scope } }
}

// WithScopeFunc chooses the scope per request (a tenant, say).
func WithScopeFunc(f func(*http.Request) string) Option {
	return func(c *config) { c.scope = f }
}

// WithUser gives every authenticated user a key space of their own: when f
// returns a non-empty id the scope is "<scope>|user:<id>" (as in the Node
// and Python clients).  Default: none.
func WithUser(f func(*http.Request) string) Option {
	return func(c *config) { c.user = f }
}

// WithTTL sets how long a key lives (default 0: the server's
// idempotency.default_ttl, 24 hours unless changed).
func WithTTL(ttl time.Duration) Option { return func(c *config) { c.ttl = ttl } }

// WithLockWait sets how long begin() waits for a duplicate in flight in
// another transaction before answering 409 (default DefaultLockWait, 200ms;
// 0 answers at once).
func WithLockWait(d time.Duration) Option { return func(c *config) { c.lockWait = d } }

// WithRetries sets how often a serialization failure or deadlock (40001,
// 40P01) in begin() starts the transaction again before answering 503
// (default DefaultRetries, 3).
func WithRetries(n int) Option { return func(c *config) { c.retries = n } }

// Optional lets a request without an Idempotency-Key header through,
// unguarded (Tx returns nil).  By default it is answered 400.
func Optional() Option { return func(c *config) { c.optional = true } }

// WithHeaders stores and replays these response headers too, besides
// DefaultHeaders (Content-Type, Location).
func WithHeaders(names ...string) Option {
	return func(c *config) {
		for _, n := range names {
			n = http.CanonicalHeaderKey(n)
			dup := false
			for _, have := range c.headers {
				dup = dup || have == n
			}
			if !dup {
				c.headers = append(c.headers, n)
			}
		}
	}
}

// WithStore decides which answers are stored (committed with the key and
// replayed) by status; the others roll back, so a resend runs again.
// Default DefaultStore.
func WithStore(f func(status int) bool) Option { return func(c *config) { c.store = f } }

// WithMaxRequestBytes caps the request body the middleware reads to
// fingerprint it (default DefaultMaxRequestBytes, 1 MiB); a larger body is
// answered 413 before anything runs.
func WithMaxRequestBytes(n int64) Option { return func(c *config) { c.maxRequestBytes = n } }

// WithMaxResponseBytes caps the answer held in memory until it is stored
// (default DefaultMaxResponseBytes, 1 MiB); a handler that writes more is
// refused like a streamed one: rolled back, answered 500.
func WithMaxResponseBytes(n int) Option { return func(c *config) { c.maxResponseBytes = n } }

// WithRequest replaces the fingerprinted request (default: method, path
// with query, and body, as the other clients do) by f's value, marshalled
// to JSON.  A different value under the same key is answered 422.
func WithRequest(f func(r *http.Request, body []byte) any) Option {
	return func(c *config) { c.request = f }
}

// WithTxOptions sets the isolation level of the guarded transaction
// (default nil: the database's default, READ COMMITTED).
func WithTxOptions(o *sql.TxOptions) Option { return func(c *config) { c.txOptions = o } }

// WithLogger sets where database errors that end in a 500 or 503 are
// logged (default log.Printf).
func WithLogger(f func(format string, args ...any)) Option { return func(c *config) { c.logf = f } }

func newConfig(opts []Option) *config {
	c := &config{
		scope:            func(*http.Request) string { return "" },
		lockWait:         DefaultLockWait,
		retries:          DefaultRetries,
		headers:          append([]string(nil), DefaultHeaders...),
		store:            DefaultStore,
		maxRequestBytes:  DefaultMaxRequestBytes,
		maxResponseBytes: DefaultMaxResponseBytes,
		logf:             log.Printf,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

func (c *config) scopeFor(r *http.Request) string {
	s := c.scope(r)
	if c.user != nil {
		if u := c.user(r); u != "" {
			s += "|user:" + u
		}
	}
	return s
}

// RequestJSON is the default fingerprinted request: {"method", "path" (with
// the query), "body"}, the body as its JSON value when it is JSON, else
// {"base64": ...}, null when empty: the same value the Node and Python
// clients fingerprint, so the same request under the same key matches
// whichever client served it.
func RequestJSON(method, path string, body []byte) any {
	var b any
	switch {
	case len(bytes.TrimSpace(body)) == 0:
		b = nil
	case utf8.Valid(body) && json.Valid(body) && !bytes.Contains(body, []byte(`\u0000`)):
		b = json.RawMessage(body)
	default:
		b = map[string]string{"base64": base64.StdEncoding.EncodeToString(body)}
	}
	return struct {
		Method string `json:"method"`
		Path   string `json:"path"`
		Body   any    `json:"body"`
	}{method, path, b}
}

// Info describes the guarded request a handler runs in.
type Info struct {
	Tx       *sql.Tx // the transaction: run the handler's writes on it
	Key      string  // the Idempotency-Key
	Scope    string  // the scope, with the user's part
	Outcome  string  // "new" or "retry"
	Attempts int     // how often the work was started under this key
}

type ctxKey struct{}

// FromContext returns the guarded request's Info (nil outside a guarded
// handler, or when Optional let a request without a key through).
func FromContext(ctx context.Context) *Info {
	i, _ := ctx.Value(ctxKey{}).(*Info)
	return i
}

// Tx returns the guarded request's transaction: the handler runs its
// writes on it, and they commit with the key and the stored answer (nil
// outside a guarded handler).  Do not Commit or Rollback it: the middleware
// does.
func Tx(ctx context.Context) *sql.Tx {
	if i := FromContext(ctx); i != nil {
		return i.Tx
	}
	return nil
}

// detached: a context with ctx's values that is never cancelled.  The
// guarded transaction is begun on it, so database/sql does not roll it back
// under the middleware when the client goes away; the handler still gets the
// request's own context (a query on it is cancelled, the handler answers
// 5xx, and the middleware rolls back).
type detached struct{ context.Context }

func (detached) Deadline() (time.Time, bool) { return time.Time{}, false }
func (detached) Done() <-chan struct{}       { return nil }
func (detached) Err() error                  { return nil }

// Middleware guards a handler with the Idempotency-Key header: see the
// package comment.  It returns the standard middleware shape, for net/http
// (Middleware(db, ...)(handler)), chi (r.With(...)) and anything that takes
// func(http.Handler) http.Handler.
func Middleware(db *sql.DB, opts ...Option) func(http.Handler) http.Handler {
	if db == nil {
		panic("idempotency.Middleware: db is nil")
	}
	c := newConfig(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c.serve(db, next, w, r)
		})
	}
}

func (c *config) serve(db *sql.DB, next http.Handler, w http.ResponseWriter, r *http.Request) {
	key, err := ParseKey(r.Header.Values("Idempotency-Key"))
	if err == ErrKeyMissing && c.optional {
		next.ServeHTTP(w, r)
		return
	}
	_, reqJSON, refused := c.read(r, err)
	if refused != nil {
		send(w, *refused)
		return
	}
	info := &Info{Key: key, Scope: c.scopeFor(r)}
	send(w, c.run(db, info, string(reqJSON), func(tx *sql.Tx) (*capture, error) {
		info.Tx = tx
		cw := newCapture(c.maxResponseBytes)
		next.ServeHTTP(cw, r.WithContext(context.WithValue(r.Context(), ctxKey{}, info)))
		return cw, nil
	}))
}

// read: the request's body (read, and put back for the handler) and the
// fingerprinted request, or the answer that refuses the request (a missing
// or invalid key: keyErr from ParseKey; 413, ...)
func (c *config) read(r *http.Request, keyErr error) (body, reqJSON []byte, refused *answer) {
	refuse := func(a answer) ([]byte, []byte, *answer) { return nil, nil, &a }
	if keyErr == ErrKeyMissing {
		return refuse(problem(400, "Idempotency-Key missing", "This request requires an Idempotency-Key header."))
	}
	if keyErr != nil {
		return refuse(problem(400, "Invalid Idempotency-Key", keyErr.Error()))
	}
	var err error
	if r.Body != nil && r.Body != http.NoBody {
		body, err = io.ReadAll(io.LimitReader(r.Body, c.maxRequestBytes+1))
		if err != nil {
			return refuse(problem(400, "Unreadable request body", err.Error()))
		}
		if int64(len(body)) > c.maxRequestBytes {
			return refuse(problem(413, "Request body too large",
				fmt.Sprintf("A guarded request body is at most %d bytes.", c.maxRequestBytes)))
		}
		r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	var request any
	if c.request != nil {
		request = c.request(r, body)
	} else {
		request = RequestJSON(r.Method, r.URL.RequestURI(), body)
	}
	reqJSON, err = json.Marshal(request)
	if err != nil {
		return refuse(problem(500, "Internal error", "the fingerprinted request is not JSON: "+err.Error()))
	}
	return body, reqJSON, nil
}

// run: the guarded transaction; work runs the handler (a panic in it rolls
// back and goes on up to the framework's recovery)
func (c *config) run(db *sql.DB, info *Info, request string, work func(*sql.Tx) (*capture, error)) answer {
	ctx := detached{context.Background()}
	var ttl any
	if c.ttl > 0 {
		ttl = strconv.FormatInt(c.ttl.Microseconds(), 10) + " microseconds"
	}
	for attempt := 0; ; attempt++ {
		tx, err := db.BeginTx(ctx, c.txOptions)
		if err != nil {
			c.logf("idempotency: begin a transaction: %v", err)
			return problem(503, "Database unavailable", "The database could not be reached; retry later.", "Retry-After", "1")
		}
		if err = checkExtension(ctx, db, tx); err != nil {
			tx.Rollback() //nolint:errcheck // nothing was written
			if SQLState(err) == "" {
				c.logf("idempotency: %v", err)
				return problem(500, "Internal error", "The request could not be guarded.")
			}
		}
		var outcome, status string
		var response sql.NullString
		var attempts sql.NullInt64
		if err == nil {
			_, err = tx.ExecContext(ctx, lockWaitSQL, strconv.FormatInt(c.lockWait.Milliseconds(), 10)+"ms")
		}
		if err == nil {
			err = tx.QueryRowContext(ctx, beginSQL, info.Key, request, info.Scope, ttl).
				Scan(&outcome, &status, &response, &attempts)
		}
		if err != nil {
			tx.Rollback() //nolint:errcheck // the error that matters is err
			code := SQLState(err)
			switch {
			case code == "IK001":
				return problem(422, "Idempotency-Key reused", "This Idempotency-Key was used with a different request.")
			case code == "IK002":
				return problem(409, "Idempotency-Key in use",
					"A request with this Idempotency-Key is being processed; retry later.",
					"Retry-After", strconv.Itoa(retryAfter(ctx, db, info.Key, info.Scope)))
			case code == "IK003":
				return problem(400, "Invalid Idempotency-Key", message(err))
			case retryable(code) && attempt < c.retries:
				time.Sleep(time.Duration(5*(attempt+1)+rand.Intn(20)) * time.Millisecond)
				continue
			case retryable(code):
				return problem(503, "Try again", message(err), "Retry-After", "1")
			}
			c.logf("idempotency: begin key %q in scope %q: %v", info.Key, info.Scope, err)
			return problem(500, "Internal error", "The request could not be guarded.")
		}
		if outcome == "replay" {
			tx.Rollback() //nolint:errcheck // read only: nothing to undo
			return decodeResponse([]byte(response.String), status)
		}
		info.Outcome, info.Attempts = outcome, int(attempts.Int64)
		return c.finish(ctx, tx, info, work)
	}
}

// finish: run the handler in tx, then store its answer and commit, or roll back
func (c *config) finish(ctx context.Context, tx *sql.Tx, info *Info, work func(*sql.Tx) (*capture, error)) answer {
	done := false
	defer func() {
		if !done {
			tx.Rollback() //nolint:errcheck // the handler panicked: its panic goes on
		}
	}()
	cw, err := work(tx)
	done = true
	if err != nil {
		tx.Rollback() //nolint:errcheck // err is what matters
		c.logf("idempotency: key %q in scope %q: %v", info.Key, info.Scope, err)
		return problem(500, "Internal error", err.Error())
	}
	if cw.streamed != "" {
		tx.Rollback() //nolint:errcheck // refused: nothing is stored
		return problem(500, "Streamed response refused", cw.streamed+"; nothing was stored, the writes were rolled back.")
	}
	status, header, body := cw.result()
	sent := answer{status: status, header: header, body: body}
	if !c.store(status) {
		tx.Rollback() //nolint:errcheck // not stored: a resend runs again
		return sent
	}
	resp, err := encodeResponse(status, header, body, c.headers)
	if err == nil {
		_, err = tx.ExecContext(ctx, completeSQL, info.Key, string(resp), info.Scope)
	}
	if err == nil {
		err = tx.Commit()
	} else {
		tx.Rollback() //nolint:errcheck // err is what matters
	}
	if err != nil {
		if retryable(SQLState(err)) {
			return problem(503, "Try again", message(err), "Retry-After", "1")
		}
		c.logf("idempotency: store the answer of key %q in scope %q: %v", info.Key, info.Scope, err)
		return problem(500, "Could not store the response", message(err))
	}
	return sent
}

// retryAfter: seconds before a resend makes sense, from idempotency.lookup
// (1 when it cannot tell)
func retryAfter(ctx context.Context, db *sql.DB, key, scope string) int {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var s sql.NullInt64
	if err := db.QueryRowContext(ctx, lookupSQL, key, scope).Scan(&s); err == nil && s.Int64 > 0 {
		return int(s.Int64)
	}
	return 1
}
