-- One "POST /payments" request, as any client would send it with plain SQL.
-- psql variables: key, amount, fail_gateway (true: the card network fails)
SELECT set_config('application_name', 'payment request', false) \g /dev/null
BEGIN;
SELECT outcome, coalesce(response::text, '') AS response, outcome <> 'replay' AS do_work
  FROM idempotency.begin(:'key', jsonb_build_object('amount', :'amount'::numeric),
                         scope => 'payments') \gset
\if :do_work
  -- the card network takes its time
  SELECT pg_sleep(0.2) \g /dev/null
  \if :fail_gateway
    SELECT idempotency.fail(:'key', '{"error": "card network timeout"}', scope => 'payments') \g /dev/null
    COMMIT;
    \echo :outcome 'card network timeout: failure stored, the client may retry'
  \else
    INSERT INTO payment (idempotency_key, amount) VALUES (:'key', :'amount') RETURNING id AS payment_id \gset
    SELECT idempotency.complete(:'key',
             jsonb_build_object('payment_id', :payment_id, 'amount', :'amount'::numeric, 'status', 'paid'),
             scope => 'payments') \g /dev/null
    COMMIT;
    \echo :outcome 'charged the card, payment' :payment_id
  \endif
\else
  COMMIT;
  \echo :outcome :response
\endif
