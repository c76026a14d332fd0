-- test/privileges/cleanup.sql: drop what the privilege matrix made (its
-- database first: the roles own objects there).  Run by the cluster's
-- superuser in database postgres, before a run and after it.
DROP DATABASE IF EXISTS privileges WITH (FORCE);
DROP ROLE IF EXISTS priv_owner, priv_super, priv_member, priv_noinherit, priv_bypassrls,
    priv_monitor, priv_readall, priv_granted, priv_revoked, priv_app, priv_appmember, priv_other,
    priv_publisher, priv_consumer, priv_unconsumer, priv_newcomer, priv_app_renamed, priv_gone;
