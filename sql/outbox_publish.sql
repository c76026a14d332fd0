-- outbox_publish: publish() writes its row through the executor's
-- simple-relation insert while idempotency.outbox_message has the shipped
-- shape, and through SPI otherwise: the row is the same either way, and a
-- trigger, rule, CHECK constraint, index or column that a superuser adds
-- to the table is honoured at once (every error with its SQLSTATE and
-- nothing written).
\i sql/include/roles.sql
\set VERBOSITY default
CREATE ROLE regress_outbox_pub_nobody NOLOGIN;
CREATE FUNCTION pub_rows() RETURNS bigint LANGUAGE sql
  AS 'SELECT count(*) FROM idempotency.outbox_message';
CREATE FUNCTION pub_last() RETURNS TABLE (owner text, published_by text, state text,
    attempts int, headers jsonb, message_key text, claim_null bool, last_error_null bool,
    delivered_null bool, expires_null bool, published_now bool, available_later bool,
    id_is_latest bool)
  LANGUAGE sql AS $$
    SELECT owner::text, published_by::text, state, attempts, headers, message_key,
           claim IS NULL, last_error IS NULL, delivered_at IS NULL, expires_at IS NULL,
           published_at = now(), available_at > now(),
           id = (SELECT last_value FROM idempotency.outbox_message_id_seq)
      FROM idempotency.outbox_message ORDER BY id DESC LIMIT 1 $$;
SET ROLE regress_alice;
SELECT idempotency.create_topic('pubfast') > 0 AS created;
SELECT idempotency.grant_topic('pubfast', 'regress_bob', publish => true, consume => false);
RESET ROLE;

-- ---- the shipped shape: the row as publish() always wrote it ---------------
BEGIN;
SET LOCAL ROLE regress_bob;
SELECT idempotency.publish('pubfast', '{"n": 1}') IS NOT NULL AS published;
RESET ROLE;
SELECT * FROM pub_last();
SET LOCAL ROLE regress_bob;
SELECT idempotency.publish('pubfast', '{"n": 2}', message_key => 'k1',
    headers => '{"h": "v"}', deliver_after => '1 hour') IS NOT NULL AS published;
RESET ROLE;
SELECT * FROM pub_last();
-- the returned id is the stored one, and every index has the row
SET LOCAL enable_seqscan = off;
SET LOCAL ROLE regress_bob;
SELECT idempotency.publish('pubfast', '{"n": 3}', message_key => 'k2') AS mid \gset
RESET ROLE;
SELECT count(*) AS by_message_id FROM idempotency.outbox_message WHERE message_id = :'mid';
SELECT count(*) AS by_key_index FROM idempotency.outbox_message
  WHERE topic_id = (SELECT id FROM idempotency.outbox_topic WHERE name = 'pubfast')
    AND message_key = 'k2';
SELECT count(*) AS by_ready_index FROM idempotency.outbox_message
  WHERE topic_id = (SELECT id FROM idempotency.outbox_topic WHERE name = 'pubfast')
    AND state = 'pending' AND available_at <= now();
ROLLBACK;
SELECT pub_rows() AS rows_after_rollback;

-- ---- a trigger that skips the row: an error, nothing written ---------------
CREATE FUNCTION pub_skip() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NULL; END$$;
CREATE TRIGGER skip BEFORE INSERT ON idempotency.outbox_message
  FOR EACH ROW EXECUTE FUNCTION pub_skip();
SET ROLE regress_alice;
SELECT idempotency.publish('pubfast', '{"n": 4}');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT pub_rows() AS rows_after_skip;
DROP TRIGGER skip ON idempotency.outbox_message;
DROP FUNCTION pub_skip();

-- ---- a trigger that changes the row, and one that records it: honoured -----
CREATE TABLE pub_audit (message_id uuid, headers jsonb);
GRANT INSERT ON pub_audit TO PUBLIC;
CREATE FUNCTION pub_stamp() RETURNS trigger LANGUAGE plpgsql AS
  $$BEGIN NEW.headers := NEW.headers || '{"stamped": true}'; RETURN NEW; END$$;
CREATE FUNCTION pub_record() RETURNS trigger LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.pub_audit VALUES (NEW.message_id, NEW.headers); RETURN NULL; END$$;
CREATE TRIGGER stamp BEFORE INSERT ON idempotency.outbox_message
  FOR EACH ROW EXECUTE FUNCTION pub_stamp();
CREATE TRIGGER record AFTER INSERT ON idempotency.outbox_message
  FOR EACH ROW EXECUTE FUNCTION pub_record();
SET ROLE regress_alice;
SELECT idempotency.publish('pubfast', '{"n": 5}') AS mid \gset
RESET ROLE;
SELECT headers FROM idempotency.outbox_message WHERE message_id = :'mid';
SELECT headers AS audited FROM pub_audit WHERE message_id = :'mid';
DROP TRIGGER stamp ON idempotency.outbox_message;
DROP TRIGGER record ON idempotency.outbox_message;
-- dropped: the fast path again, and the audit table sees nothing more
SET ROLE regress_alice;
SELECT idempotency.publish('pubfast', '{"n": 6}') AS mid \gset
RESET ROLE;
SELECT headers FROM idempotency.outbox_message WHERE message_id = :'mid';
SELECT count(*) AS audited FROM pub_audit;
DROP TABLE pub_audit;
DROP FUNCTION pub_stamp();
DROP FUNCTION pub_record();

-- ---- a rule: honoured (SPI) ----------------------------------------------
CREATE TABLE pub_ruled (payload jsonb);
CREATE RULE divert AS ON INSERT TO idempotency.outbox_message
  DO INSTEAD INSERT INTO public.pub_ruled VALUES (NEW.payload);
SET ROLE regress_alice;
SELECT idempotency.publish('pubfast', '{"n": 7}') IS NOT NULL AS published;
RESET ROLE;
SELECT count(*) AS diverted FROM pub_ruled;
DROP RULE divert ON idempotency.outbox_message;
DROP TABLE pub_ruled;

-- ---- a CHECK constraint and a unique index: kept by the fast path ----------
ALTER TABLE idempotency.outbox_message ADD CONSTRAINT pub_small CHECK ((payload->>'n')::int < 100);
CREATE UNIQUE INDEX pub_unique_n ON idempotency.outbox_message ((payload->>'n'));
SELECT pub_rows() AS rows_before;
SET ROLE regress_alice;
\set VERBOSITY terse
SELECT idempotency.publish('pubfast', '{"n": 100}');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.publish('pubfast', '{"n": 6}');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
SELECT idempotency.publish('pubfast', '{"n": 8}') IS NOT NULL AS published;
RESET ROLE;
SELECT pub_rows() AS rows_after;
ALTER TABLE idempotency.outbox_message DROP CONSTRAINT pub_small;
DROP INDEX idempotency.pub_unique_n;

-- ---- a column added: SPI, and the column's default is written --------------
BEGIN;
ALTER TABLE idempotency.outbox_message ADD COLUMN pub_note text DEFAULT 'noted';
SET LOCAL ROLE regress_alice;
SELECT idempotency.publish('pubfast', '{"n": 9}') AS mid \gset
RESET ROLE;
SELECT pub_note FROM idempotency.outbox_message WHERE message_id = :'mid';
ROLLBACK;

-- ---- forced row security: SPI, whose INSERT applies the policies to the
-- extension's owner (a superuser here, so the row is stored)
BEGIN;
ALTER TABLE idempotency.outbox_message FORCE ROW LEVEL SECURITY;
SET LOCAL ROLE regress_alice;
SELECT idempotency.publish('pubfast', '{"n": 10}') AS mid \gset
RESET ROLE;
SELECT count(*) AS stored FROM idempotency.outbox_message WHERE message_id = :'mid';
ROLLBACK;

-- ---- a read-only transaction: 25006, nothing written -----------------------
SET ROLE regress_alice;
BEGIN READ ONLY;
SELECT idempotency.publish('pubfast', '{"n": 12}');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

-- ---- a role with no right on the topic: 42501, nothing written --------------
SELECT pub_rows() AS rows_before;
SET ROLE regress_outbox_pub_nobody;
SELECT idempotency.publish('pubfast', '{"n": 11}');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT pub_rows() AS rows_after;

SET ROLE regress_alice;
SELECT idempotency.drop_topic('pubfast', true);
RESET ROLE;
SELECT pub_rows() AS rows_left;
DROP FUNCTION pub_rows();
DROP FUNCTION pub_last();
DROP ROLE regress_outbox_pub_nobody;
