package ginidempotency_test

// The gin adapter against a real PostgreSQL over real HTTP (DATABASE_*, as
// test/go/run sets them): gin's handler chain runs inside the guard.

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	_ "github.com/lib/pq"

	idempotency "github.com/idempotency/idempotency-go"
	"github.com/idempotency/idempotency-go/ginidempotency"
)

func TestGin(t *testing.T) {
	if os.Getenv("DATABASE_HOST") == "" {
		t.Fatal("DATABASE_HOST/PORT/NAME/USER must name a database with the extension (test/go/run sets them)")
	}
	dsn := fmt.Sprintf("host=%s port=%s dbname=%s user=%s sslmode=disable",
		os.Getenv("DATABASE_HOST"), os.Getenv("DATABASE_PORT"), os.Getenv("DATABASE_NAME"), os.Getenv("DATABASE_USER"))
	if os.Getenv("IDEMPOTENCY_BOUNCER") == "1" {
		dsn += " binary_parameters=yes" // lib/pq behind PgBouncer: one round trip per query
	}
	db, err := sql.Open("postgres", dsn)
	if err == nil {
		_, err = db.Exec("CREATE TABLE IF NOT EXISTS go_gin_item (id bigserial PRIMARY KEY, idem_key text NOT NULL)")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.RecoveryWithWriter(io.Discard)) // answers 500; the stack is not shown
	// handlers after the guarded one: never run for a replay
	after := 0
	r.POST("/items", ginidempotency.Middleware(db, idempotency.WithScope("gin")), func(c *gin.Context) {
		g := ginidempotency.Info(c)
		var id int64
		if err := ginidempotency.Tx(c).QueryRowContext(c.Request.Context(),
			"INSERT INTO go_gin_item (idem_key) VALUES ($1) RETURNING id", g.Key).Scan(&id); err != nil {
			panic(err)
		}
		switch c.Query("do") {
		case "panic":
			panic("boom")
		case "status":
			c.Status(http.StatusAccepted) // a status and no body
		case "abort":
			c.AbortWithStatusJSON(http.StatusServiceUnavailable, gin.H{"error": "down"})
		case "stream":
			c.Stream(func(w io.Writer) bool { w.Write([]byte("chunk")); return false })
		default:
			c.Header("Location", fmt.Sprintf("/items/%d", id))
			c.JSON(http.StatusCreated, gin.H{"id": id})
		}
	}, func(c *gin.Context) { after++ })
	// phases: a database phase and an external one; Refuse for {"a":2}
	r.POST("/transfers", ginidempotency.Phases(db, []idempotency.Phase{
		{Name: "debit", Run: func(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
			if _, err := p.Tx.ExecContext(ctx, "INSERT INTO go_gin_item (idem_key) VALUES ($1)", p.Key); err != nil {
				return nil, err
			}
			if string(p.Body) == `{"a":2}` {
				return nil, idempotency.Refuse(http.StatusPaymentRequired, gin.H{"error": "card_declined"})
			}
			return p.HTTP.URL.Path, nil
		}},
		{Name: "charge", External: true, Run: func(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
			return p.DeriveKey(ctx, "charge")
		}},
	}, func(c *gin.Context, state idempotency.State) {
		var path, charge string
		state.Get("debit", &path)    //nolint:errcheck
		state.Get("charge", &charge) //nolint:errcheck
		c.Header("Location", "/transfers/1")
		c.JSON(http.StatusCreated, gin.H{"path": path, "charge": charge[:4]})
	}, idempotency.WithScope("gin-phases"), idempotency.WithLease(time.Second)), func(c *gin.Context) { after++ })
	srv := httptest.NewServer(r)
	defer srv.Close()
	P := fmt.Sprintf("gin-%d-", time.Now().UnixNano()%1e9)

	postBody := func(path, key, body string) (int, http.Header, string) {
		req, _ := http.NewRequest("POST", srv.URL+path, strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header, string(b)
	}
	post := func(path, key string) (int, http.Header, string) { return postBody(path, key, `{"a":1}`) }
	counts := func(key string) (items, keys int) {
		db.QueryRow("SELECT (SELECT count(*) FROM go_gin_item WHERE idem_key = $1), "+
			"(SELECT count(*) FROM idempotency.idempotency_key WHERE key = $1)", key).Scan(&items, &keys)
		return
	}

	t.Run("201 stored with the handler's row; the replay is byte-identical and stops the chain", func(t *testing.T) {
		k := P + "ok"
		s1, h1, b1 := post("/items", k)
		runs := after
		s2, h2, b2 := post("/items", k)
		items, keys := counts(k)
		if s1 != 201 || s2 != 201 || b1 != b2 || h1.Get("Location") != h2.Get("Location") ||
			h1.Get("Content-Type") != h2.Get("Content-Type") || h2.Get("Idempotent-Replayed") != "true" ||
			items != 1 || keys != 1 || after != runs {
			t.Fatalf("%d %s / %d %s replayed=%q items=%d keys=%d after=%d->%d", s1, b1, s2, b2, h2.Get("Idempotent-Replayed"), items, keys, runs, after)
		}
		if s, _, _ := post("/items?x", k); s != 422 {
			t.Fatalf("another path under the key: %d", s)
		}
	})
	t.Run("a status without a body is stored", func(t *testing.T) {
		k := P + "status"
		s1, _, _ := post("/items?do=status", k)
		s2, h2, _ := post("/items?do=status", k)
		if items, keys := counts(k); s1 != 202 || s2 != 202 || h2.Get("Idempotent-Replayed") != "true" || items != 1 || keys != 1 {
			t.Fatalf("%d %d items=%d keys=%d", s1, s2, items, keys)
		}
	})
	t.Run("a panic (gin.Recovery: 500) and an aborted 503 roll back: neither the row nor the key", func(t *testing.T) {
		for _, do := range []string{"panic", "abort"} {
			k := P + do
			s, _, b := post("/items?do="+do, k)
			if items, keys := counts(k); s < 500 || items != 0 || keys != 0 {
				t.Fatalf("%s: %d %s items=%d keys=%d", do, s, b, items, keys)
			}
		}
	})
	t.Run("c.Stream (Flush) is refused: 500, nothing written", func(t *testing.T) {
		k := P + "stream"
		s, _, b := post("/items?do=stream", k)
		if items, keys := counts(k); s != 500 || !strings.Contains(b, "streamed") || items != 0 || keys != 0 {
			t.Fatalf("%d %s items=%d keys=%d", s, b, items, keys)
		}
	})
	t.Run("Phases: 201 from the phases' state, stored; the replay is byte-identical and stops the chain", func(t *testing.T) {
		k := P + "phases"
		s1, h1, b1 := post("/transfers", k)
		runs := after
		s2, h2, b2 := post("/transfers", k)
		items, keys := counts(k)
		if s1 != 201 || b1 != `{"charge":"idk_","path":"/transfers"}` || s2 != 201 || b1 != b2 ||
			h1.Get("Location") != h2.Get("Location") || h1.Get("Content-Type") != h2.Get("Content-Type") ||
			h1.Get("Idempotent-Replayed") != "" || h2.Get("Idempotent-Replayed") != "true" || items != 1 || keys != 1 || after != runs {
			t.Fatalf("%d %s / %d %s items=%d keys=%d after=%d->%d", s1, b1, s2, b2, items, keys, runs, after)
		}
		if s, _, _ := postBody("/transfers", k, `{"a":3}`); s != 422 {
			t.Fatalf("another body under the key: %d", s)
		}
		if s, _, _ := postBody("/transfers", "", `{"a":3}`); s != 400 {
			t.Fatalf("no key: %d", s)
		}
	})
	t.Run("Phases: Refuse is stored and replayed, its phase rolled back", func(t *testing.T) {
		k := P + "phases-refuse"
		s1, h1, b1 := postBody("/transfers", k, `{"a":2}`)
		s2, h2, b2 := postBody("/transfers", k, `{"a":2}`)
		items, keys := counts(k)
		if s1 != 402 || b1 != `{"error":"card_declined"}` || s2 != 402 || b1 != b2 || h1.Get("Content-Type") != "application/json" ||
			h2.Get("Idempotent-Replayed") != "true" || items != 0 || keys != 1 {
			t.Fatalf("%d %s / %d %s items=%d keys=%d", s1, b1, s2, b2, items, keys)
		}
	})
}
