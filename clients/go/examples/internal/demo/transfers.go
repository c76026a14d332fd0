package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	idempotency "github.com/idempotency/idempotency-go"
)

// The phases of POST /transfers (the phased-endpoint contract of the
// conformance suite), shared by the three example servers: a database
// phase, a call to the payment provider at $DOWNSTREAM_URL, a database
// phase.  Each server registers them with its framework's one line
// (idempotency.PhasesHandler, ginidempotency.Phases) and writes the answer
// from their state (TransferBody).  The idempotency-specific lines in the
// phases are marked "// idempotency"; the rest is the transfer's own work.
var TransferPhases = []idempotency.Phase{
	{Name: "debit", Run: debit},
	{Name: "charge", External: true, Run: charge},
	{Name: "finish", Run: finish},
}

// TransferLease: a crashed attempt is taken over after 2 s (the lease is
// renewed every 2 s / 3 while phases run)
const TransferLease = 2 * time.Second

// Transfer is the request body: {"amount": "12.50"} and the test switches.
type Transfer struct {
	Amount  json.RawMessage `json:"amount"`
	Sleep   float64         `json:"sleep"`
	Decline bool            `json:"decline"`
}

func debit(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
	var t Transfer
	if err := json.Unmarshal(p.Body, &t); err != nil {
		return nil, idempotency.Refuse(http.StatusBadRequest, map[string]string{"error": "bad_request"})
	}
	if _, err := p.Tx.ExecContext(ctx, "INSERT INTO transfer_step (idem_key, step) VALUES ($1, 'debit')", p.Key); err != nil {
		return nil, err
	}
	if t.Decline { // permanent: the insert rolls back, 402 is stored and replayed
		return nil, idempotency.Refuse(http.StatusPaymentRequired, json.RawMessage(`{"error":"card_declined"}`)) // idempotency
	}
	if t.Sleep > 0 {
		if _, err := p.Tx.ExecContext(ctx, "SELECT pg_sleep($1)", t.Sleep); err != nil {
			return nil, err
		}
	}
	return map[string]json.RawMessage{"debited": t.Amount}, nil
}

func charge(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
	var debited struct{ Debited json.RawMessage }
	if err := p.State.Get("debit", &debited); err != nil {
		return nil, err
	}
	key, err := p.DeriveKey(ctx, "charge") // idempotency: the provider's Idempotency-Key, the same on every attempt
	if err != nil {
		return nil, err
	}
	body, _ := json.Marshal(map[string]json.RawMessage{"amount": debited.Debited})
	req, err := http.NewRequestWithContext(ctx, "POST", os.Getenv("DOWNSTREAM_URL")+"/charge", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := downstream.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	answer, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	if res.StatusCode/100 != 2 {
		return nil, fmt.Errorf("downstream answered %d: %s", res.StatusCode, answer)
	}
	var charged struct {
		ChargeID string `json:"charge_id"`
	}
	if err := json.Unmarshal(answer, &charged); err != nil {
		return nil, err
	}
	if p.HTTP.Header.Get("X-Crash") == "charge" {
		os.Exit(1) // after the provider answered, before this phase's checkpoint
	}
	return charged, nil
}

var downstream = &http.Client{Timeout: 10 * time.Second}

func finish(ctx context.Context, p *idempotency.PhaseContext) (any, error) {
	if p.HTTP.Header.Get("X-Crash") == "finish" {
		os.Exit(1) // the charge's checkpoint has committed
	}
	_, err := p.Tx.ExecContext(ctx, "INSERT INTO transfer_step (idem_key, step) VALUES ($1, 'finish')", p.Key)
	return nil, err
}

// TransferBody is the 201 body from the phases' state:
// {"status":"done","charge_id":"ch_N","amount":"12.50"}.
func TransferBody(state idempotency.State) []byte {
	var d struct{ Debited json.RawMessage }
	var c struct {
		ChargeID string `json:"charge_id"`
	}
	state.Get("debit", &d)  //nolint:errcheck // both ran before the answer is written
	state.Get("charge", &c) //nolint:errcheck
	var amount string
	if json.Unmarshal(d.Debited, &amount) != nil {
		amount = string(bytes.TrimSpace(d.Debited))
	}
	out, _ := json.Marshal(struct {
		Status   string `json:"status"`
		ChargeID string `json:"charge_id"`
		Amount   string `json:"amount"`
	}{"done", c.ChargeID, amount})
	return out
}
