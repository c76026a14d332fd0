// Package demo is what the three example servers (examples/nethttp, chi,
// gin) share and that is no part of the idempotency integration: the
// database from the environment, the payment request of the conformance
// contract (test/clients/driver.js), and "listening <port>".
package demo

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/stdlib"
	_ "github.com/lib/pq" // database/sql driver "postgres"
)

// OpenDB opens the database named by DATABASE_HOST/PORT/NAME/USER with
// driver "postgres" (lib/pq) or "pgx" (pgx v4's stdlib).  Behind PgBouncer
// in transaction mode (IDEMPOTENCY_BOUNCER=1) pgx keeps no named prepared
// statements (statement_cache_mode=describe: the unnamed statement only;
// values still go as parameters, never into the SQL text), and lib/pq sends
// a query with parameters in one round trip (binary_parameters=yes: Parse,
// Bind, Execute, Sync; without it an autocommit query is Parse+Sync then
// Bind+Execute+Sync, and PgBouncer may run the second half on another
// server: "unnamed prepared statement does not exist").
func OpenDB(driver string) *sql.DB {
	dsn := fmt.Sprintf("host=%s port=%s dbname=%s user=%s sslmode=disable",
		os.Getenv("DATABASE_HOST"), os.Getenv("DATABASE_PORT"), os.Getenv("DATABASE_NAME"), os.Getenv("DATABASE_USER"))
	var db *sql.DB
	switch driver {
	case "pgx":
		if os.Getenv("IDEMPOTENCY_BOUNCER") == "1" {
			dsn += " statement_cache_mode=describe"
		}
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			panic(err)
		}
		db = stdlib.OpenDB(*cfg)
	default:
		if os.Getenv("IDEMPOTENCY_BOUNCER") == "1" {
			dsn += " binary_parameters=yes"
		}
		var err error
		if db, err = sql.Open("postgres", dsn); err != nil {
			panic(err)
		}
	}
	db.SetMaxOpenConns(10)
	db.SetMaxIdleConns(10)
	db.SetConnMaxIdleTime(time.Minute)
	return db
}

// Serve listens on 127.0.0.1:$PORT (0: any free port), prints
// "listening <port>" and serves h.
func Serve(h http.Handler) {
	port := os.Getenv("PORT")
	if port == "" {
		port = "0"
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		panic(err)
	}
	fmt.Printf("listening %d\n", l.Addr().(*net.TCPAddr).Port)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 30 * time.Second}
	panic(srv.Serve(l))
}

// Payment is the request body: {"amount": x} and the test switches.
type Payment struct {
	Amount   json.RawMessage `json:"amount"`
	Sleep    float64         `json:"sleep"`
	Decline  bool            `json:"decline"`
	Boom     bool            `json:"boom"`
	Binary   bool            `json:"binary"`
	Throttle bool            `json:"throttle"`
	Stream   bool            `json:"stream"`
}

// AmountValue is the amount as the numeric column's parameter (nil: NULL).
func (p Payment) AmountValue() any {
	var s string
	if json.Unmarshal(p.Amount, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(p.Amount, &n) == nil {
		return n.String()
	}
	return nil
}

// PaidBody is the 201 body, written byte for byte.
func (p Payment) PaidBody(id int64) []byte {
	var amount bytes.Buffer
	if json.Compact(&amount, p.Amount) != nil || amount.Len() == 0 {
		amount.WriteString("null")
	}
	return []byte(`{"status":"paid","id":` + strconv.FormatInt(id, 10) + `,"amount":` + amount.String() + `,"note":"café ✓"}`)
}

// BinaryBody: bytes ff 00 fe and the id, a body that is not UTF-8 and has a NUL.
func BinaryBody(id int64) []byte { return append([]byte{0xff, 0, 0xfe}, strconv.FormatInt(id, 10)...) }

var throttled sync.Map

// FirstThrottle reports whether this is the first time the server sees key
// with {"throttle": true} (answered 429, not stored).
func FirstThrottle(key string) bool {
	_, seen := throttled.LoadOrStore(key, true)
	return !seen
}
