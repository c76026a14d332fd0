package idempotency

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Querier is what Once runs on: a *sql.DB (autocommit: one statement, one
// round trip), a *sql.Conn or a *sql.Tx (in the caller's transaction).
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Result is what Once returns.
type Result struct {
	// Outcome is "new" or "retry" (the statement ran and its result is
	// stored with the key) or "replay" (the stored result; nothing ran).
	Outcome string
	// Response is the statement's result as the extension stores it: a
	// json/jsonb column's value as it is (idempotency.http_response's
	// object, say), else the row as an object keyed by column name; several
	// rows a JSON array, no row JSON null.
	Response json.RawMessage
}

// Replayed reports whether the result is a replay (the statement did not run).
func (r Result) Replayed() bool { return r.Outcome == "replay" }

// Once runs one SQL statement under key, exactly once (idempotency.once):
// the first call runs query with args as $1, $2, ... and stores its result
// with the key; every duplicate, later or at the same moment, gets that
// result back without running it.  request is the fingerprinted request
// (marshalled to JSON; a json.RawMessage or []byte is taken as JSON text):
// another request under the same key is ErrMismatch (IK001).  The scope is
// "" and the ttl the server's default (use Middleware or begin() for
// others).
//
// Arguments are sent as text and typed by the statement, as the server
// types an untyped parameter (VALUES ($1) for a numeric column is numeric):
// strings, []byte (as text), integers, floats, bools, time.Time (RFC 3339),
// nil (NULL), and anything that is a driver.Valuer or fmt.Stringer.
//
// Errors: *Error for the extension's (errors.Is(err, ErrMismatch),
// ErrInProgress, ErrInvalidKey; HTTPStatus(err) gives the HTTP answer;
// for ErrInProgress, Error.RetryAfter from idempotency.lookup when q is a
// *sql.DB, else 1), the
// driver's error for one in the statement (nothing is stored then; the
// next try runs again).
func Once(ctx context.Context, q Querier, key string, request any, query string, args ...any) (Result, error) {
	var reqJSON []byte
	switch v := request.(type) {
	case json.RawMessage:
		reqJSON = v
	case []byte:
		reqJSON = v
	default:
		var err error
		if reqJSON, err = json.Marshal(request); err != nil {
			return Result{}, fmt.Errorf("idempotency.Once: request: %w", err)
		}
	}
	var sb strings.Builder
	sb.WriteString("SELECT outcome, response::text FROM idempotency.once($1, $2::jsonb, $3")
	params := make([]any, 0, 3+len(args))
	params = append(params, key, string(reqJSON), query)
	for i, a := range args {
		s, err := onceArg(a)
		if err != nil {
			return Result{}, fmt.Errorf("idempotency.Once: argument $%d: %w", i+1, err)
		}
		params = append(params, s)
		// only placeholders are written into the SQL, never a value
		sb.WriteString(", $" + strconv.Itoa(4+i) + "::text")
	}
	sb.WriteString(")")
	// the extension's version, once per *sql.DB (on a *sql.Conn or *sql.Tx
	// the caller's first call on its *sql.DB did it, or the extension's
	// own functions answer)
	if db, ok := q.(*sql.DB); ok {
		if err := checkExtension(ctx, db, db); err != nil {
			return Result{}, err
		}
	}
	var res Result
	var resp sql.NullString
	if err := q.QueryRowContext(ctx, sb.String(), params...).Scan(&res.Outcome, &resp); err != nil {
		if e, ok := wrap(err).(*Error); ok {
			if e.Code == "IK002" {
				if db, ok := q.(*sql.DB); ok {
					e.RetryAfter = retryAfter(ctx, db, key, "")
				} else {
					e.RetryAfter = 1
				}
			}
			return Result{}, e
		}
		return Result{}, err
	}
	if resp.Valid {
		res.Response = json.RawMessage(resp.String)
	} else {
		res.Response = json.RawMessage("null")
	}
	return res, nil
}

// onceArg: an argument as the text the server reads it from (nil: NULL)
func onceArg(a any) (any, error) {
	if v, ok := a.(driver.Valuer); ok {
		x, err := v.Value()
		if err != nil {
			return nil, err
		}
		a = x
	}
	switch v := a.(type) {
	case nil:
		return nil, nil
	case string:
		return v, nil
	case []byte:
		return string(v), nil
	case bool:
		return strconv.FormatBool(v), nil
	case int:
		return strconv.Itoa(v), nil
	case int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return fmt.Sprint(v), nil
	case float32:
		return strconv.FormatFloat(float64(v), 'g', -1, 32), nil
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64), nil
	case time.Time:
		return v.Format(time.RFC3339Nano), nil
	case fmt.Stringer:
		return v.String(), nil
	}
	return nil, fmt.Errorf("unsupported type %T", a)
}
