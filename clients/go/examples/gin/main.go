// Example (and conformance server): POST /payments and POST /transfers (phases) on gin and lib/pq,
// guarded by package ginidempotency (idempotency's middleware as a
// gin.HandlerFunc).  The contract is the one of test/clients/driver.js;
// database from DATABASE_HOST/PORT/NAME/USER, prints "listening <port>".
//
// The idempotency-specific lines of the endpoint are marked "// idempotency".
package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"
	idempotency "github.com/idempotency/idempotency-go"
	"github.com/idempotency/idempotency-go/examples/internal/demo"
	"github.com/idempotency/idempotency-go/ginidempotency"
)

func main() {
	gin.SetMode(gin.ReleaseMode)
	db := demo.OpenDB("postgres") // lib/pq
	r := gin.New()
	// a handler's panic: 500 (the guard has rolled back by then)
	r.Use(gin.Recovery())
	r.POST("/payments", ginidempotency.Middleware(db, idempotency.WithScope("payments"), idempotency.WithUser(user)), payment) // idempotency
	// phases (demo.TransferPhases: debit, charge, finish), one line
	r.POST("/transfers", ginidempotency.Phases(db, demo.TransferPhases, transferred, idempotency.WithScope("transfers"), idempotency.WithUser(user), idempotency.WithLease(demo.TransferLease))) // idempotency
	demo.Serve(r)
}

// transferred: the answer of POST /transfers from its phases' state (stored, replayed)
func transferred(c *gin.Context, state idempotency.State) {
	c.Data(http.StatusCreated, "application/json", demo.TransferBody(state))
}

func payment(c *gin.Context) {
	g := ginidempotency.Info(c) // idempotency: g.Tx, g.Key
	var p demo.Payment
	if err := c.ShouldBindJSON(&p); err != nil {
		c.JSON(http.StatusBadRequest, gin.H{"error": err.Error()})
		return
	}
	if p.Decline {
		c.Data(http.StatusPaymentRequired, "application/json", []byte(`{"error":"card_declined"}`))
		return
	}
	var id int64
	if err := g.Tx.QueryRowContext(c.Request.Context(),
		"INSERT INTO payment (idem_key, amount) VALUES ($1, $2) RETURNING id", g.Key, p.AmountValue()).Scan(&id); err != nil {
		panic(err)
	}
	if p.Sleep > 0 {
		if _, err := g.Tx.ExecContext(c.Request.Context(), "SELECT pg_sleep($1)", p.Sleep); err != nil {
			panic(err)
		}
	}
	if p.Boom {
		panic(errors.New("boom")) // rolled back with the insert, not stored; gin.Recovery answers 500
	}
	if p.Throttle && demo.FirstThrottle(g.Key) { // 429: rolled back, not stored
		c.Header("Retry-After", "1")
		c.JSON(http.StatusTooManyRequests, gin.H{"error": "rate_limited"})
		return
	}
	if p.Stream { // a streamed answer (c.Stream flushes): the guard refuses it (500, rolled back, not stored)
		n := 0
		c.Stream(func(w io.Writer) bool { n++; fmt.Fprintf(w, "chunk %d\n", n); return n < 2 })
		return
	}
	if p.Binary {
		c.Data(http.StatusOK, "application/octet-stream", demo.BinaryBody(id))
		return
	}
	c.Header("Location", "/payments/"+strconv.FormatInt(id, 10))
	c.Data(http.StatusCreated, "application/json", p.PaidBody(id))
}

// user: the authenticated user (here the X-User header): each user's keys
// are their own (idempotency.WithUser)
func user(r *http.Request) string { return r.Header.Get("X-User") }
