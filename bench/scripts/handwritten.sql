-- bench/scripts/handwritten.sql: the hand-written pattern a careful team
-- writes for one round trip (bench/portable.sh's plpgsql1,
-- portable/instructions.sh's hand): its own key table (key, status,
-- request, response); insert the key row or find it, lock it, replay a
-- finished key (a different request under it is an error), else do the
-- work (an INSERT into table payment, which the caller makes) and store
-- its result.
CREATE TABLE pl_key (key text PRIMARY KEY, status text NOT NULL, request jsonb, response jsonb,
                     created_at timestamptz NOT NULL DEFAULT now());
CREATE FUNCTION pl_once(k text, req jsonb, amount int) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE s text; q jsonb; r jsonb; pid bigint;
BEGIN
  INSERT INTO pl_key (key, status, request) VALUES (k, 'in_progress', req) ON CONFLICT DO NOTHING;
  SELECT status, request, response INTO s, q, r FROM pl_key WHERE key = k FOR UPDATE;
  IF q IS DISTINCT FROM req THEN
    RAISE EXCEPTION 'key % was used with a different request', k USING ERRCODE = 'P0001';
  END IF;
  IF s = 'completed' THEN
    RETURN r;
  END IF;
  INSERT INTO payment (key, amount) VALUES (k, amount) RETURNING id INTO pid;
  r := jsonb_build_object('id', pid);
  UPDATE pl_key SET status = 'completed', response = r WHERE key = k;
  RETURN r;
END $$;
