package idempotency_test

// RunPhases and PhasesHandler against a real PostgreSQL (DATABASE_*, as
// test/go/run sets them), with lib/pq and pgx's stdlib driver, over real
// HTTP (httptest.Server) for PhasesHandler.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idempotency "github.com/idempotency/idempotency-go"
)

// stepCounts: the go_item rows of a key by note, and its key row's status
func stepCounts(t *testing.T, db *sql.DB, key string) (notes map[string]int, status string) {
	t.Helper()
	rows, err := db.Query("SELECT note, count(*) FROM go_item WHERE idem_key = $1 GROUP BY note", key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	notes = map[string]int{}
	for rows.Next() {
		var n string
		var c int
		if err := rows.Scan(&n, &c); err != nil {
			t.Fatal(err)
		}
		notes[n] = c
	}
	db.QueryRow("SELECT status FROM idempotency.idempotency_key WHERE key = $1", key).Scan(&status) //nolint:errcheck // "" when there is none
	return notes, status
}

// insert: a database phase that writes one go_item row noted with its name
func insert(name string) func(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
	return func(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
		_, err := p.Tx.ExecContext(ctx, "INSERT INTO go_item (idem_key, note) VALUES ($1, $2)", p.Key, name)
		return map[string]any{"done": name, "attempt": p.Attempt}, err
	}
}

func TestRunPhases(t *testing.T) {
	for _, driver := range []string{"postgres", "pgx"} {
		driver := driver
		t.Run(driver, func(t *testing.T) { testRunPhases(t, driver) })
	}
}

func testRunPhases(t *testing.T, driver string) {
	db := open(t, driver)
	defer db.Close()
	P := prefix + "phases-" + driver + "-"
	ctx := context.Background()

	t.Run("new: each phase commits with its checkpoint, the last completes; then a replay runs nothing", func(t *testing.T) {
		k := P + "new"
		var derived []string
		var commits []string
		ran := 0
		opts := idempotency.PhasesOptions{
			Key: k, Scope: "ph", Request: map[string]any{"amount": "12.50"},
			Phases: []idempotency.Phase{
				{Name: "debit", Run: func(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
					ran++
					if p.Outcome != "new" || p.Attempt != 1 || string(p.Request) != `{"amount":"12.50"}` {
						return nil, fmt.Errorf("context: %+v", p)
					}
					return insert("debit")(ctx, p)
				}},
				{Name: "charge", External: true, Run: func(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
					ran++
					if p.Tx != nil {
						return nil, errors.New("an external phase got a transaction")
					}
					var d struct{ Done string }
					if err := p.State.Get("debit", &d); err != nil || d.Done != "debit" {
						return nil, fmt.Errorf("state: %v %+v", err, d)
					}
					a, err := p.DeriveKey(ctx, "charge")
					b, _ := p.DeriveKey(ctx, "charge")
					derived = append(derived, a, b)
					return map[string]string{"charge_id": "ch_1"}, err
				}},
				{Name: "finish", Run: func(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
					ran++
					return insert("finish")(ctx, p)
				}},
			},
			Response: func(s idempotency.State) (any, error) {
				var c struct {
					ChargeID string `json:"charge_id"`
				}
				err := s.Get("charge", &c)
				return map[string]string{"charge": c.ChargeID}, err
			},
			AfterCommit: func(name string) { commits = append(commits, name) },
		}
		res, err := idempotency.RunPhases(ctx, db, opts)
		if err != nil || res.Outcome != "new" || res.Attempts != 1 || string(res.Response) != `{"charge":"ch_1"}` {
			t.Fatalf("res=%+v %s err=%v", res, res.Response, err)
		}
		if strings.Join(commits, ",") != "(begin),debit,charge,(complete)" {
			t.Fatalf("commits %v", commits)
		}
		var want string
		if err := db.QueryRow("SELECT idempotency.derive_key($1, 'charge', 'ph')", k).Scan(&want); err != nil || derived[0] != want || derived[1] != want {
			t.Fatalf("derived %v, derive_key() %q (%v)", derived, want, err)
		}
		notes, status := stepCounts(t, db, k)
		if notes["debit"] != 1 || notes["finish"] != 1 || status != "completed" || ran != 3 {
			t.Fatalf("notes %v status %q ran %d", notes, status, ran)
		}
		res2, err := idempotency.RunPhases(ctx, db, opts)
		if err != nil || !res2.Replayed() || res2.Status != "completed" || string(res2.Response) != `{"charge": "ch_1"}` || ran != 3 {
			t.Fatalf("replay %+v %s err=%v ran=%d", res2, res2.Response, err, ran)
		}
	})

	t.Run("a phase's error rolls it back and fails the key retryably; the resend resumes after the last point", func(t *testing.T) {
		k := P + "resume"
		fail := true
		runs := map[string]int{}
		opts := idempotency.PhasesOptions{Key: k, Request: "r", Lease: time.Second,
			Phases: []idempotency.Phase{
				{Name: "one", Run: func(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
					runs["one"]++
					return insert("one")(ctx, p)
				}},
				{Name: "two", Run: func(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
					runs["two"]++
					if _, err := insert("two")(ctx, p); err != nil {
						return nil, err
					}
					if fail {
						return nil, errors.New("downstream timeout")
					}
					return p.State, nil
				}},
			},
			Response: func(s idempotency.State) (any, error) { return s, nil },
		}
		_, err := idempotency.RunPhases(ctx, db, opts)
		notes, status := stepCounts(t, db, k)
		if err == nil || err.Error() != "downstream timeout" || notes["one"] != 1 || notes["two"] != 0 || status != "failed" {
			t.Fatalf("err=%v notes=%v status=%q", err, notes, status)
		}
		fail = false
		res, err := idempotency.RunPhases(ctx, db, opts)
		notes, status = stepCounts(t, db, k)
		if err != nil || res.Outcome != "retry" || res.ResumedFrom != "one" || res.Attempts != 2 || runs["one"] != 1 || runs["two"] != 2 ||
			notes["one"] != 1 || notes["two"] != 1 || status != "completed" {
			t.Fatalf("res=%+v err=%v runs=%v notes=%v status=%q", res, err, runs, notes, status)
		}
		// the state of phase one came back from the recovery point
		var st map[string]map[string]any
		if json.Unmarshal(res.Response, &st) != nil || st["two"]["one"] == nil {
			t.Fatalf("response %s", res.Response)
		}
	})

	t.Run("a permanent error rolls its phase back and is stored: replayed as failed", func(t *testing.T) {
		k := P + "permanent"
		ran := 0
		opts := idempotency.PhasesOptions{Key: k,
			Phases: []idempotency.Phase{{Name: "one", Run: func(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
				ran++
				insert("one")(ctx, p) //nolint:errcheck
				return nil, idempotency.Permanent(errors.New("card declined"))
			}}},
			Response: func(s idempotency.State) (any, error) { return s, nil },
		}
		_, err := idempotency.RunPhases(ctx, db, opts)
		var pe *idempotency.PhaseError
		if !errors.As(err, &pe) || !pe.Permanent {
			t.Fatalf("err %v", err)
		}
		res, err := idempotency.RunPhases(ctx, db, opts)
		notes, status := stepCounts(t, db, k)
		if err != nil || !res.Replayed() || res.Status != "failed" || string(res.Response) != `{"error": "card declined"}` || ran != 1 || len(notes) != 0 || status != "failed" {
			t.Fatalf("res=%+v %s err=%v ran=%d notes=%v status=%q", res, res.Response, err, ran, notes, status)
		}
	})

	t.Run("another request under the key: ErrMismatch (IK001); an invalid key: ErrInvalidKey", func(t *testing.T) {
		k := P + "mismatch"
		opts := idempotency.PhasesOptions{Key: k, Request: 1,
			Phases:   []idempotency.Phase{{Name: "one", Run: insert("one")}},
			Response: func(s idempotency.State) (any, error) { return 1, nil }}
		if _, err := idempotency.RunPhases(ctx, db, opts); err != nil {
			t.Fatal(err)
		}
		opts.Request = 2
		_, err := idempotency.RunPhases(ctx, db, opts)
		if !errors.Is(err, idempotency.ErrMismatch) || idempotency.HTTPStatus(err) != 422 {
			t.Fatalf("err %v", err)
		}
		opts.Key = strings.Repeat("k", 300)
		if _, err := idempotency.RunPhases(ctx, db, opts); !errors.Is(err, idempotency.ErrInvalidKey) {
			t.Fatalf("err %v", err)
		}
		if notes, _ := stepCounts(t, db, opts.Key); len(notes) != 0 {
			t.Fatalf("notes %v", notes)
		}
	})

	t.Run("the lease is renewed while a phase runs: a duplicate gets ErrInProgress with RetryAfter", func(t *testing.T) {
		k := P + "busy"
		inside, release := make(chan struct{}), make(chan struct{})
		// (a lease of 1.5 s renewed every 100 ms: only a renewal late by
		// more than 1.4 s, on a loaded machine through PgBouncer, lets the
		// duplicate take the key over)
		opts := idempotency.PhasesOptions{Key: k, Lease: 1500 * time.Millisecond, RenewEvery: 100 * time.Millisecond,
			Phases: []idempotency.Phase{{Name: "slow", External: true, Run: func(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
				close(inside)
				<-release
				return nil, nil
			}}},
			Response: func(s idempotency.State) (any, error) { return "ok", nil }}
		done := make(chan error)
		go func() { _, err := idempotency.RunPhases(ctx, db, opts); done <- err }()
		<-inside
		time.Sleep(3100 * time.Millisecond) // more than twice the lease
		opts2 := opts
		opts2.Phases = []idempotency.Phase{{Name: "slow", Run: insert("dup")}}
		_, err := idempotency.RunPhases(ctx, db, opts2)
		var e *idempotency.Error
		if !errors.Is(err, idempotency.ErrInProgress) || !errors.As(err, &e) || e.RetryAfter < 1 {
			t.Fatalf("duplicate: %v", err)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if notes, status := stepCounts(t, db, k); len(notes) != 0 || status != "completed" {
			t.Fatalf("notes %v status %q", notes, status)
		}
	})

	t.Run("taken over after the lease lapsed: the renewal cancels the phase, its writes roll back, ErrNotHeld", func(t *testing.T) {
		k := P + "takeover"
		inside := make(chan struct{})
		var first atomic.Int32
		opts := idempotency.PhasesOptions{Key: k, Lease: 200 * time.Millisecond, RenewEvery: 800 * time.Millisecond,
			Phases: []idempotency.Phase{{Name: "one", Run: func(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
				if first.Add(1) == 1 {
					insert("zombie")(ctx, p) //nolint:errcheck
					close(inside)
					select { // held until the renewal finds the key taken over
					case <-ctx.Done():
						return nil, ctx.Err()
					case <-time.After(5 * time.Second):
						return nil, errors.New("not cancelled")
					}
				}
				return insert("new")(ctx, p)
			}}},
			Response: func(s idempotency.State) (any, error) { return "ok", nil }}
		done := make(chan error)
		go func() { _, err := idempotency.RunPhases(ctx, db, opts); done <- err }()
		<-inside
		time.Sleep(400 * time.Millisecond) // the lease (200 ms) lapses
		res, err := idempotency.RunPhases(ctx, db, opts)
		if err != nil || res.Outcome != "retry" || res.Attempts != 2 {
			t.Fatalf("takeover: %+v %v", res, err)
		}
		err = <-done
		notes, status := stepCounts(t, db, k)
		if !errors.Is(err, idempotency.ErrNotHeld) || notes["zombie"] != 0 || notes["new"] != 1 || status != "completed" {
			t.Fatalf("first attempt: %v notes %v status %q", err, notes, status)
		}
	})

	t.Run("options are checked", func(t *testing.T) {
		for _, o := range []idempotency.PhasesOptions{
			{Key: "x", Response: func(idempotency.State) (any, error) { return 1, nil }},
			{Key: "x", Phases: []idempotency.Phase{{Name: "a", Run: insert("a")}}},
			{Key: "x", Phases: []idempotency.Phase{{Name: "a", Run: insert("a")}, {Name: "a", Run: insert("a")}},
				Response: func(idempotency.State) (any, error) { return 1, nil }},
		} {
			if _, err := idempotency.RunPhases(ctx, db, o); err == nil || !strings.HasPrefix(err.Error(), "idempotency.RunPhases:") {
				t.Fatalf("%+v: %v", o, err)
			}
		}
	})
}

func TestPhasesHandler(t *testing.T) {
	for _, driver := range []string{"postgres", "pgx"} {
		driver := driver
		t.Run(driver, func(t *testing.T) { testPhasesHandler(t, driver) })
	}
}

// phasesServer: POST / runs phases "debit" (database), "charge" (external)
// and "finish" (database) with switches from the body
type phasesServer struct {
	*httptest.Server
	mu     sync.Mutex
	runs   map[string]int // key|phase -> runs
	inside chan struct{}
}

type phasesBody struct {
	Amount      string `json:"amount"`
	Decline     bool   `json:"decline"`
	Fail        string `json:"fail"`    // phase that returns an error the first time
	Respond     int    `json:"respond"` // the answer's status
	Stream      bool   `json:"stream"`
	Hold        bool   `json:"hold"`
	PermanentTo bool   `json:"permanent"`
	Zombie      bool   `json:"zombie"` // debit's first run waits for its context's cancellation
}

func newPhasesServer(t *testing.T, db *sql.DB, opts ...idempotency.Option) *phasesServer {
	s := &phasesServer{runs: map[string]int{}, inside: make(chan struct{}, 10)}
	body := func(p *idempotency.PhaseContext) phasesBody {
		var b phasesBody
		json.Unmarshal(p.Body, &b) //nolint:errcheck
		return b
	}
	count := func(p *idempotency.PhaseContext, name string) int {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.runs[p.Key+"|"+name]++
		return s.runs[p.Key+"|"+name]
	}
	phase := func(name string, external bool) idempotency.Phase {
		return idempotency.Phase{Name: name, External: external, Run: func(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
			n, b := count(p, name), body(p)
			if !external {
				if _, err := insert(name)(ctx, p); err != nil {
					return nil, err
				}
			}
			if name == "debit" && b.Decline {
				return nil, idempotency.Refuse(402, map[string]string{"error": "card_declined"})
			}
			if name == "debit" && b.PermanentTo {
				return nil, idempotency.Permanent(errors.New("card expired"))
			}
			if name == "debit" && b.Zombie && n == 1 {
				s.inside <- struct{}{}
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(5 * time.Second):
					return nil, errors.New("not cancelled")
				}
			}
			if name == "debit" && b.Hold {
				s.inside <- struct{}{}
				time.Sleep(1500 * time.Millisecond)
			}
			if b.Fail == name && n == 1 {
				return nil, errors.New("phase " + name + " failed")
			}
			if name == "charge" {
				k, err := p.DeriveKey(ctx, "charge")
				return map[string]string{"charge_id": "ch_" + k[:8]}, err
			}
			return map[string]string{"amount": b.Amount}, nil
		}}
	}
	phases := []idempotency.Phase{phase("debit", false), phase("charge", true), phase("finish", false)}
	h := idempotency.PhasesHandler(db, phases, func(w http.ResponseWriter, r *http.Request, state idempotency.State) {
		var b phasesBody
		json.NewDecoder(r.Body).Decode(&b) //nolint:errcheck
		var c struct {
			ChargeID string `json:"charge_id"`
		}
		state.Get("charge", &c) //nolint:errcheck
		if b.Stream {
			w.Write([]byte("part"))
			w.(http.Flusher).Flush()
			return
		}
		status := 201
		if b.Respond != 0 && s.count(r.Header.Get("Idempotency-Key"), "respond") == 1 {
			status = b.Respond
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/transfers/"+c.ChargeID)
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"status":"done","charge_id":%q,"amount":%q}`, c.ChargeID, b.Amount)
	}, opts...)
	s.Server = httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s
}

func (s *phasesServer) count(key, name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs[key+"|"+name]++
	return s.runs[key+"|"+name]
}

func (s *phasesServer) ran(key, name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[key+"|"+name]
}

func testPhasesHandler(t *testing.T, driver string) {
	db := open(t, driver)
	defer db.Close()
	P := prefix + "ph-http-" + driver + "-"
	s := newPhasesServer(t, db, idempotency.WithScope("transfers"), idempotency.WithUser(func(r *http.Request) string { return r.Header.Get("X-User") }),
		idempotency.WithLease(time.Second))

	t.Run("first: 201 after three phases; replay byte-identical with Idempotent-Replayed; nothing runs again", func(t *testing.T) {
		k := P + "first"
		a := post(t, s.URL, k, `{"amount":"12.50"}`)
		b := post(t, s.URL, `"`+k+`"`, `{"amount": "12.50"}`)
		notes, status := stepCounts(t, db, k)
		if a.status != 201 || replayed(a) || !replayed(b) || !same(a, b) || notes["debit"] != 1 || notes["finish"] != 1 || status != "completed" {
			t.Fatalf("a=%d %s b=%d %s notes=%v status=%q", a.status, a.body, b.status, b.body, notes, status)
		}
		if s.ran(k, "debit") != 1 || s.ran(k, "charge") != 1 || s.ran(k, "finish") != 1 {
			t.Fatalf("runs %v", s.runs)
		}
		var scope string
		db.QueryRow("SELECT scope FROM idempotency.idempotency_key WHERE key = $1", k).Scan(&scope) //nolint:errcheck
		if scope != "transfers" {
			t.Fatalf("scope %q", scope)
		}
		// another user: a key space of its own
		c := post(t, s.URL, k, `{"amount":"12.50"}`, "X-User", "u1")
		if c.status != 201 || replayed(c) {
			t.Fatalf("another user: %d %s", c.status, c.body)
		}
	})

	t.Run("a missing or malformed key: 400, nothing runs", func(t *testing.T) {
		for _, k := range []string{"", `"unterminated`, strings.Repeat("k", 256)} {
			r := post(t, s.URL, k, `{"amount":"1"}`)
			if r.status != 400 || r.header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("key %q: %d %s", k, r.status, r.body)
			}
		}
	})

	t.Run("another body under the key: 422", func(t *testing.T) {
		k := P + "mismatch"
		post(t, s.URL, k, `{"amount":"1"}`)
		r := post(t, s.URL, k, `{"amount":"2"}`)
		if notes, _ := stepCounts(t, db, k); r.status != 422 || notes["debit"] != 1 {
			t.Fatalf("%d %s notes %v", r.status, r.body, notes)
		}
	})

	t.Run("a duplicate while a phase runs: 409 with Retry-After", func(t *testing.T) {
		k := P + "busy"
		done := make(chan resp)
		go func() { done <- post(t, s.URL, k, `{"amount":"1","hold":true}`) }()
		<-s.inside
		r := post(t, s.URL, k, `{"amount":"1","hold":true}`)
		ra, _ := strconv.Atoi(r.header.Get("Retry-After"))
		first := <-done
		if r.status != 409 || ra < 1 || first.status != 201 || s.ran(k, "debit") != 1 {
			t.Fatalf("dup %d %q %s; first %d", r.status, r.header.Get("Retry-After"), r.body, first.status)
		}
	})

	t.Run("Refuse: a permanent answer (402), its phase rolled back, stored and replayed", func(t *testing.T) {
		k := P + "decline"
		a := post(t, s.URL, k, `{"decline":true}`)
		b := post(t, s.URL, k, `{"decline":true}`)
		notes, status := stepCounts(t, db, k)
		if a.status != 402 || string(a.body) != `{"error":"card_declined"}` || a.header.Get("Content-Type") != "application/json" ||
			!replayed(b) || !same(a, b) || len(notes) != 0 || status != "failed" || s.ran(k, "debit") != 1 {
			t.Fatalf("a=%d %s b=%d %s notes=%v status=%q", a.status, a.body, b.status, b.body, notes, status)
		}
	})

	t.Run("Permanent(err): 400 {\"error\": message}, stored and replayed", func(t *testing.T) {
		k := P + "permanent"
		a := post(t, s.URL, k, `{"permanent":true}`)
		b := post(t, s.URL, k, `{"permanent":true}`)
		if a.status != 400 || string(a.body) != `{"error":"card expired"}` || a.header.Get("Content-Type") != "application/json" ||
			!replayed(b) || !same(a, b) || s.ran(k, "debit") != 1 {
			t.Fatalf("a=%d %s b=%d %s", a.status, a.body, b.status, b.body)
		}
	})

	t.Run("a phase's error: 500, not stored; the resend resumes after the last finished phase", func(t *testing.T) {
		for _, phase := range []string{"charge", "finish"} {
			k := P + "fail-" + phase
			a := post(t, s.URL, k, `{"amount":"3","fail":"`+phase+`"}`)
			b := post(t, s.URL, k, `{"amount":"3","fail":"`+phase+`"}`)
			c := post(t, s.URL, k, `{"amount":"3","fail":"`+phase+`"}`)
			notes, status := stepCounts(t, db, k)
			if a.status != 500 || replayed(a) || b.status != 201 || replayed(b) || !replayed(c) || !same(b, c) ||
				s.ran(k, "debit") != 1 || s.ran(k, phase) != 2 || notes["debit"] != 1 || notes["finish"] != 1 || status != "completed" {
				t.Fatalf("%s: a=%d %s b=%d c=%d runs debit %d %s %d notes %v status %q", phase, a.status, a.body, b.status, c.status,
					s.ran(k, "debit"), phase, s.ran(k, phase), notes, status)
			}
		}
	})

	t.Run("an answer that is not stored (503): sent, the key failed retryably; the resend answers 201", func(t *testing.T) {
		k := P + "unstored"
		a := post(t, s.URL, k, `{"amount":"4","respond":503}`)
		_, status := stepCounts(t, db, k)
		b := post(t, s.URL, k, `{"amount":"4","respond":503}`)
		notes, status2 := stepCounts(t, db, k)
		if a.status != 503 || replayed(a) || status != "failed" || b.status != 201 || replayed(b) ||
			notes["finish"] != 1 || status2 != "completed" || s.ran(k, "finish") != 2 {
			t.Fatalf("a=%d %s %q b=%d %s notes %v %q", a.status, a.body, status, b.status, b.body, notes, status2)
		}
	})

	t.Run("a streamed answer is refused: 500, not stored", func(t *testing.T) {
		k := P + "stream"
		a := post(t, s.URL, k, `{"stream":true}`)
		notes, status := stepCounts(t, db, k)
		if a.status != 500 || !strings.Contains(string(a.body), "Streamed response refused") || notes["finish"] != 0 || status != "failed" {
			t.Fatalf("%d %s notes %v status %q", a.status, a.body, notes, status)
		}
	})
}

func TestPhasesHandlerTakeover(t *testing.T) {
	db := open(t, "pgx")
	defer db.Close()
	s := newPhasesServer(t, db, idempotency.WithLease(200*time.Millisecond), idempotency.WithRenewEvery(900*time.Millisecond))
	k := prefix + "ph-http-takeover"
	done := make(chan resp)
	go func() { done <- post(t, s.URL, k, `{"amount":"5","zombie":true}`) }()
	<-s.inside
	time.Sleep(400 * time.Millisecond) // the first attempt's lease (200 ms) lapses
	b := post(t, s.URL, k, `{"amount":"5","zombie":true}`)
	a := <-done // its renewal found the key taken over: its debit was cancelled and rolled back
	c := post(t, s.URL, k, `{"amount":"5","zombie":true}`)
	notes, status := stepCounts(t, db, k)
	ra, _ := strconv.Atoi(a.header.Get("Retry-After"))
	if b.status != 201 || a.status != 409 || ra < 1 || !replayed(c) || !same(b, c) ||
		notes["debit"] != 1 || notes["finish"] != 1 || status != "completed" || s.ran(k, "debit") != 2 {
		t.Fatalf("old %d %s, new %d %s, replay %d; notes %v status %q", a.status, a.body, b.status, b.body, c.status, notes, status)
	}
}
