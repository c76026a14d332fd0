-- bench setup: business table, the hand-written alternatives, replay keys
CREATE EXTENSION idempotency;
CREATE TABLE payment (id bigserial PRIMARY KEY, key text NOT NULL, amount int NOT NULL,
                      created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE naive_key (key text PRIMARY KEY, status text NOT NULL, response jsonb,
                        created_at timestamptz NOT NULL DEFAULT now());
CREATE FUNCTION pl_begin(k text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE s text;
BEGIN
  INSERT INTO naive_key (key, status) VALUES (k, 'in_progress') ON CONFLICT DO NOTHING;
  SELECT status INTO s FROM naive_key WHERE key = k FOR UPDATE;
  RETURN s;
END $$;
CREATE FUNCTION pl_complete(k text, r jsonb) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  UPDATE naive_key SET status = 'completed', response = r WHERE key = k;
END $$;
CREATE PROCEDURE pay_plain(k text, amount int) LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO payment (key, amount) VALUES (k, amount);
END $$;
CREATE PROCEDURE pay_guarded(k text, amount int) LANGUAGE plpgsql AS $$
DECLARE o text;
BEGIN
  SELECT outcome INTO o FROM idempotency.begin(k);
  IF o <> 'replay' THEN
    INSERT INTO payment (key, amount) VALUES (k, amount);
    PERFORM idempotency.complete(k, '{"ok": true}');
  END IF;
END $$;
-- what storing a key costs with no guard logic: the same row, a plain table
-- with the key table's columns and indexes
CREATE TABLE keyrow (LIKE idempotency.idempotency_key INCLUDING DEFAULTS INCLUDING INDEXES);
CREATE INDEX ON keyrow (expires_at);
CREATE PROCEDURE pay_keyrow(k text, amount int) LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO payment (key, amount) VALUES (k, amount);
  INSERT INTO keyrow (owner, scope, key, status, response, expires_at)
  VALUES (current_user::regrole, '', k, 'completed', '{"ok": true}', now() + interval '1 day');
END $$;
INSERT INTO idempotency.idempotency_key (owner, scope, key, status, response, attempts,
                                         created_at, updated_at, expires_at)
SELECT 'postgres', '', 'replay-' || i, 'completed', '{"payment_id": 1, "status": "paid"}', 1,
       now(), now(), now() + interval '7 days'
  FROM generate_series(1, 100000) i;
VACUUM ANALYZE;
-- plpgsql1: the seed designs' pattern as one PL/pgSQL call, the best a
-- careful team writes by hand in one round trip (handwritten.sql, the same
-- function bench/portable.sh measures), with its own key table holding as
-- many finished keys as the extension's (and analysed: without statistics
-- its lookup turns into a sequential scan)
\ir handwritten.sql
INSERT INTO pl_key (key, status, response)
SELECT 'done-' || i, 'completed', '{"payment_id": 1, "status": "paid"}'
  FROM generate_series(1, 100000) i;
VACUUM ANALYZE pl_key;
