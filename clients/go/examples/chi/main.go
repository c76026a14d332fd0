// Example (and conformance server): POST /payments and POST /transfers (phases) on chi and pgx v4's
// database/sql driver (stdlib), guarded by package idempotency: chi takes
// idempotency.Middleware as it is (r.With).  The contract is the one of
// test/clients/driver.js; database from DATABASE_HOST/PORT/NAME/USER,
// prints "listening <port>".
//
// The idempotency-specific lines of the endpoint are marked "// idempotency".
package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	idempotency "github.com/idempotency/idempotency-go"
	"github.com/idempotency/idempotency-go/examples/internal/demo"
)

func main() {
	db := demo.OpenDB("pgx") // pgx v4 stdlib
	r := chi.NewRouter()
	// a handler's panic: 500 (the guard has rolled back by then)
	r.Use(middleware.Recoverer)
	r.With(idempotency.Middleware(db, idempotency.WithScope("payments"), idempotency.WithUser(user))).Post("/payments", payment) // idempotency
	// phases (demo.TransferPhases: debit, charge, finish), one line
	r.Method("POST", "/transfers", idempotency.PhasesHandler(db, demo.TransferPhases, transferred, idempotency.WithScope("transfers"), idempotency.WithUser(user), idempotency.WithLease(demo.TransferLease))) // idempotency
	demo.Serve(r)
}

// transferred: the answer of POST /transfers from its phases' state (stored, replayed)
func transferred(w http.ResponseWriter, r *http.Request, state idempotency.State) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(demo.TransferBody(state))
}

func payment(w http.ResponseWriter, r *http.Request) {
	g := idempotency.FromContext(r.Context()) // idempotency: g.Tx, g.Key
	var p demo.Payment
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if p.Decline {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusPaymentRequired)
		w.Write([]byte(`{"error":"card_declined"}`))
		return
	}
	var id int64
	if err := g.Tx.QueryRowContext(r.Context(),
		"INSERT INTO payment (idem_key, amount) VALUES ($1, $2) RETURNING id", g.Key, p.AmountValue()).Scan(&id); err != nil {
		panic(err)
	}
	if p.Sleep > 0 {
		if _, err := g.Tx.ExecContext(r.Context(), "SELECT pg_sleep($1)", p.Sleep); err != nil {
			panic(err)
		}
	}
	if p.Boom {
		panic(errors.New("boom")) // rolled back with the insert, not stored; Recoverer answers 500
	}
	if p.Throttle && demo.FirstThrottle(g.Key) { // 429: rolled back, not stored
		w.Header().Set("Retry-After", "1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write([]byte(`{"error":"rate_limited"}`))
		return
	}
	if p.Stream { // a streamed answer: the guard refuses it (500, rolled back, not stored)
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte("chunk 1\n"))
		w.(http.Flusher).Flush()
		w.Write([]byte("chunk 2\n"))
		return
	}
	if p.Binary {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(demo.BinaryBody(id))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+strconv.FormatInt(id, 10))
	w.WriteHeader(http.StatusCreated)
	w.Write(p.PaidBody(id))
}

// user: the authenticated user (here the X-User header): each user's keys
// are their own (idempotency.WithUser)
func user(r *http.Request) string { return r.Header.Get("X-User") }
