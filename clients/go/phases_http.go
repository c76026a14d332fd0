package idempotency

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// WithLease sets the lease of a PhasesHandler's attempt: how long it holds
// the key between renewals, so a crashed attempt is taken over once it
// lapses (default DefaultLease, 30 s).  Middleware ignores it.
func WithLease(d time.Duration) Option { return func(c *config) { c.lease = d } }

// WithRenewEvery sets how often a PhasesHandler renews its lease while its
// phases run (default the lease / 3).  Middleware ignores it.
func WithRenewEvery(d time.Duration) Option { return func(c *config) { c.renewEvery = d } }

// A Responder writes the answer of a phased request from the final state
// of its phases, as a handler would (w is held in memory until the answer
// is stored).  It runs in the last database phase's transaction, before
// complete(); a streamed answer is refused (500, not stored).
type Responder func(w http.ResponseWriter, r *http.Request, state State)

// unstored: the Responder's answer has a status that is not stored (5xx,
// 429, ...): the key is failed retryably and the answer sent
type unstored struct{ a answer }

func (u *unstored) Error() string {
	return "the answer's status " + strconv.Itoa(u.a.status) + " is not stored"
}

// streamed: the Responder streamed its answer
type streamed struct{ why string }

func (s *streamed) Error() string { return s.why }

// PhasesHandler is the one-line integration of phases for net/http and chi
// (and, through ginidempotency.Phases, gin): it serves a request whose
// work is phases (one database transaction each, or External calls to other
// systems) under its Idempotency-Key in lease mode, resumable after a crash
// (RunPhases), and answers with respond's answer, stored with the key.
//
// The HTTP rules are Middleware's: a missing or malformed key -> 400; the
// key with a different request -> 422; the key in flight (its lease held
// by another attempt) -> 409 with Retry-After; a replay -> the stored
// status, body, Content-Type and Location (WithHeaders: more), byte for
// byte, with Idempotent-Replayed: true.  An answer whose status is not
// stored (WithStore; by default 408, 409, 425, 429 and 5xx) is sent, and the
// key failed retryably: a resend resumes after the last finished phase.  A
// phase's error answers 500 (not stored; a resend resumes); Refuse(status,
// body) is a permanent failure stored and replayed (Permanent(err): 400
// {"error": err.Error()}, stored).  A key taken over by a newer attempt answers 409.
//
// The options are Middleware's (WithScope, WithScopeFunc, WithUser,
// WithTTL, WithHeaders, WithStore, WithMaxRequestBytes,
// WithMaxResponseBytes, WithRequest, WithTxOptions for every database
// phase, WithLogger) and WithLease, WithRenewEvery.  Optional, WithLockWait
// and WithRetries do not apply: a phased request always needs a key, and
// its begin() is in autocommit.
func PhasesHandler(db *sql.DB, phases []Phase, respond Responder, opts ...Option) http.Handler {
	if db == nil {
		panic("idempotency.PhasesHandler: db is nil")
	}
	if respond == nil {
		panic("idempotency.PhasesHandler: respond is nil")
	}
	c := newConfig(opts)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		send(w, c.servePhases(db, phases, respond, r))
	})
}

func (c *config) servePhases(db *sql.DB, phases []Phase, respond Responder, r *http.Request) answer {
	key, err := ParseKey(r.Header.Values("Idempotency-Key"))
	body, reqJSON, refused := c.read(r, err)
	if refused != nil {
		return *refused
	}
	scope := c.scopeFor(r)
	var sent answer
	o := PhasesOptions{
		Key: key, Scope: scope, Request: json.RawMessage(reqJSON),
		Lease: c.lease, RenewEvery: c.renewEvery, TTL: c.ttl,
		Phases: phases, TxOptions: c.txOptions,
		Response: func(state State) (any, error) {
			cw := newCapture(c.maxResponseBytes)
			respond(cw, r, state)
			if cw.streamed != "" {
				return nil, &streamed{cw.streamed}
			}
			status, header, body := cw.result()
			sent = answer{status: status, header: header, body: body}
			if !c.store(status) {
				return nil, &unstored{sent}
			}
			resp, err := encodeResponse(status, header, body, c.headers)
			return json.RawMessage(resp), err
		},
		Failure: func(err error, permanent bool) any {
			if permanent {
				a := refusal(err)
				if resp, e := encodeResponse(a.status, a.header, a.body, c.headers); e == nil {
					return json.RawMessage(resp)
				}
			}
			return map[string]string{"error": err.Error()}
		},
	}
	res, err := runPhases(detached{r.Context()}, db, o, r, body)
	if err == nil {
		if res.Replayed() {
			return decodeResponse(res.Response, res.Status)
		}
		return sent
	}
	var pe *PhaseError
	var un *unstored
	var st *streamed
	switch code := SQLState(err); {
	case code == "IK001":
		return problem(422, "Idempotency-Key reused", "This Idempotency-Key was used with a different request.")
	case code == "IK002" || code == "IK004":
		// in flight elsewhere, or this attempt was taken over by a newer one
		ra := 1
		var e *Error
		if errors.As(err, &e) && e.RetryAfter > 0 {
			ra = e.RetryAfter
		} else {
			ra = retryAfter(context.Background(), db, key, scope)
		}
		return problem(409, "Idempotency-Key in use",
			"A request with this Idempotency-Key is being processed; retry later.", "Retry-After", strconv.Itoa(ra))
	case code == "IK003":
		return problem(400, "Invalid Idempotency-Key", message(err))
	case retryable(code):
		return problem(503, "Try again", message(err), "Retry-After", "1")
	case errors.As(err, &pe) && pe.Permanent:
		return refusal(err)
	case errors.As(err, &un):
		return un.a
	case errors.As(err, &st):
		return problem(500, "Streamed response refused", st.why+"; nothing was stored, a resend resumes after the last finished phase.")
	}
	c.logf("idempotency: phases of key %q in scope %q: %v", key, scope, err)
	return problem(500, "Internal error", "The request failed; a resend resumes after its last finished phase.")
}

// refusal: the answer of a permanent phase error: its Status (default 400)
// and Body (default {"error": message}), as the Node client's
func refusal(err error) answer {
	var pe *PhaseError
	errors.As(err, &pe)
	status, b := http.StatusBadRequest, any(map[string]string{"error": err.Error()})
	if pe != nil && pe.Status != 0 {
		status = pe.Status
	}
	if pe != nil && pe.Body != nil {
		b = pe.Body
	}
	var body []byte
	switch v := b.(type) {
	case json.RawMessage:
		body = v
	case []byte:
		body = v
	default:
		var e error
		if body, e = json.Marshal(v); e != nil {
			return problem(500, "Request failed", "The refusal's body is not JSON: "+e.Error())
		}
	}
	return answer{status: status, header: http.Header{"Content-Type": {"application/json"}}, body: body}
}
