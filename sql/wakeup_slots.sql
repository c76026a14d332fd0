-- wakeup_slots: the 4096 wake-up entries in shared memory are shared by
-- every role and database.  One role that creates thousands of topics and
-- waits on each once (then drops them) must not leave other roles' topics
-- on a shared entry, where each learns of the others' commits (and is woken
-- by them); an entry nobody waits on is taken back when a place is needed.
\i sql/include/roles.sql
\set VERBOSITY default
SET ROLE regress_bob;
SELECT count(idempotency.create_topic('slot_' || i)) AS created FROM generate_series(1, 6500) AS i;
-- a wait on each (100 topics a call, timeout 0): every entry was taken
SELECT count(*) AS waits
  FROM generate_series(0, 64) AS b,
       idempotency.wait_for(ARRAY(SELECT 'slot_' || i FROM generate_series(b * 100 + 1, b * 100 + 100) AS i), '0');
SELECT count(idempotency.drop_topic('slot_' || i, force => true)) AS dropped FROM generate_series(1, 6500) AS i;
-- alice's relay waits on her own topic, which bob may not consume, and
-- bob's on a topic of his, each with a cursor; then alice publishes.  Bob
-- looks before alice's relay waits again: that wait may take a place back
-- (when both topics hash to one place, 1 in 4096), and a relay whose place
-- was taken wakes once, spuriously, which is not what is checked here.
SET ROLE regress_alice;
SELECT idempotency.create_topic('slot_alice') > 0 AS alices;
SELECT cursor AS alice_cursor FROM idempotency.wait_for('{slot_alice}', '0') \gset
SET ROLE regress_bob;
SELECT idempotency.create_topic('slot_spy') > 0 AS spy;
CREATE TABLE slot_cursor AS SELECT cursor AS c FROM idempotency.wait_for('{slot_spy}', '0');
SET ROLE regress_alice;
SELECT idempotency.publish('slot_alice', '{}') IS NOT NULL AS p;
-- bob's relay is not woken: he learns nothing of alice's commit
SET ROLE regress_bob;
SELECT woken FROM slot_cursor, idempotency.wait_for('{slot_spy}', '0', c);
-- alice's is
SET ROLE regress_alice;
SELECT woken FROM idempotency.wait_for('{slot_alice}', '0', :'alice_cursor');
SET ROLE regress_bob;
DROP TABLE slot_cursor;
SELECT idempotency.drop_topic('slot_spy', force => true);
SET ROLE regress_alice;
SELECT idempotency.drop_topic('slot_alice', force => true);
RESET ROLE;
