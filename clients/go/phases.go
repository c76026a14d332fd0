package idempotency

// Phases: a request that calls other systems, run as named phases under one
// idempotency key in lease mode, resumable after a crash (recovery points,
// idempotency.checkpoint()).  The semantics are the Node client's runPhases
// (clients/node/lib/phases.js) and the Python client's run_phases:
//
//	begin(key, request, scope, ttl, lease)        autocommit: commits the lease
//	  replay -> the stored response; nothing runs
//	  new    -> every phase runs
//	  retry  -> the phases up to recovery_point are skipped; the state is
//	            recovery_state
//	for each phase still to run:
//	  BEGIN; result = phase.Run(ctx, p); checkpoint(key, name, state, attempt);
//	  COMMIT                    (the phase's writes and its point commit together)
//	  an External phase runs outside a transaction (no connection held open
//	  during a slow call) and checkpoints in autocommit after it
//	the last phase completes the key instead of checkpointing:
//	  complete(key, response(state), scope, attempt)
//
// While a phase runs, the lease is renewed every RenewEvery
// (idempotency.renew); when the key was taken over (IK004) the phase's
// context is cancelled and the checkpoint is refused: this attempt stops,
// the new one goes on.  A phase that returns an error (or panics) rolls its
// transaction back and fails the key retryably (fail(retryable => true)): a
// resend resumes from the last point.  A *PhaseError with Permanent set
// (Permanent, Refuse) ends the request for good: fail(retryable => false)
// stores it and it is replayed from then on.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// The defaults of PhasesOptions.
const (
	DefaultLease = 30 * time.Second
)

const (
	phaseBeginSQL = "SELECT outcome, status, response::text, attempts, recovery_point, recovery_state::text " +
		"FROM idempotency.begin($1, $2::jsonb, $3, $4::interval, $5::interval)"
	checkpointSQL    = "SELECT idempotency.checkpoint($1, $2, $3::jsonb, $4, $5)"
	phaseCompleteSQL = "SELECT idempotency.complete($1, $2::jsonb, $3, $4)"
	failSQL          = "SELECT idempotency.fail($1, $2::jsonb, $3, $4, $5)"
	renewSQL         = "SELECT idempotency.renew($1, $2::interval, $3, $4)"
	deriveSQL        = "SELECT idempotency.derive_key($1, $2, $3)"
)

// State holds each finished phase's result under the phase's name, as JSON
// (a retry gets it back from the recovery point).
type State map[string]json.RawMessage

// Get decodes the result of phase name into v; an error when that phase has
// not run.
func (s State) Get(name string, v any) error {
	raw, ok := s[name]
	if !ok {
		return fmt.Errorf("idempotency: no result of phase %q in the state", name)
	}
	return json.Unmarshal(raw, v)
}

// A Phase is one step of a phased request.
type Phase struct {
	// Name is the phase's recovery point; unique and non-empty.
	Name string
	// External: Run is given no transaction (p.Tx is nil) and none is held
	// open while it runs (a call to another system); its checkpoint is
	// written in autocommit after it.
	External bool
	// Run does the phase's work and returns its result (marshalled to JSON
	// into the state under Name; nil is JSON null).  A database phase
	// writes on p.Tx, which commits with the phase's checkpoint.  ctx is
	// cancelled when the key was taken over by another attempt.
	Run func(ctx context.Context, p *PhaseContext) (any, error)
}

// PhaseContext is what a phase runs with.
type PhaseContext struct {
	Tx      *sql.Tx // the phase's transaction; nil in an External phase
	State   State   // the results of the phases before this one
	Key     string  // the idempotency key
	Scope   string  // its scope (with the user's part)
	Attempt int     // this attempt's number (1 for the first)
	Outcome string  // "new", or "retry" when this attempt resumes or repeats one
	// Request is the fingerprinted request as JSON text (PhasesOptions.Request).
	Request json.RawMessage
	// HTTP is the HTTP request being served (PhasesHandler; nil under
	// RunPhases); its body has been read: Body holds it.
	HTTP *http.Request
	Body []byte

	derive func(ctx context.Context, step string) (string, error)
}

// DeriveKey is idempotency.derive_key(key, step, scope): an idempotency key
// for another system's call, the same on every attempt of this key (so the
// repeated call after a crash is a replay there), different per step.
func (p *PhaseContext) DeriveKey(ctx context.Context, step string) (string, error) {
	return p.derive(ctx, step)
}

// PhaseError is a phase's failure with its kind.  A plain error returned by
// a phase is retryable: the key is failed with fail(retryable => true) and
// a resend resumes from the last recovery point.
type PhaseError struct {
	// Permanent ends the request for good: fail(retryable => false) stores
	// the failure, replayed from then on.
	Permanent bool
	// Status and Body are the HTTP answer PhasesHandler stores and sends
	// for a permanent failure (Refuse): default 400 and {"error": message}
	// (as the Node client's).  RunPhases stores {"error": message}.
	Status int
	Body   any
	Err    error
}

func (e *PhaseError) Error() string {
	if e.Err != nil {
		return e.Err.Error()
	}
	if e.Status != 0 {
		return "refused with status " + strconv.Itoa(e.Status)
	}
	return "phase failed"
}

// Unwrap returns the cause.
func (e *PhaseError) Unwrap() error { return e.Err }

// Permanent marks err as the permanent failure of the request: the key is
// failed with fail(retryable => false) and {"error": err.Error()} is stored
// and replayed (PhasesHandler: 400 with that body, application/json).
func Permanent(err error) error { return &PhaseError{Permanent: true, Err: err} }

// Refuse is a permanent failure with the HTTP answer PhasesHandler stores
// and replays: status and body (JSON: marshalled, or sent as it is when a
// json.RawMessage or []byte), Content-Type application/json.  Nothing of
// the phase that returns it commits.  Under RunPhases the stored value is
// {"error": "refused with status N"}.
func Refuse(status int, body any) error {
	return &PhaseError{Permanent: true, Status: status, Body: body}
}

// PhasesOptions configures RunPhases.
type PhasesOptions struct {
	Key   string // the idempotency key (required)
	Scope string // its scope (default "")
	// Request is the fingerprinted request (marshalled to JSON; a
	// json.RawMessage or []byte is JSON text; nil: none): another request
	// under the same key is ErrMismatch (IK001).
	Request any
	// Lease is how long an attempt holds the key between renewals; a
	// crashed attempt is taken over once it lapses (default DefaultLease,
	// 30 s; the server rounds to milliseconds).
	Lease time.Duration
	// RenewEvery is how often the lease is renewed while phases run
	// (default Lease / 3, at least 50 ms).
	RenewEvery time.Duration
	// TTL is how long the key lives (default 0: idempotency.default_ttl).
	TTL time.Duration
	// Phases run in order (required, names unique).
	Phases []Phase
	// Response builds the stored and returned response from the final state
	// (required); it runs in the last phase's transaction, before complete().
	Response func(state State) (any, error)
	// Failure is the value fail() stores for a phase's error (default
	// {"error": err.Error()}).
	Failure func(err error, permanent bool) any
	// AfterCommit is called after each commit: "(begin)" after begin(),
	// the phase's name after its checkpoint, "(complete)" after the last.
	AfterCommit func(name string)
	// TxOptions is the isolation of the database phases' transactions
	// (default nil: the database's default).
	TxOptions *sql.TxOptions
}

// PhasesResult is what RunPhases returns.
type PhasesResult struct {
	// Outcome is "new" or "retry" (phases ran and the response is stored)
	// or "replay" (the stored response; nothing ran).
	Outcome string
	// Status is the key's status on a replay: "completed", or "failed" for
	// a permanent failure stored by fail(); else "".
	Status   string
	Response json.RawMessage // the response (stored, or replayed), JSON
	Attempts int             // the attempt's number
	// ResumedFrom is the recovery point this attempt resumed after ("" for none).
	ResumedFrom string
}

// Replayed reports whether the result is a replay (no phase ran).
func (r PhasesResult) Replayed() bool { return r.Outcome == "replay" }

func interval(d time.Duration) string {
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	return strconv.FormatInt(ms, 10) + " milliseconds"
}

func jsonText(v any) (string, error) {
	switch x := v.(type) {
	case json.RawMessage:
		return string(x), nil
	case []byte:
		return string(x), nil
	}
	b, err := json.Marshal(v)
	return string(b), err
}

// errTakenOver: RunPhases' error when renew() found the key taken over by
// another attempt (IK004; errors.Is(err, ErrNotHeld) holds)
var errTakenOver = &Error{Code: "IK004", Message: "the lease of this attempt was taken over"}

// RunPhases runs opts.Phases under opts.Key in lease mode (see the package
// documentation of phases above).  Errors: *Error for the extension's
// (errors.Is(err, ErrMismatch) with begin(); ErrInProgress with
// Error.RetryAfter; ErrNotHeld when the key was taken over by a newer
// attempt: then nothing was stored by this one), the phase's own error
// (the key failed: retryably, or for good when it is a permanent
// *PhaseError), or the database's.
func RunPhases(ctx context.Context, db *sql.DB, opts PhasesOptions) (PhasesResult, error) {
	return runPhases(ctx, db, opts, nil, nil)
}

func runPhases(ctx context.Context, db *sql.DB, o PhasesOptions, httpReq *http.Request, body []byte) (res PhasesResult, err error) {
	if db == nil {
		return res, errors.New("idempotency.RunPhases: db is nil")
	}
	if len(o.Phases) == 0 {
		return res, errors.New("idempotency.RunPhases: Phases is empty")
	}
	if o.Response == nil {
		return res, errors.New("idempotency.RunPhases: Response is nil")
	}
	names := map[string]int{}
	for i, ph := range o.Phases {
		if ph.Name == "" || ph.Run == nil {
			return res, fmt.Errorf("idempotency.RunPhases: phase %d needs a Name and a Run", i)
		}
		if _, dup := names[ph.Name]; dup {
			return res, fmt.Errorf("idempotency.RunPhases: two phases are named %q", ph.Name)
		}
		names[ph.Name] = i
	}
	lease := o.Lease
	if lease <= 0 {
		lease = DefaultLease
	}
	every := o.RenewEvery
	if every <= 0 {
		every = lease / 3
	}
	if every < 50*time.Millisecond {
		every = 50 * time.Millisecond
	}
	var reqJSON, ttl any
	if o.Request != nil {
		s, err := jsonText(o.Request)
		if err != nil {
			return res, fmt.Errorf("idempotency.RunPhases: request: %w", err)
		}
		reqJSON = s
	}
	if o.TTL > 0 {
		ttl = interval(o.TTL)
	}
	afterCommit := o.AfterCommit
	if afterCommit == nil {
		afterCommit = func(string) {}
	}

	if err = checkExtension(ctx, db, db); err != nil {
		return res, err
	}
	var status, response, point, stateText sql.NullString
	var attempts sql.NullInt64
	err = db.QueryRowContext(ctx, phaseBeginSQL, o.Key, reqJSON, o.Scope, ttl, interval(lease)).
		Scan(&res.Outcome, &status, &response, &attempts, &point, &stateText)
	if err != nil {
		if e, ok := wrap(err).(*Error); ok {
			if e.Code == "IK002" {
				e.RetryAfter = retryAfter(ctx, db, o.Key, o.Scope)
			}
			return PhasesResult{}, e
		}
		return PhasesResult{}, err
	}
	res.Attempts, res.ResumedFrom = int(attempts.Int64), point.String
	if res.Outcome == "replay" {
		res.Status = status.String
		res.Response = json.RawMessage(response.String)
		if !response.Valid {
			res.Response = json.RawMessage("null")
		}
		return res, nil
	}
	afterCommit("(begin)")
	attempt := res.Attempts

	start, state := 0, State{}
	if res.Outcome == "retry" && point.Valid {
		i, ok := names[point.String]
		if !ok {
			return res, fmt.Errorf("idempotency.RunPhases: recovery point %q is not one of the phases", point.String)
		}
		start = i + 1
		if stateText.Valid {
			json.Unmarshal([]byte(stateText.String), &state) //nolint:errcheck // not an object: start empty
			if state == nil {
				state = State{}
			}
		}
	}

	// the heartbeat: renew the lease while the phases run; IK004 (taken
	// over) cancels the phases' context
	pctx, cancel := context.WithCancel(detached{ctx})
	var takenOver sync.Once
	lost := false
	var lostMu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				rctx, rcancel := context.WithTimeout(detached{ctx}, lease)
				var until sql.NullString
				err := db.QueryRowContext(rctx, renewSQL, o.Key, interval(lease), attempt, o.Scope).Scan(&until)
				rcancel()
				if SQLState(err) == "IK004" {
					takenOver.Do(func() {
						lostMu.Lock()
						lost = true
						lostMu.Unlock()
						cancel()
					})
					return
				}
			}
		}
	}()
	isLost := func() bool { lostMu.Lock(); defer lostMu.Unlock(); return lost }
	defer func() {
		close(stop)
		wg.Wait()
		cancel()
	}()

	derived := map[string]string{}
	var derivedMu sync.Mutex
	derive := func(ctx context.Context, step string) (string, error) {
		derivedMu.Lock()
		k, ok := derived[step]
		derivedMu.Unlock()
		if ok {
			return k, nil
		}
		if err := db.QueryRowContext(ctx, deriveSQL, o.Key, step, o.Scope).Scan(&k); err != nil {
			return "", wrap(err)
		}
		derivedMu.Lock()
		derived[step] = k
		derivedMu.Unlock()
		return k, nil
	}
	var reqRaw json.RawMessage
	if reqJSON != nil {
		reqRaw = json.RawMessage(reqJSON.(string))
	}
	ctxOf := func(tx *sql.Tx) *PhaseContext {
		return &PhaseContext{Tx: tx, State: state, Key: o.Key, Scope: o.Scope, Attempt: attempt,
			Outcome: res.Outcome, Request: reqRaw, HTTP: httpReq, Body: body, derive: derive}
	}
	failure := o.Failure
	if failure == nil {
		failure = func(err error, _ bool) any { return map[string]string{"error": err.Error()} }
	}

	// a phase's error (or panic): fail the key, retryably unless permanent;
	// taken over: store nothing, the newer attempt owns the key
	finished := false
	defer func() {
		if finished {
			return
		}
		p := recover()
		ferr := err
		if p != nil {
			ferr = fmt.Errorf("panic: %v", p)
		}
		if ferr != nil && SQLState(ferr) != "IK004" && !isLost() {
			var pe *PhaseError
			permanent := errors.As(ferr, &pe) && pe.Permanent
			if text, jerr := jsonText(failure(ferr, permanent)); jerr == nil {
				fctx, fcancel := context.WithTimeout(detached{ctx}, 10*time.Second)
				db.ExecContext(fctx, failSQL, o.Key, text, o.Scope, !permanent, attempt) //nolint:errcheck // the phase's error is what matters
				fcancel()
			}
		}
		if isLost() && SQLState(ferr) != "IK004" {
			err = errTakenOver
		}
		if p != nil {
			panic(p)
		}
	}()

	store := func(q interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	}, name string, last bool) error {
		if last {
			out, err := o.Response(state)
			if err != nil {
				return err
			}
			text, err := jsonText(out)
			if err != nil {
				return fmt.Errorf("idempotency.RunPhases: response: %w", err)
			}
			res.Response = json.RawMessage(text)
			_, err = q.ExecContext(pctx, phaseCompleteSQL, o.Key, text, o.Scope, attempt)
			return wrap(err)
		}
		text, err := json.Marshal(state)
		if err != nil {
			return err
		}
		_, err = q.ExecContext(pctx, checkpointSQL, o.Key, name, string(text), attempt, o.Scope)
		return wrap(err)
	}

	// resumed after the last phase committed but before complete(): finish
	if start == len(o.Phases) {
		if err = store(db, "", true); err != nil {
			return res, err
		}
		afterCommit("(complete)")
		finished = true
		return res, nil
	}
	for i := start; i < len(o.Phases); i++ {
		ph := o.Phases[i]
		last := i == len(o.Phases)-1
		if isLost() {
			return res, errTakenOver
		}
		if ph.External {
			var out any
			if out, err = ph.Run(pctx, ctxOf(nil)); err != nil {
				return res, err
			}
			if err = setState(state, ph.Name, out); err != nil {
				return res, err
			}
			if err = store(db, ph.Name, last); err != nil {
				return res, err
			}
		} else if err = runTxPhase(pctx, db, o.TxOptions, ph, ctxOf, state, func(tx *sql.Tx) error {
			return store(tx, ph.Name, last)
		}); err != nil {
			return res, err
		}
		if last {
			afterCommit("(complete)")
		} else {
			afterCommit(ph.Name)
		}
	}
	finished = true
	return res, nil
}

func setState(state State, name string, out any) error {
	b, err := json.Marshal(out)
	if err != nil {
		return fmt.Errorf("idempotency.RunPhases: the result of phase %q: %w", name, err)
	}
	state[name] = b
	return nil
}

// runTxPhase: one database phase in its own transaction, with its
// checkpoint (or complete()); rolled back on any error or panic
func runTxPhase(ctx context.Context, db *sql.DB, txo *sql.TxOptions, ph Phase, ctxOf func(*sql.Tx) *PhaseContext,
	state State, store func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, txo)
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done {
			tx.Rollback() //nolint:errcheck // the error (or panic) that matters goes on
		}
	}()
	out, err := ph.Run(ctx, ctxOf(tx))
	if err == nil {
		err = setState(state, ph.Name, out)
	}
	if err == nil {
		err = store(tx)
	}
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		delete(state, ph.Name)
		return err
	}
	done = true
	return nil
}
