// Example (and conformance server): POST /payments and POST /transfers (phases) on plain net/http and
// lib/pq, guarded by package idempotency.  The contract is the one of
// test/clients/driver.js; database from DATABASE_HOST/PORT/NAME/USER,
// prints "listening <port>".
//
// The idempotency-specific lines of the endpoint are marked "// idempotency".
package main

import (
	"encoding/json"
	"net/http"
	"strconv"

	idempotency "github.com/idempotency/idempotency-go"
	"github.com/idempotency/idempotency-go/examples/internal/demo"
)

func main() {
	db := demo.OpenDB("postgres") // lib/pq
	mux := http.NewServeMux()
	mux.Handle("/payments", postOnly(idempotency.Middleware(db, idempotency.WithScope("payments"), idempotency.WithUser(user))(http.HandlerFunc(payment)))) // idempotency
	// phases (demo.TransferPhases: debit, charge, finish), one line
	mux.Handle("/transfers", postOnly(idempotency.PhasesHandler(db, demo.TransferPhases, transferred, idempotency.WithScope("transfers"), idempotency.WithUser(user), idempotency.WithLease(demo.TransferLease)))) // idempotency
	demo.Serve(mux)
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
	err := g.Tx.QueryRowContext(r.Context(),
		"INSERT INTO payment (idem_key, amount) VALUES ($1, $2) RETURNING id", g.Key, p.AmountValue()).Scan(&id)
	if err == nil && p.Sleep > 0 {
		_, err = g.Tx.ExecContext(r.Context(), "SELECT pg_sleep($1)", p.Sleep)
	}
	if err != nil || p.Boom { // a 5xx: rolled back with the insert, not stored
		http.Error(w, "payment failed", http.StatusInternalServerError)
		return
	}
	if p.Throttle && demo.FirstThrottle(g.Key) { // 429: rolled back, not stored
		w.Header().Set("Retry-After", "1")
		http.Error(w, `{"error":"rate_limited"}`, http.StatusTooManyRequests)
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

func postOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// user: the authenticated user (here the X-User header): each user's keys
// are their own (idempotency.WithUser)
func user(r *http.Request) string { return r.Header.Get("X-User") }
