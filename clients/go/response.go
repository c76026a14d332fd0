package idempotency

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Stored response: the byte-exact replay convention of the extension
// (idempotency.http_response builds the same shape), shared with the Node,
// Python and Java clients, so a key stored by one is replayed by another:
//
//	{"status": 201, "headers": {"Content-Type": ..., "Location": ...},
//	 "body": "<exact body text>"}
//
// or "body_base64" instead of "body" when the body is not valid UTF-8 or
// holds a NUL byte (which a JSON string in jsonb cannot).
type stored struct {
	Status     int               `json:"status"`
	Headers    map[string]string `json:"headers"`
	Body       *string           `json:"body,omitempty"`
	BodyBase64 *string           `json:"body_base64,omitempty"`
}

// answer: what is sent
type answer struct {
	status   int
	header   http.Header
	body     []byte
	replayed bool
}

func encodeResponse(status int, h http.Header, body []byte, names []string) ([]byte, error) {
	s := stored{Status: status, Headers: map[string]string{}}
	for _, n := range names {
		if vs := h.Values(n); len(vs) > 0 {
			s.Headers[n] = strings.Join(vs, ", ")
		}
	}
	if utf8.Valid(body) && bytes.IndexByte(body, 0) < 0 {
		t := string(body)
		s.Body = &t
	} else {
		t := base64.StdEncoding.EncodeToString(body)
		s.BodyBase64 = &t
	}
	return json.Marshal(s)
}

// decodeResponse: the stored jsonb text -> the answer to replay.  A key
// completed by other code (not in this shape) is sent as JSON: 200, or 500
// when it failed for good.
func decodeResponse(text []byte, status string) answer {
	var s struct {
		Status     *int              `json:"status"`
		Headers    map[string]string `json:"headers"`
		Body       *string           `json:"body"`
		BodyBase64 *string           `json:"body_base64"`
	}
	if json.Unmarshal(text, &s) == nil && s.Status != nil {
		a := answer{status: *s.Status, header: http.Header{}, replayed: true}
		for k, v := range s.Headers {
			a.header.Set(k, v)
		}
		if s.Body != nil {
			a.body = []byte(*s.Body)
		} else if s.BodyBase64 != nil {
			a.body, _ = base64.StdEncoding.DecodeString(*s.BodyBase64)
		}
		return a
	}
	a := answer{status: 200, header: http.Header{"Content-Type": {"application/json"}}, body: text, replayed: true}
	if status == "failed" {
		a.status = 500
	}
	if len(text) == 0 {
		a.body = []byte("null")
	}
	return a
}

// problem: an RFC 9457 application/problem+json answer
func problem(status int, title, detail string, header ...string) answer {
	body, _ := json.Marshal(struct {
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{title, status, detail})
	h := http.Header{"Content-Type": {"application/problem+json"}}
	for i := 0; i+1 < len(header); i += 2 {
		h.Set(header[i], header[i+1])
	}
	return answer{status: status, header: h, body: body}
}

func send(w http.ResponseWriter, a answer) {
	h := w.Header()
	for k, v := range a.header {
		h[k] = v
	}
	if a.replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	h.Set("Content-Length", strconv.Itoa(len(a.body)))
	w.WriteHeader(a.status)
	w.Write(a.body) //nolint:errcheck // the client may be gone; nothing to do
}

// capture is the http.ResponseWriter the guarded handler writes to: the
// answer is held in memory until it is stored and committed, so a client
// never sees an answer that was not stored.  Flush (http.Flusher) and a body
// over the limit mark it as streamed: refused, rolled back, answered 500.
type capture struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	limit    int
	streamed string // why the answer cannot be stored, "" when it can
}

func newCapture(limit int) *capture { return &capture{header: http.Header{}, limit: limit} }

func (c *capture) Header() http.Header { return c.header }

func (c *capture) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}

func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if c.streamed != "" {
		return 0, errStreamed
	}
	if c.body.Len()+len(p) > c.limit {
		c.streamed = fmt.Sprintf("the response body is larger than the limit of %d bytes (WithMaxResponseBytes)", c.limit)
		return 0, errStreamed
	}
	return c.body.Write(p)
}

// WriteString: io.StringWriter, as net/http's own writer has
func (c *capture) WriteString(s string) (int, error) { return c.Write([]byte(s)) }

// Flush refuses a streamed response: a guarded answer is sent only once it
// is stored, so it cannot be streamed.
func (c *capture) Flush() {
	if c.streamed == "" {
		c.streamed = "the handler flushed its response (http.Flusher): a streamed response cannot be stored under an Idempotency-Key"
	}
}

var errStreamed = fmt.Errorf("idempotency: a guarded response cannot be streamed")

// result: the captured answer, with the Content-Type net/http would have
// sniffed set, so the stored header is what was sent
func (c *capture) result() (int, http.Header, []byte) {
	status := c.status
	if status == 0 {
		status = http.StatusOK
	}
	body := c.body.Bytes()
	if _, ok := c.header["Content-Type"]; !ok && len(body) > 0 && c.header.Get("Transfer-Encoding") == "" {
		c.header.Set("Content-Type", http.DetectContentType(body))
	}
	return status, c.header, body
}
