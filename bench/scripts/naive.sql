-- naive: the usual client-side SQL from blog posts
\set k random(1, 1000000000)
BEGIN;
INSERT INTO naive_key (key, status) VALUES ('n' || :client_id || '-' || :k, 'in_progress') ON CONFLICT DO NOTHING;
SELECT status, response FROM naive_key WHERE key = 'n' || :client_id || '-' || :k FOR UPDATE;
INSERT INTO payment (key, amount) VALUES ('n' || :client_id || '-' || :k, 10);
UPDATE naive_key SET status = 'completed', response = '{"ok": true}' WHERE key = 'n' || :client_id || '-' || :k;
END;
