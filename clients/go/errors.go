package idempotency

import (
	"errors"
	"reflect"
	"strings"
)

// The extension's errors that a caller acts on, for errors.Is.  Once
// returns an *Error that matches one of them; the Middleware turns them into
// HTTP answers itself (HTTPStatus).
var (
	ErrMismatch   = errors.New("idempotency: key reused with a different request (IK001)")
	ErrInProgress = errors.New("idempotency: key in progress in another transaction (IK002)")
	ErrInvalidKey = errors.New("idempotency: invalid key (IK003)")
	ErrNotHeld    = errors.New("idempotency: key not held (IK004)")
)

// Error is an error of the extension (SQLSTATE IK001..IK006) as the driver
// reported it.  errors.Is(err, ErrMismatch) and friends match it;
// errors.As(err, &pqErr) still reaches the driver's own error.
type Error struct {
	Code       string // SQLSTATE, e.g. "IK002"
	Message    string // the server's primary message
	RetryAfter int    // IK002: seconds to wait before resending (idempotency.lookup), else 0
	Err        error  // the driver's error
}

func (e *Error) Error() string { return "idempotency: " + e.Message + " (" + e.Code + ")" }

// SQLState returns Code (as the drivers' errors do: SQLState(err) reads it).
func (e *Error) SQLState() string { return e.Code }

// Unwrap returns the driver's error.
func (e *Error) Unwrap() error { return e.Err }

// Is matches ErrMismatch (IK001), ErrInProgress (IK002), ErrInvalidKey
// (IK003) and ErrNotHeld (IK004).
func (e *Error) Is(target error) bool {
	switch target {
	case ErrMismatch:
		return e.Code == "IK001"
	case ErrInProgress:
		return e.Code == "IK002"
	case ErrInvalidKey:
		return e.Code == "IK003"
	case ErrNotHeld:
		return e.Code == "IK004"
	}
	return false
}

// HTTPStatus is the answer the IETF Idempotency-Key draft gives an error:
// 422 for ErrMismatch, 409 for ErrInProgress (with Retry-After), 400 for
// ErrInvalidKey, and 0 for anything else.
func HTTPStatus(err error) int {
	switch {
	case errors.Is(err, ErrMismatch):
		return 422
	case errors.Is(err, ErrInProgress):
		return 409
	case errors.Is(err, ErrInvalidKey):
		return 400
	}
	return 0
}

// SQLState is the SQLSTATE of a database error from lib/pq (*pq.Error) or
// pgx (*pgconn.PgError), also when wrapped; "" for anything else.
func SQLState(err error) string {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	return ""
}

// message: the server's primary message (the Message field both lib/pq's
// and pgx's errors have), else err.Error()
func message(err error) string {
	for e := err; e != nil; e = errors.Unwrap(e) {
		v := reflect.ValueOf(e)
		if v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		if v.Kind() == reflect.Struct {
			if f := v.FieldByName("Message"); f.IsValid() && f.Kind() == reflect.String && f.String() != "" {
				return f.String()
			}
		}
	}
	return strings.SplitN(err.Error(), "\n", 2)[0]
}

// wrap: an extension error (IKxxx) as *Error, anything else unchanged
func wrap(err error) error {
	code := SQLState(err)
	if !strings.HasPrefix(code, "IK") {
		return err
	}
	return &Error{Code: code, Message: message(err), Err: err}
}

func retryable(code string) bool { return code == "40001" || code == "40P01" }
