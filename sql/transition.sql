-- transition: transition() compares the
-- current state with to_state by the state column type's equality, not
-- as text: on an integer column at 5, '05' and ' 5' are 5 (already), with
-- and without a machine, and nothing is written.
CREATE TABLE review_steps (id int PRIMARY KEY, step int NOT NULL);
INSERT INTO review_steps VALUES (1, 5), (2, 1);
SELECT idempotency.transition('review_steps', 1, '05', NULL, state_column => 'step');
SELECT idempotency.transition('review_steps', 1, ' 5', NULL, state_column => 'step');
SELECT idempotency.transition('review_steps', 1, '5', NULL, state_column => 'step');
-- an earlier state is still refused (IK005), a later one applied
SELECT idempotency.transition('review_steps', 1, '04', NULL, state_column => 'step');
\echo :LAST_ERROR_SQLSTATE
SELECT idempotency.transition('review_steps', 1, '06', NULL, state_column => 'step');
-- with a machine over integer states
SELECT idempotency.create_machine('review_steps', '{"1": ["2"], "2": ["3"]}');
SELECT idempotency.transition('review_steps', 2, '02', 'review_steps', state_column => 'step');
SELECT idempotency.transition('review_steps', 2, '02', 'review_steps', state_column => 'step');
SELECT idempotency.transition('review_steps', 2, '+2', 'review_steps', state_column => 'step');
SELECT idempotency.transition('review_steps', 2, '01', 'review_steps', state_column => 'step');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM review_steps ORDER BY id;
-- a text column keeps comparing strings exactly: 'Paid' is not 'paid'
CREATE TABLE review_orders (id int PRIMARY KEY, status text NOT NULL);
INSERT INTO review_orders VALUES (1, 'paid');
SELECT idempotency.create_machine('review_order', '{"pending": ["paid"], "paid": ["shipped"]}');
SELECT idempotency.transition('review_orders', 1, 'paid', 'review_order');
SELECT idempotency.transition('review_orders', 1, 'Paid', 'review_order');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM review_orders;
DROP TABLE review_steps, review_orders;
DELETE FROM idempotency.state_machine WHERE machine IN ('review_steps', 'review_order');
