// Package ginidempotency is the gin adapter of package idempotency: one
// line per endpoint,
//
//	r.POST("/payments", ginidempotency.Middleware(db, idempotency.WithScope("payments")), pay)
//
// and the handler runs its writes on ginidempotency.Tx(c) (the guarded
// request's *sql.Tx), which commits with the key and the stored answer.
// Everything else (options, stored statuses, errors) is package
// idempotency's Middleware: this adapter runs gin's handler chain inside it.
// A handler that panics rolls back; gin.Recovery (outside this middleware,
// as gin.Default() has it) answers 500, and a resend runs again.
package ginidempotency

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"
	idempotency "github.com/idempotency/idempotency-go"
)

// Middleware guards the rest of the gin handler chain with the
// Idempotency-Key header; opts are idempotency's options.
func Middleware(db *sql.DB, opts ...idempotency.Option) gin.HandlerFunc {
	mw := idempotency.Middleware(db, opts...)
	return func(c *gin.Context) {
		orig, origReq := c.Writer, c.Request
		ran := false
		defer func() { c.Writer = orig }() // also when a handler panics: gin.Recovery answers on it
		mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran = true
			gw := &writer{ResponseWriter: w, status: http.StatusOK, size: -1}
			c.Writer, c.Request = gw, r
			c.Next()
			gw.WriteHeaderNow()
			c.Request = origReq
		})).ServeHTTP(orig, c.Request)
		if !ran { // answered by the middleware: a replay, 400, 409, 422
			c.Abort()
		}
	}
}

// Tx is the guarded request's transaction (idempotency.Tx of the request's
// context); nil outside a guarded handler.
func Tx(c *gin.Context) *sql.Tx { return idempotency.Tx(c.Request.Context()) }

// Info is the guarded request's key, scope and outcome (idempotency.FromContext).
func Info(c *gin.Context) *idempotency.Info { return idempotency.FromContext(c.Request.Context()) }

// writer: gin.ResponseWriter over the middleware's capturing writer, with
// gin's own rules (the status is written with the first byte, or by
// WriteHeaderNow; size -1 until then)
type writer struct {
	http.ResponseWriter
	status int
	size   int
}

var _ gin.ResponseWriter = (*writer)(nil)

func (w *writer) WriteHeader(code int) {
	if code > 0 && !w.Written() {
		w.status = code
	}
}

func (w *writer) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.ResponseWriter.WriteHeader(w.status)
	}
}

func (w *writer) Write(p []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseWriter.Write(p)
	w.size += n
	return n, err
}

func (w *writer) WriteString(s string) (int, error) { return w.Write([]byte(s)) }
func (w *writer) Status() int                       { return w.status }
func (w *writer) Size() int                         { return w.size }
func (w *writer) Written() bool                     { return w.size != -1 }
func (w *writer) Pusher() http.Pusher               { return nil }

// Flush: the middleware's writer refuses a streamed answer (500, rolled back)
func (w *writer) Flush() {
	w.WriteHeaderNow()
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack: a guarded answer is stored before it is sent, so the connection
// cannot be taken over
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if h, ok := w.ResponseWriter.(http.Hijacker); ok {
		return h.Hijack()
	}
	return nil, nil, errors.New("ginidempotency: a guarded response cannot hijack the connection")
}

// CloseNotify (deprecated in net/http): a channel that never fires
func (w *writer) CloseNotify() <-chan bool { return make(chan bool) }

// Phases is idempotency.PhasesHandler as a gin handler: the phases run
// under the request's Idempotency-Key in lease mode, and respond writes the
// answer from their final state on the gin context (c.JSON, c.Data, ...),
// which is stored with the key and replayed.  opts are idempotency's
// options (WithScope, WithUser, WithLease, ...).  A phase reaches the
// request as p.HTTP and its body as p.Body.
func Phases(db *sql.DB, phases []idempotency.Phase, respond func(c *gin.Context, state idempotency.State), opts ...idempotency.Option) gin.HandlerFunc {
	if respond == nil {
		panic("ginidempotency.Phases: respond is nil")
	}
	h := idempotency.PhasesHandler(db, phases, func(w http.ResponseWriter, r *http.Request, state idempotency.State) {
		c := r.Context().Value(ginContext{}).(*gin.Context)
		orig, origReq := c.Writer, c.Request
		gw := &writer{ResponseWriter: w, status: http.StatusOK, size: -1}
		c.Writer, c.Request = gw, r
		defer func() { c.Writer, c.Request = orig, origReq }()
		respond(c, state)
		gw.WriteHeaderNow()
	}, opts...)
	return func(c *gin.Context) {
		h.ServeHTTP(c.Writer, c.Request.WithContext(context.WithValue(c.Request.Context(), ginContext{}, c)))
		c.Abort()
	}
}

type ginContext struct{}
