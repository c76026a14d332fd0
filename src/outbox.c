/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  What the outbox's SQL functions share (outbox.h): argument checks, a
 *	  topic and the caller's rights on it (lookup, the topic lock, the
 *	  publish() cache), and a message key's lock.
 *
 * publish() is in outbox_publish.c, the relay API (claim, ack, nack,
 * release, redrive) in outbox_relay.c, topics and their grants in
 * outbox_topics.c; relays are woken at commit by wakeup.c (wait_for()),
 * and topics that ask for it are also NOTIFYed by outbox_notify.c.  The
 * tables, a message's life, the order per message key and how a topic is
 * dropped under its publishers: src/README.md, "The outbox".
 *
 * Locking: a keyed message's lock, an advisory tag on (topic, key), field4
 * OUTBOX_LOCK_FIELD4, keyed by the key store's SipHash, taken before the message
 * id is drawn and held to the publisher's transaction's end (deadlocks
 * between keys are the deadlock detector's; lock_timeout applies); the
 * topic's lock, field4 OUTBOX_TOPIC_LOCK_FIELD4, ShareLock for publishers
 * and ExclusiveLock for drop_topic(), to the transaction's end (a prepared
 * transaction keeps both until COMMIT/ROLLBACK PREPARED); row locks of the
 * messages a statement updates.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "catalog/namespace.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/acl.h"
#include "utils/array.h"
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
#include "outbox.h"

#define OUTBOX_LOCK_FIELD4 0x4945	/* 18757: pg_locks objsubid of a key's
									 * lock */
#define OUTBOX_TOPIC_LOCK_FIELD4 0x4946 /* 18758: of a topic's lock (objid:
										 * its id) */

/* ---------------------------------------------------------------------
 * For the outbox's files (outbox.h): arguments, a topic and its rights
 * ---------------------------------------------------------------------
 */

/* 22004 for a NULL argument that must not be NULL */
void
idem_outbox_not_null(FunctionCallInfo fcinfo, int arg, const char *name)
{
	if (PG_ARGISNULL(arg))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
}

/* the topic argument, validated: 1..40 of [A-Za-z0-9_.:-] (22023) */
char *
idem_outbox_topic_arg(FunctionCallInfo fcinfo, int arg)
{
	char	   *topic;
	const char *p;

	idem_outbox_not_null(fcinfo, arg, "topic");
	topic = text_to_cstring(PG_GETARG_TEXT_PP(arg));
	for (p = topic; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
			  (*p >= '0' && *p <= '9') || *p == '_' || *p == '.' ||
			  *p == ':' || *p == '-'))
			break;
	if (*p != '\0' || p == topic || p - topic > TOPIC_MAX_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid topic name \"%s\"", topic),
				 errdetail("A topic name has 1 to %d characters, each a letter, digit, '_', '.', ':' or '-'.",
						   TOPIC_MAX_LEN)));
	return topic;
}

/* 22023 unless iv is >= 0 (> 0 when positive) */
void
idem_outbox_check_interval(const Interval *iv, const char *name, bool positive)
{
	Interval	zero;
	int			cmp;

	memset(&zero, 0, sizeof(zero));
	cmp = DatumGetInt32(DirectFunctionCall2(interval_cmp, IntervalPGetDatum(iv),
											IntervalPGetDatum(&zero)));
	if (cmp < 0 || (positive && cmp == 0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be %s", name, positive ? "positive" : "zero or positive")));
}

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
bool
idem_outbox_topic_lock(int32 id, LOCKMODE mode)
{
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, (uint32) id, OUTBOX_TOPIC_LOCK_FIELD4);
	return LockAcquire(&tag, mode, false, false) == LOCKACQUIRE_OK;
}

/*
 * 40001: this transaction's snapshot does not show what another one
 * committed (a drop of the topic, or a message published to it)
 */
void
idem_outbox_topic_serialization_failure(const char *name, const char *what, const char *by)
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
void
idem_outbox_topic_for_publish(const char *name, Topic *out)
{
	for (;;)
	{
		Topic		now;

		topic_cached(name, out);
		if (!idem_outbox_topic_lock(out->id, ShareLock))
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
			idem_outbox_topic_serialization_failure(name, "Topic was dropped", "drop_topic()");
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
	idem_relcache_watch();
	if (topic_cache == NULL || topic_cache_stale)
	{
		HASHCTL		ctl;

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
void
idem_outbox_topics_changed(void)
{
	outbox_relids();
	CacheInvalidateRelcacheByRelid(topic_relid);
	topic_cache_stale = true;
}

/* the OID of outbox_message_id_seq, looked up again if an invalidation reset it */
Oid
idem_outbox_message_seq(void)
{
	outbox_relids();
	return message_seq_relid;
}

/* take the lock of (topic, key) for this transaction: see the file comment */
void
idem_outbox_key_lock(text *topic, text *key)
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

/*
 * May the caller see topic_id's counts and claims?  A role in
 * pg_read_all_stats sees every topic (as outbox_stats shows them); others,
 * the topics they see in outbox_topic (its row-level security: owned or
 * granted).
 */
bool
idem_outbox_topic_visible(int32 topic_id)
{
	Oid			types[1] = {INT4OID};
	Datum		values[1];
	bool		visible;

	if (has_privs_of_role(GetUserId(), ROLE_PG_READ_ALL_STATS))
		return true;
	values[0] = Int32GetDatum(topic_id);
	SPI_connect();
	if (SPI_execute_with_args("SELECT 1 FROM idempotency.outbox_topic AS t"
							  " WHERE t.id OPERATOR(pg_catalog.=) $1",
							  1, types, values, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read idempotency.outbox_topic");
	visible = SPI_processed > 0;
	SPI_finish();
	return visible;
}

/* int8[] argument arg as a Datum, 22004 if NULL, 22023 if it has NULLs */
Datum
idem_outbox_ids_arg(FunctionCallInfo fcinfo, int arg)
{
	ArrayType  *a;

	idem_outbox_not_null(fcinfo, arg, "ids");
	a = PG_GETARG_ARRAYTYPE_P(arg);
	if (array_contains_nulls(a))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids must not contain nulls")));
	return PointerGetDatum(a);
}

/* from _PG_init: our relcache callback */
void
idem_outbox_init(void)
{
	idem_relcache_add(outbox_relcache);
}
