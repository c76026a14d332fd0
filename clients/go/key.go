package idempotency

import (
	"errors"
	"strings"
)

// ErrKeyMissing is returned by ParseKey when the request has no
// Idempotency-Key header (or an empty one).
var ErrKeyMissing = errors.New("idempotency: no Idempotency-Key header")

// ParseKey reads the Idempotency-Key header values (r.Header.Values
// ("Idempotency-Key")): a structured-field string ("abc", RFC 8941 section
// 3.3.3), as the IETF draft writes it, or a bare token (abc), as Stripe's
// clients send it; both give the key abc.  It returns ErrKeyMissing when
// there is none, and an error naming the fault when the header is malformed
// (more than one, a bad escape, an unterminated string, text after it, a
// character that is not printable ASCII).  The length is checked by the
// server (idempotency.max_key_length, 255 by default: IK003).
func ParseKey(values []string) (string, error) {
	if len(values) > 1 {
		return "", errors.New("more than one Idempotency-Key header")
	}
	if len(values) == 0 {
		return "", ErrKeyMissing
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return "", ErrKeyMissing
	}
	if v[0] != '"' {
		return v, nil
	}
	var out strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", errors.New("bad escape in Idempotency-Key string")
			}
			out.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", errors.New("text after the Idempotency-Key string")
			}
			return out.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", errors.New("Idempotency-Key string must be printable ASCII")
		default:
			out.WriteByte(c)
		}
	}
	return "", errors.New("unterminated Idempotency-Key string")
}
