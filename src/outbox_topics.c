/*-------------------------------------------------------------------------
 *
 * outbox_topics.c
 *	  The outbox's topics (outbox_topics.h): a topic and the caller's
 *	  rights on it (lookup, the topic's lock, publish()'s cache), what is
 *	  drawn under a topic (a message key's lock, a message's row id), and
 *	  create_topic(), alter_topic(), drop_topic(), grant_topic(),
 *	  revoke_topic().
 *
 * A topic belongs to the role that created it; only its owner changes,
 * drops or shares it, and every change invalidates every backend's
 * publish() cache (topics_changed()).  publish() asks here once per
 * message (idem_outbox_publish_topic()); claim(), redrive() and wait_for()
 * look the topic up (idem_outbox_topic_lookup(); wait_for() many at once,
 * in wakeup.c).  Dropping a topic waits for the transactions that publish
 * to it and holds off new ones.  A topic whose owner was dropped belongs
 * to no role: it exists for nobody (the lookup, the grant policy), and
 * create_topic() of its name drops it, with its grants and messages, and
 * creates the new one.  The tables, a message's life, the order per
 * message key and how a topic is dropped under its publishers:
 * src/README.md, "The outbox".
 *
 * Locking: a keyed message's lock, an advisory tag on (topic, key), field4
 * OUTBOX_LOCK_FIELD4, keyed by the key store's SipHash, taken before the
 * message id is drawn and held to the publisher's transaction's end (deadlocks
 * between keys are the deadlock detector's; lock_timeout applies); the
 * topic's lock, field4 OUTBOX_TOPIC_LOCK_FIELD4, ShareLock for publishers
 * and ExclusiveLock for drop_topic(), to the transaction's end (a prepared
 * transaction keeps both until COMMIT/ROLLBACK PREPARED); row locks of the
 * rows a statement changes.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "catalog/namespace.h"
#include "commands/sequence.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"
#include "keystore.h"
#include "outbox_topics.h"

#define OUTBOX_LOCK_FIELD4 0x4945	/* 18757: pg_locks objsubid of a key's
									 * lock */
#define OUTBOX_TOPIC_LOCK_FIELD4 0x4946 /* 18758: of a topic's lock (objid:
										 * its id) */

/* ---------------------------------------------------------------------
 * A topic and the caller's rights on it
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_topic = NULL;

/*
 * Find topic name and the caller's rights on it; raise 42704 if there is no
 * such topic, or its owner was dropped (unless missing_ok: then return
 * false), and 42501 if the caller lacks right.  snap: InvalidSnapshot for the statement's own, or one to read
 * with (GetLatestSnapshot(): see "Dropping a topic" in src/README.md).
 * Inside SPI_connect().
 */
bool
idem_outbox_topic_lookup(const char *name, TopicRight right, Topic *out, Snapshot snap,
						 bool missing_ok)
{
	Oid			argtypes[2] = {TEXTOID, REGROLEOID};
	Datum		values[2];
	Oid			me = GetUserId();
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	bool		ok;

	values[0] = CStringGetTextDatum(name);
	values[1] = ObjectIdGetDatum(me);
	if (idem_run_as_owner_snap(&plan_topic,
							   "SELECT t.id, t.owner::pg_catalog.oid, t.max_attempts,"
							   "       COALESCE(g.can_publish, false),"
							   "       COALESCE(g.can_consume, false), t.notify"
							   "  FROM idempotency.outbox_topic AS t"
							   "  LEFT JOIN idempotency.outbox_grant AS g"
							   "    ON g.topic_id OPERATOR(pg_catalog.=) t.id"
							   "   AND g.grantee OPERATOR(pg_catalog.=) $2"
							   " WHERE t.name OPERATOR(pg_catalog.=) $1",
							   2, argtypes, values, NULL, SPI_OK_SELECT, snap) == 0)
	{
		if (missing_ok)
			return false;
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("topic \"%s\" does not exist", name),
				 errhint("Create it with idempotency.create_topic().")));
	}
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	out->id = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
	out->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 2, &isnull));
	out->max_attempts = DatumGetInt32(SPI_getbinval(tup, desc, 3, &isnull));
	out->may_publish = out->owner == me || DatumGetBool(SPI_getbinval(tup, desc, 4, &isnull));
	out->may_consume = out->owner == me || DatumGetBool(SPI_getbinval(tup, desc, 5, &isnull));
	out->notify = DatumGetBool(SPI_getbinval(tup, desc, 6, &isnull));

	/* its owner was dropped: the topic belongs to no role, nobody may use it */
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(out->owner)))
	{
		if (missing_ok)
			return false;
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("topic \"%s\" does not exist", name),
				 errdetail("The role that owned it was dropped; its grants give nothing."),
				 errhint("Create it anew with idempotency.create_topic(), which takes the name over.")));
	}

	ok = right == RIGHT_OWN ? out->owner == me :
		right == RIGHT_PUBLISH ? out->may_publish : out->may_consume;
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for topic \"%s\"", name),
				 errdetail("Role %s may not %s this topic.",
						   GetUserNameFromId(me, false),
						   right == RIGHT_OWN ? "change or drop" :
						   right == RIGHT_PUBLISH ? "publish to" : "consume from"),
				 right == RIGHT_OWN ? errhint("Only the topic's owner may.") :
				 errhint("The topic's owner can allow it with idempotency.grant_topic().")));
	return true;
}

/*
 * Hold topic id for this transaction: ShareLock for a publisher, ExclusiveLock
 * for drop_topic() (see "Dropping a topic" in src/README.md).  Returns
 * whether this call took it (LOCKACQUIRE_OK), not the transaction before.
 */
static bool
topic_lock(int32 id, LOCKMODE mode)
{
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, (uint32) id, OUTBOX_TOPIC_LOCK_FIELD4);
	return LockAcquire(&tag, mode, false, false) == LOCKACQUIRE_OK;
}

/*
 * 40001: this transaction's snapshot does not show what another one
 * committed (a drop of the topic, or a message published to it)
 */
static void
topic_serialization_failure(const char *name, const char *what, const char *by)
{
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not serialize access due to concurrent %s", by),
			 errdetail("%s \"%s\" after this transaction's snapshot was taken.", what, name),
			 errhint("Retry the transaction.")));
}

/* ---------------------------------------------------------------------
 * The publish() cache: each backend keeps what idem_outbox_topic_lookup() said about
 * (topic, role), and the OIDs of outbox_topic and the message id sequence.
 * Every function that changes a topic or a grant invalidates the relcache
 * entry of outbox_topic (sent to every backend at commit), which empties
 * the cache; so does anything that drops or recreates the tables.  (A
 * superuser's hand-made UPDATE of the tables is not seen until then.)
 * publish() reads pending invalidations first (AcceptInvalidationMessages):
 * a transaction that holds every lock it needs reads none by itself, and
 * kept publishing after a revoke_topic() had committed.
 * ---------------------------------------------------------------------
 */
typedef struct TopicCacheKey
{
	char		name[TOPIC_MAX_LEN + 1];
	Oid			role;
} TopicCacheKey;

typedef struct TopicCacheEntry
{
	TopicCacheKey key;
	Topic		topic;
} TopicCacheEntry;

static void topic_cached(const char *name, Topic *out);
static void topic_cache_put(const char *name, const Topic *t);

static HTAB *topic_cache = NULL;
static bool topic_cache_stale = false;
static Oid	topic_relid = InvalidOid;
static Oid	message_seq_relid = InvalidOid;

static void
outbox_relcache(Oid relid)
{
	if (!OidIsValid(relid) || relid == topic_relid || relid == message_seq_relid)
	{
		topic_cache_stale = true;
		topic_relid = InvalidOid;
		message_seq_relid = InvalidOid;
	}
}

/*
 * The OIDs of outbox_topic and outbox_message_id_seq, cached.  Read them
 * right before use: anything that reads invalidations (a lock taken for the
 * first time, a catalog read, SPI) may reset them.
 */
static void
outbox_relids(void)
{
	Oid			nsp;
	Oid			topic;
	Oid			seq;

	if (OidIsValid(topic_relid) && OidIsValid(message_seq_relid))
		return;
	idem_relcache_watch();
	nsp = get_namespace_oid("idempotency", false);
	topic = get_relname_relid("outbox_topic", nsp);
	seq = get_relname_relid("outbox_message_id_seq", nsp);
	topic_relid = topic;
	message_seq_relid = seq;
	if (!OidIsValid(topic_relid) || !OidIsValid(message_seq_relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table idempotency.outbox_topic does not exist"),
				 errhint("Run ALTER EXTENSION idempotency UPDATE.")));
}

/*
 * The caller's rights on topic name for publish(), from the cache or SPI,
 * and the topic held for the transaction (see "Dropping a topic" in
 * src/README.md): the first publish() to a topic in a transaction takes the
 * topic's lock shared, then looks the topic up again with the newest
 * snapshot, since a drop_topic() may have committed before the lock was
 * granted.  A topic gone (or re-created under a new id) since: 40001 if
 * this transaction's snapshot still shows it, else look again (42704 if
 * it is gone).
 */
static void
topic_for_publish(const char *name, Topic *out)
{
	for (;;)
	{
		Topic		now;

		topic_cached(name, out);
		if (!topic_lock(out->id, ShareLock))
			return;				/* held since an earlier publish() */
		if (idem_outbox_topic_lookup(name, RIGHT_PUBLISH, &now, GetLatestSnapshot(), true) &&
			now.id == out->id)
		{
			topic_cache_put(name, &now);
			*out = now;
			return;
		}
		topic_cache_stale = true;
		if (IsolationUsesXactSnapshot())
			topic_serialization_failure(name, "Topic was dropped", "drop_topic()");
	}
}

/* remember what idem_outbox_topic_lookup() said about (name, the current role) */
static void
topic_cache_put(const char *name, const Topic *t)
{
	TopicCacheKey key;
	TopicCacheEntry *e;
	bool		found;

	if (topic_cache == NULL || topic_cache_stale)
		return;					/* emptied since: filled by the next lookup */
	if (hash_get_num_entries(topic_cache) >= 1000)
	{
		topic_cache_stale = true;	/* bounded: start over next time */
		return;
	}
	memset(&key, 0, sizeof(key));
	strlcpy(key.name, name, sizeof(key.name));
	key.role = GetUserId();
	e = hash_search(topic_cache, &key, HASH_ENTER, &found);
	e->topic = *t;
}

/*
 * The caller's rights on topic name, from the cache or SPI (raises unless
 * the caller may publish).  Invalidations are read first: a revoke_topic()
 * or drop_topic() that committed while this transaction was open empties
 * the cache now, not at the next lock this transaction takes for the
 * first time.
 */
static void
topic_cached(const char *name, Topic *out)
{
	TopicCacheKey key;
	TopicCacheEntry *e;

	AcceptInvalidationMessages();
	if (topic_cache == NULL || topic_cache_stale)
	{
		HASHCTL		ctl;

		idem_relcache_watch();	/* before the cache is filled */
		if (topic_cache != NULL)
			hash_destroy(topic_cache);
		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = sizeof(TopicCacheKey);
		ctl.entrysize = sizeof(TopicCacheEntry);
		ctl.hcxt = TopMemoryContext;
		topic_cache = hash_create("idempotency outbox topics", 16, &ctl,
								  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
		topic_cache_stale = false;
	}
	outbox_relids();
	memset(&key, 0, sizeof(key));
	strlcpy(key.name, name, sizeof(key.name));
	key.role = GetUserId();
	e = hash_search(topic_cache, &key, HASH_FIND, NULL);
	if (e != NULL && e->topic.may_publish)
	{
		*out = e->topic;
		return;
	}
	(void) idem_outbox_topic_lookup(name, RIGHT_PUBLISH, out, InvalidSnapshot, false);
	topic_cache_put(name, out);
}

/*
 * Tell every backend's publish() cache that topics or grants changed; our
 * own at once (the invalidation reaches it only at the next command, and a
 * publish() later in the same statement must not use a dropped topic).
 */
static void
topics_changed(void)
{
	outbox_relids();
	CacheInvalidateRelcacheByRelid(topic_relid);
	topic_cache_stale = true;
}

/* take the lock of (topic, key) for this transaction: see the file comment */
static void
key_lock(text *topic, text *key)
{
	KeyId		id = idem_make_keyid(key, topic, "message key");
	LOCKTAG		tag;

	/* one lock space for every role: all publishers of the key serialise */
	id.owner = InvalidOid;
	id.hash = idem_key_hash(&id);
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (id.hash >> 32),
						 (uint32) id.hash, OUTBOX_LOCK_FIELD4);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
}

/* ---------------------------------------------------------------------
 * What is drawn under a topic: a message's row id after its key's lock
 * ---------------------------------------------------------------------
 */

/*
 * A message's row id for topic, after the lock of (topic, key) when key is
 * not NULL (see "Order per message key" in src/README.md): redrive()'s,
 * per message.
 */
int64
idem_outbox_next_id(text *topic, text *key)
{
	if (key != NULL)
		key_lock(topic, key);
	/* read right before use: the lock may have reset the cached OID */
	outbox_relids();
	return nextval_internal(message_seq_relid, false);
}

/*
 * For publish(), in one call: the caller's rights on topic name (topic, as
 * text) from the cache or SPI, the topic held for the transaction
 * (topic_for_publish()), the lock of (topic, key) when key is not NULL, and
 * the message's row id from the sequence, drawn after that lock.
 */
int64
idem_outbox_publish_topic(const char *name, text *topic, text *key, Topic *out)
{
	/* the topic's lookup may need SPI (a cache miss) */
	SPI_connect();
	topic_for_publish(name, out);
	SPI_finish();
	return idem_outbox_next_id(topic, key);
}

/* from _PG_init: our relcache callback */
void
idem_outbox_topics_init(void)
{
	idem_relcache_add(outbox_relcache);
}

/* ---------------------------------------------------------------------
 * create_topic(), alter_topic(), drop_topic(), grant_topic(), revoke_topic()
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_create = NULL;
static SPIPlanPtr plan_orphan = NULL;
static SPIPlanPtr plan_orphan_messages = NULL;
static SPIPlanPtr plan_orphan_left = NULL;
static SPIPlanPtr plan_orphan_drop = NULL;
static SPIPlanPtr plan_alter = NULL;
static SPIPlanPtr plan_pending = NULL;
static SPIPlanPtr plan_drop_messages = NULL;
static SPIPlanPtr plan_drop_left = NULL;
static SPIPlanPtr plan_drop = NULL;
static SPIPlanPtr plan_grant = NULL;
static SPIPlanPtr plan_revoke = NULL;

/*
 * Drop topic if its owner no longer exists, with its grants and messages
 * (as drop_topic(force) would), so that create_topic() can take its name;
 * returns whether it did.  The row is locked first, then the topic's lock
 * is taken as drop_topic() takes it: a publisher whose transaction began
 * before the owner was dropped still holds the topic, and its messages
 * are deleted after its commit (40001 when this transaction's snapshot
 * cannot see them, as in drop_topic()).  Inside SPI_connect().
 */
static bool
drop_orphan(const char *topic)
{
	Oid			argtypes[1] = {TEXTOID};
	Datum		values[1];
	bool		isnull;

	values[0] = CStringGetTextDatum(topic);
	if (idem_run_as_owner(&plan_orphan,
						  "SELECT t.id FROM idempotency.outbox_topic AS t"
						  " WHERE t.name OPERATOR(pg_catalog.=) $1"
						  "   AND NOT " OUTBOX_ROLE_EXISTS("t.owner")
						  " FOR UPDATE OF t",
						  1, argtypes, values, NULL, SPI_OK_SELECT) == 0)
		return false;
	argtypes[0] = INT4OID;
	values[0] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	(void) topic_lock(DatumGetInt32(values[0]), ExclusiveLock);
	idem_run_as_owner(&plan_orphan_messages,
					  "DELETE FROM idempotency.outbox_message AS m"
					  " WHERE m.topic_id OPERATOR(pg_catalog.=) $1",
					  1, argtypes, values, NULL, SPI_OK_DELETE);
	if (IsolationUsesXactSnapshot() &&
		idem_run_as_owner_snap(&plan_orphan_left,
							   "SELECT 1 FROM idempotency.outbox_message AS m"
							   " WHERE m.topic_id OPERATOR(pg_catalog.=) $1 LIMIT 1",
							   1, argtypes, values, NULL, SPI_OK_SELECT,
							   GetLatestSnapshot()) > 0)
		topic_serialization_failure(topic, "A message was published to topic", "publish()");
	idem_run_as_owner(&plan_orphan_drop,
					  "DELETE FROM idempotency.outbox_topic AS t"
					  " WHERE t.id OPERATOR(pg_catalog.=) $1",
					  1, argtypes, values, NULL, SPI_OK_DELETE);
	idem_owners_topic_gone(DatumGetInt32(values[0]));
	return true;
}

/* the topic was dropped by a drop_topic() that committed after our look */
static void
topic_gone(const char *topic)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("topic \"%s\" does not exist", topic),
			 errhint("Create it with idempotency.create_topic().")));
}

/*
 * create_topic(topic, max_attempts, backoff_base, backoff_max, retention) -> id
 * (a name held by a topic whose owner was dropped is taken over)
 */
PG_FUNCTION_INFO_V1(idempotency_create_topic);

Datum
idempotency_create_topic(PG_FUNCTION_ARGS)
{
	char	   *topic = idem_outbox_topic_arg(fcinfo, 0);
	Oid			argtypes[7] = {TEXTOID, REGROLEOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID};
	Datum		values[7];
	int			i;
	bool		isnull;
	int32		id;

	for (i = 1; i <= 5; i++)
		idem_outbox_not_null(fcinfo, i, i == 1 ? "max_attempts" : i == 2 ? "backoff_base" :
							 i == 3 ? "backoff_max" : i == 4 ? "retention" : "notify");
	if (PG_GETARG_INT32(1) < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_attempts must be at least 1")));
	idem_outbox_check_interval(PG_GETARG_INTERVAL_P(2), "backoff_base", false);
	idem_outbox_check_interval(PG_GETARG_INTERVAL_P(3), "backoff_max", false);
	idem_outbox_check_interval(PG_GETARG_INTERVAL_P(4), "retention", false);

	values[0] = CStringGetTextDatum(topic);
	values[1] = ObjectIdGetDatum(GetUserId());
	for (i = 1; i <= 5; i++)
		values[i + 1] = PG_GETARG_DATUM(i);
	SPI_connect();
	for (i = 0;; i++)
	{
		if (idem_run_as_owner(&plan_create,
							  "INSERT INTO idempotency.outbox_topic AS t"
							  "  (name, owner, max_attempts, backoff_base, backoff_max, retention, notify)"
							  " VALUES ($1, $2, $3, $4, $5, $6, $7)"
							  " ON CONFLICT (name) DO NOTHING RETURNING t.id",
							  7, argtypes, values, NULL, SPI_OK_INSERT_RETURNING) > 0)
			break;
		if (i > 0 || !drop_orphan(topic))
			ereport(ERROR,
					(errcode(ERRCODE_DUPLICATE_OBJECT),
					 errmsg("topic \"%s\" already exists", topic),
					 errdetail("Topic names are shared by every role of the database.")));
	}
	id = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	topics_changed();
	SPI_finish();
	PG_RETURN_INT32(id);
}

/* alter_topic(topic, max_attempts, backoff_base, backoff_max, retention): NULL keeps */
PG_FUNCTION_INFO_V1(idempotency_alter_topic);

Datum
idempotency_alter_topic(PG_FUNCTION_ARGS)
{
	char	   *topic = idem_outbox_topic_arg(fcinfo, 0);
	Oid			argtypes[6] = {INT4OID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID};
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	Topic		t;
	int			i;

	if (!PG_ARGISNULL(1) && PG_GETARG_INT32(1) < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_attempts must be at least 1")));
	for (i = 2; i <= 4; i++)
		if (!PG_ARGISNULL(i))
			idem_outbox_check_interval(PG_GETARG_INTERVAL_P(i),
									   i == 2 ? "backoff_base" : i == 3 ? "backoff_max" : "retention", false);
	SPI_connect();
	(void) idem_outbox_topic_lookup(topic, RIGHT_OWN, &t, InvalidSnapshot, false);
	values[0] = Int32GetDatum(t.id);
	for (i = 1; i <= 5; i++)
	{
		values[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
	}
	if (idem_run_as_owner(&plan_alter,
						  "UPDATE idempotency.outbox_topic AS t"
						  "   SET max_attempts = COALESCE($2, t.max_attempts),"
						  "       backoff_base = COALESCE($3, t.backoff_base),"
						  "       backoff_max = COALESCE($4, t.backoff_max),"
						  "       retention = COALESCE($5, t.retention),"
						  "       notify = COALESCE($6, t.notify)"
						  " WHERE t.id OPERATOR(pg_catalog.=) $1",
						  6, argtypes, values, nulls, SPI_OK_UPDATE) == 0)
		topic_gone(topic);
	topics_changed();
	SPI_finish();
	PG_RETURN_VOID();
}

/* drop_topic(topic, force): the caller's topic with its grants and messages */
PG_FUNCTION_INFO_V1(idempotency_drop_topic);

Datum
idempotency_drop_topic(PG_FUNCTION_ARGS)
{
	char	   *topic = idem_outbox_topic_arg(fcinfo, 0);
	bool		force = !PG_ARGISNULL(1) && PG_GETARG_BOOL(1);
	Oid			argtypes[1] = {INT4OID};
	Datum		values[1];
	Topic		t;

	SPI_connect();
	for (;;)
	{
		Topic		now;

		(void) idem_outbox_topic_lookup(topic, RIGHT_OWN, &t, InvalidSnapshot, false);
		/* wait for the publishers' transactions; hold off new ones */
		(void) topic_lock(t.id, ExclusiveLock);
		/* another drop_topic() may have committed meanwhile */
		if (idem_outbox_topic_lookup(topic, RIGHT_OWN, &now, GetLatestSnapshot(), true) &&
			now.id == t.id)
			break;
		if (IsolationUsesXactSnapshot())
			topic_serialization_failure(topic, "Topic was dropped", "drop_topic()");
	}
	values[0] = Int32GetDatum(t.id);
	if (!force)
	{
		bool		isnull;
		int64		n;

		idem_run_as_owner(&plan_pending,
						  "SELECT pg_catalog.count(*) FROM idempotency.outbox_message AS m"
						  " WHERE m.topic_id OPERATOR(pg_catalog.=) $1"
						  "   AND m.state OPERATOR(pg_catalog.=) 'pending'",
						  1, argtypes, values, NULL, SPI_OK_SELECT);
		n = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
		if (n > 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_IN_USE),
					 errmsg("topic \"%s\" has undelivered messages", topic),
					 errdetail_plural("%lld message of the topic is not delivered yet.",
									  "%lld messages of the topic are not delivered yet.",
									  (unsigned long) n, (long long) n),
					 errhint("Use drop_topic(topic, force => true) to drop them too.")));
	}
	idem_run_as_owner(&plan_drop_messages,
					  "DELETE FROM idempotency.outbox_message AS m"
					  " WHERE m.topic_id OPERATOR(pg_catalog.=) $1",
					  1, argtypes, values, NULL, SPI_OK_DELETE);

	/*
	 * With the lock, READ COMMITTED's statements saw every message that will
	 * ever have been published to the topic.  A transaction snapshot may not
	 * have: a message committed since would outlive its topic.
	 */
	if (IsolationUsesXactSnapshot() &&
		idem_run_as_owner_snap(&plan_drop_left,
							   "SELECT 1 FROM idempotency.outbox_message AS m"
							   " WHERE m.topic_id OPERATOR(pg_catalog.=) $1 LIMIT 1",
							   1, argtypes, values, NULL, SPI_OK_SELECT,
							   GetLatestSnapshot()) > 0)
		topic_serialization_failure(topic, "A message was published to topic", "publish()");
	idem_run_as_owner(&plan_drop,
					  "DELETE FROM idempotency.outbox_topic AS t"
					  " WHERE t.id OPERATOR(pg_catalog.=) $1",
					  1, argtypes, values, NULL, SPI_OK_DELETE);
	idem_owners_topic_gone(t.id);
	topics_changed();
	SPI_finish();
	PG_RETURN_VOID();
}

/* grant_topic(topic, grantee, publish, consume): share one of the caller's topics */
PG_FUNCTION_INFO_V1(idempotency_grant_topic);

Datum
idempotency_grant_topic(PG_FUNCTION_ARGS)
{
	char	   *topic = idem_outbox_topic_arg(fcinfo, 0);
	Oid			argtypes[5] = {INT4OID, REGROLEOID, REGROLEOID, BOOLOID, BOOLOID};
	Datum		values[5];
	Topic		t;

	idem_outbox_not_null(fcinfo, 1, "grantee");
	idem_outbox_not_null(fcinfo, 2, "publish");
	idem_outbox_not_null(fcinfo, 3, "consume");
	SPI_connect();
	(void) idem_outbox_topic_lookup(topic, RIGHT_OWN, &t, InvalidSnapshot, false);
	values[0] = Int32GetDatum(t.id);
	values[1] = PG_GETARG_DATUM(1);
	values[2] = ObjectIdGetDatum(t.owner);
	values[3] = PG_GETARG_DATUM(2);
	values[4] = PG_GETARG_DATUM(3);

	/*
	 * The topic's row is locked as the grant's foreign key would lock it, in
	 * the statement itself: a drop_topic() in flight is waited for, and a
	 * topic it dropped gives no row (42704) rather than a key violation.
	 */
	if (idem_run_as_owner(&plan_grant,
						  "INSERT INTO idempotency.outbox_grant AS g"
						  "  (topic_id, grantee, topic_owner, can_publish, can_consume)"
						  " SELECT t.id, $2, $3, $4, $5 FROM idempotency.outbox_topic AS t"
						  "  WHERE t.id OPERATOR(pg_catalog.=) $1 FOR KEY SHARE OF t"
						  " ON CONFLICT (topic_id, grantee) DO UPDATE"
						  "   SET can_publish = excluded.can_publish, can_consume = excluded.can_consume",
						  5, argtypes, values, NULL, SPI_OK_INSERT) == 0)
		topic_gone(topic);
	topics_changed();
	SPI_finish();
	PG_RETURN_VOID();
}

/* revoke_topic(topic, grantee) -> whether the role had a grant */
PG_FUNCTION_INFO_V1(idempotency_revoke_topic);

Datum
idempotency_revoke_topic(PG_FUNCTION_ARGS)
{
	char	   *topic = idem_outbox_topic_arg(fcinfo, 0);
	Oid			argtypes[2] = {INT4OID, REGROLEOID};
	Datum		values[2];
	Topic		t;
	bool		found;

	idem_outbox_not_null(fcinfo, 1, "grantee");
	SPI_connect();
	(void) idem_outbox_topic_lookup(topic, RIGHT_OWN, &t, InvalidSnapshot, false);
	values[0] = Int32GetDatum(t.id);
	values[1] = PG_GETARG_DATUM(1);
	found = idem_run_as_owner(&plan_revoke,
							  "DELETE FROM idempotency.outbox_grant AS g"
							  " WHERE g.topic_id OPERATOR(pg_catalog.=) $1"
							  "   AND g.grantee OPERATOR(pg_catalog.=) $2",
							  2, argtypes, values, NULL, SPI_OK_DELETE) > 0;
	topics_changed();
	SPI_finish();
	PG_RETURN_BOOL(found);
}
