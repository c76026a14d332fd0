-- test/privileges/roles.sql: the roles of the privilege matrix, one per
-- kind of caller (a column of expect.tsv: caller c is role priv_c).  Run
-- by the cluster's superuser in database postgres; cleanup.sql drops them.
-- Membership is granted without WITH INHERIT/SET (PostgreSQL 16+ syntax):
-- the grant then inherits as the member's INHERIT attribute says, on 15 as
-- on 16 and later.
\set ON_ERROR_STOP 1
CREATE ROLE priv_owner LOGIN SUPERUSER;     -- runs CREATE EXTENSION, then loses SUPERUSER (setup.sql)
CREATE ROLE priv_super LOGIN SUPERUSER;     -- a superuser that is not the owner
CREATE ROLE priv_member LOGIN;              -- member of the owner role, inheriting its privileges
CREATE ROLE priv_noinherit LOGIN NOINHERIT; -- member of the owner role, not inheriting (until SET ROLE)
CREATE ROLE priv_bypassrls LOGIN BYPASSRLS; -- row security does not apply to it
CREATE ROLE priv_monitor LOGIN;             -- member of pg_monitor
CREATE ROLE priv_readall LOGIN;             -- member of pg_read_all_data (no BYPASSRLS)
CREATE ROLE priv_granted LOGIN;             -- granted, by name, what PUBLIC lacks (reads, EXECUTE)
CREATE ROLE priv_revoked;                   -- probes each object after REVOKE ALL ON it FROM PUBLIC
CREATE ROLE priv_app LOGIN;                 -- an application: keys, tokens, messages, a topic, tables
CREATE ROLE priv_appmember LOGIN;           -- member of priv_app, inheriting
CREATE ROLE priv_other LOGIN;               -- another application with its own rows
CREATE ROLE priv_publisher LOGIN;           -- may publish to priv_app's topic (grant_topic)
CREATE ROLE priv_consumer LOGIN;            -- may consume priv_app's topic (grant_topic)
CREATE ROLE priv_unconsumer LOGIN;          -- was granted priv_app's topic, then revoke_topic()
CREATE ROLE priv_newcomer LOGIN;            -- nothing at all (in the renamed pass: a new role
                                            -- given priv_app's name after priv_app's rename)
GRANT priv_owner TO priv_member, priv_noinherit;
GRANT priv_app TO priv_appmember;
GRANT pg_monitor TO priv_monitor;
GRANT pg_read_all_data TO priv_readall;
