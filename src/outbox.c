/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  The outbox (features floor): publish() in the caller's transaction,
 *	  claim/ack/nack/release/redrive for relays, topics and their grants.
 *
 * Tables (idempotency--0.5.0.sql): outbox_topic (one row per topic, owned
 * by a role), outbox_grant (what other roles may do with a topic),
 * outbox_message (one row per message).  Plain roles only read them
 * (row-level security); every write is a statement prepared once, run as
 * the extension's owner with the caller's role as a parameter (runas.c),
 * and every statement checks the caller's right on the topic itself.
 *
 * A message's life: publish() inserts it 'pending' with available_at =
 * now (+ deliver_after).  claim() hands out ready pending messages with a
 * fresh claim token and available_at = now + visibility, attempts + 1;
 * nobody else can claim it until available_at passes.  ack(claim, ids)
 * makes it 'delivered' with expires_at = now + the topic's retention (the
 * purge in lifecycle.c deletes it then, in batches, counting it into the
 * topic's purged_* counters).  nack() gives it back with a retry time
 * (capped exponential backoff unless given) or makes it 'dead' after
 * max_attempts; release() gives it back unattempted.  A claim whose
 * visibility passed is claimed again (attempt counted); at max_attempts
 * it goes dead instead.  ack/nack/release name the claim token, so a relay
 * whose claim was taken over can no longer change the message.
 *
 * Order per message key, in commit order.  publish() of a keyed message
 * first takes a transaction-level lock on (topic, key) -- an advisory lock
 * tag, field4 OUTBOX_LOCK_FIELD4, named by the keyed SipHash of keyid.c so
 * no role can aim a collision at another's keys -- and only then draws the
 * message id from the sequence.  A second publisher of the key waits for
 * the first to commit or roll back before it draws its id.  So, per key,
 * id order is commit order (ids of rolled-back publishers leave gaps, which
 * nothing relies on), and when a snapshot sees a key's message it also sees
 * every earlier committed message of that key.  claim() takes a keyed
 * message only if no pending message of its key has a smaller id (the
 * earlier one is delivered or dead), so a key has at most one message out at
 * a time, and the next one becomes claimable only when the earlier one is
 * acked or dead.  There is no cursor or watermark: every claim looks at all
 * pending rows, so a message whose transaction commits late is found by the
 * next claim, never skipped.  Concurrent claims skip each other's locked
 * rows (FOR UPDATE SKIP LOCKED) and re-check state and available_at on the
 * row they lock.
 *
 * Redrive: a redriven message takes a new row id, drawn after its key's
 * lock like a published one (its message_id stays), so it queues behind
 * every message of its key, and one of them that is out keeps it waiting
 * (issue 25, finding 3: with its old id it went out beside it).
 *
 * Wake-ups: publish() (and release(), redrive()) hand the topic to
 * wakeup.c, which wakes the topic's relays blocked in wait_for() through
 * shared memory once the transaction has committed (no lock, no queue: see
 * wakeup.c).  Only a topic created or altered with notify => true (off by
 * default since 0.6.0) is also announced with NOTIFY, for plain SQL
 * clients that LISTEN: these queue the channel
 * "idempotency.outbox.<topic>" in this backend, once per transaction and
 * topic, and a PRE_COMMIT transaction callback NOTIFYs each with an empty
 * payload (PRE_COMMIT runs before PostgreSQL's PreCommit_Notify()), so a
 * transaction wakes each topic's relays once, at commit.  NOTIFY is not
 * issued before commit because PostgreSQL refuses to PREPARE a transaction
 * that issued one (issue 25, finding 8): a prepared transaction notifies
 * nobody, and relays find its messages at their next poll.  A rolled-back
 * subtransaction takes its wake-ups with it.  The price of NOTIFY:
 * PostgreSQL serialises the commits of all notifying transactions (async.c
 * takes a cluster-wide lock before the commit record and holds it past the
 * WAL flush), which is why it is off by default.
 *
 * Dropping a topic (issue 25, finding 2): messages have no foreign key to
 * their topic (it would lock the topic row for every publish), so a
 * drop_topic() that counted and deleted the committed messages could miss
 * an open publisher's message, which then outlived its topic.  Now a
 * transaction that publishes to a topic holds the topic: an advisory lock
 * on its id (field4 OUTBOX_TOPIC_LOCK_FIELD4, unreachable from
 * pg_advisory_lock()), ShareLock, taken at its first publish() to the topic
 * and held to its end; drop_topic() takes it ExclusiveLock, so it waits
 * for the open publishers and new ones wait for it.  Whoever gets the lock
 * then looks the topic up again with the newest snapshot, since the other
 * may have committed just before: a publisher finds the topic gone and
 * fails (42704), a drop counts and deletes with a fresh statement snapshot
 * (READ COMMITTED).  A transaction snapshot (REPEATABLE READ, SERIALIZABLE)
 * cannot see what committed after it: there a publisher whose snapshot
 * still shows a dropped topic, and a drop that leaves a message behind in
 * the newest snapshot, fail with 40001 instead.
 *
 * Locking: the per-key lock above (until the publisher's transaction
 * ends; deadlocks between keys are found by the deadlock detector, and the
 * session's lock_timeout applies); the topic's lock (publishers shared,
 * drop_topic() exclusive, until the transaction ends; a prepared
 * transaction keeps both until COMMIT/ROLLBACK PREPARED); row locks of the
 * messages a statement updates.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "catalog/namespace.h"
#include "commands/async.h"
#include "commands/sequence.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "compat.h"
#include "idempotency.h"

#define OUTBOX_LOCK_FIELD4 0x4945	/* 18757: pg_locks objsubid of a key's lock */
#define OUTBOX_TOPIC_LOCK_FIELD4 0x4946	/* 18758: of a topic's lock (objid: its id) */
#define TOPIC_MAX_LEN 40
#define CHANNEL_PREFIX "idempotency.outbox."
#define CLAIM_MAX_BATCH 10000
#define CLAIM_WINDOW_MIN 64	/* ready messages a claim looks at first */

/* the caller's rights on a topic, as the lookup statement reports them */
typedef struct Topic
{
	int32		id;
	Oid			owner;
	bool		may_publish;
	bool		may_consume;
	bool		notify;			/* NOTIFY at publish */
	int32		max_attempts;
} Topic;

typedef enum TopicRight
{
	RIGHT_PUBLISH,
	RIGHT_CONSUME,
	RIGHT_OWN
} TopicRight;

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */

/* 22004 for a NULL argument that must not be NULL */
static void
not_null(FunctionCallInfo fcinfo, int arg, const char *name)
{
	if (PG_ARGISNULL(arg))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
}

/* the topic argument, validated: 1..40 of [A-Za-z0-9_.:-] (22023) */
static char *
topic_arg(FunctionCallInfo fcinfo, int arg)
{
	char	   *topic;
	const char *p;

	not_null(fcinfo, arg, "topic");
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
static void
check_interval(const Interval *iv, const char *name, bool positive)
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
 * such topic (unless missing_ok: then return false) and 42501 if the caller
 * lacks right.  snap: InvalidSnapshot for the statement's own, or one to read
 * with (GetLatestSnapshot(): see "Dropping a topic" in the file comment).
 * Inside SPI_connect().
 */
static bool
topic_lookup(const char *name, TopicRight right, Topic *out, Snapshot snap,
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
 * for drop_topic() (see "Dropping a topic" in the file comment).  Returns
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
 * The publish() cache: each backend keeps what topic_lookup() said about
 * (topic, role), and the OIDs of outbox_topic and the message id sequence.
 * Every function that changes a topic or a grant invalidates the relcache
 * entry of outbox_topic (sent to every backend at commit), which empties
 * the cache; so does anything that drops or recreates the tables.  (A
 * superuser's hand-made UPDATE of the tables is not seen until then.)
 * publish() reads pending invalidations first (AcceptInvalidationMessages):
 * a transaction that holds every lock it needs reads none by itself, and
 * kept publishing after a revoke_topic() had committed (issue 25).
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

void
idem_outbox_relcache(Oid relid)
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
 * and the topic held for the transaction (see "Dropping a topic" in the
 * file comment): the first publish() to a topic in a transaction takes the
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
		if (topic_lookup(name, RIGHT_PUBLISH, &now, GetLatestSnapshot(), true) &&
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

/* remember what topic_lookup() said about (name, the current role) */
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
	(void) topic_lookup(name, RIGHT_PUBLISH, out, InvalidSnapshot, false);
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

/*
 * The message id: 128 fresh bits (keyid.c: idem_unique128, a per-process
 * SipHash stream keyed by pg_strong_random) as a version 4 UUID.  Nothing
 * a template clone, a restored dump or a rewound sequence copies enters it,
 * so two databases never issue the same id (as 0.5.0 did, from the row id
 * and the database's lock secret); far cheaper than gen_random_uuid()
 * (pg_strong_random on every call).
 */
static Datum
message_uuid(MemoryContext cxt)
{
	pg_uuid_t  *u = MemoryContextAlloc(cxt, sizeof(pg_uuid_t));

	idem_unique128(u->data);
	u->data[6] = (u->data[6] & 0x0f) | 0x40;	/* version 4 */
	u->data[8] = (u->data[8] & 0x3f) | 0x80;	/* RFC 4122 variant */
	return UUIDPGetDatum(u);
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

/*
 * Wake-ups wait here until commit (see "Wake-ups" in the file comment):
 * one entry per channel, with the lowest (sub)transaction level that
 * queued it; in TopTransactionContext, forgotten at the end of the
 * transaction.
 */
typedef struct PendingWake
{
	char		channel[NAMEDATALEN];
	int			level;
} PendingWake;

static HTAB *pending_wakes = NULL;
static bool wake_callbacks = false;

/* at commit, NOTIFY each queued channel; at PREPARE, nobody */
static void
wake_xact_callback(XactEvent event, void *arg pg_attribute_unused())
{
	HASH_SEQ_STATUS seq;
	PendingWake *w;
	HTAB	   *wakes = pending_wakes;

	if (wakes == NULL)
		return;
	pending_wakes = NULL;
	/* PRE_COMMIT runs before PreCommit_Notify(), which sends them */
	if (event == XACT_EVENT_PRE_COMMIT)
	{
		hash_seq_init(&seq, wakes);
		while ((w = hash_seq_search(&seq)) != NULL)
			Async_Notify(w->channel, "");
	}
	/* any other event ends the transaction or prepares it: drop them */
}

/* a subtransaction's wake-ups go with its abort, to its parent on commit */
static void
wake_subxact_callback(SubXactEvent event, SubTransactionId mySubid pg_attribute_unused(),
					  SubTransactionId parentSubid pg_attribute_unused(),
					  void *arg pg_attribute_unused())
{
	HASH_SEQ_STATUS seq;
	PendingWake *w;
	int			level = GetCurrentTransactionNestLevel();

	if (pending_wakes == NULL ||
		(event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB))
		return;
	hash_seq_init(&seq, pending_wakes);
	while ((w = hash_seq_search(&seq)) != NULL)
	{
		if (w->level < level)
			continue;
		if (event == SUBXACT_EVENT_COMMIT_SUB)
			w->level = level - 1;
		else
			(void) hash_search(pending_wakes, w->channel, HASH_REMOVE, NULL);
	}
}

/*
 * Wake the topic's relays at commit: NOTIFY "idempotency.outbox.<topic>"
 * with an empty payload, once per transaction and topic.
 */
static void
notify_topic(const char *topic)
{
	char		channel[NAMEDATALEN];
	PendingWake *w;
	bool		found;
	int			level = GetCurrentTransactionNestLevel();

	StaticAssertStmt(sizeof(CHANNEL_PREFIX) + TOPIC_MAX_LEN <= NAMEDATALEN,
					 "a topic's channel fits a NOTIFY channel name");
	if (!wake_callbacks)
	{
		RegisterXactCallback(wake_xact_callback, NULL);
		RegisterSubXactCallback(wake_subxact_callback, NULL);
		wake_callbacks = true;
	}
	if (pending_wakes == NULL)
	{
		HASHCTL		ctl;

		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = NAMEDATALEN;
		ctl.entrysize = sizeof(PendingWake);
		ctl.hcxt = TopTransactionContext;
		pending_wakes = hash_create("idempotency outbox wake-ups", 8, &ctl,
									HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	memset(channel, 0, sizeof(channel));
	snprintf(channel, sizeof(channel), "%s%s", CHANNEL_PREFIX, topic);
	w = hash_search(pending_wakes, channel, HASH_ENTER, &found);
	if (!found || w->level > level)
		w->level = level;
}

/* int8[] argument arg as a Datum, 22004 if NULL, 22023 if it has NULLs */
static Datum
ids_arg(FunctionCallInfo fcinfo, int arg)
{
	ArrayType  *a;

	not_null(fcinfo, arg, "ids");
	a = PG_GETARG_ARRAYTYPE_P(arg);
	if (array_contains_nulls(a))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids must not contain nulls")));
	return PointerGetDatum(a);
}

/* ---------------------------------------------------------------------
 * Topics
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_create = NULL;
static SPIPlanPtr plan_alter = NULL;
static SPIPlanPtr plan_pending = NULL;
static SPIPlanPtr plan_drop_messages = NULL;
static SPIPlanPtr plan_drop_left = NULL;
static SPIPlanPtr plan_drop = NULL;
static SPIPlanPtr plan_grant = NULL;
static SPIPlanPtr plan_revoke = NULL;

/* create_topic(topic, max_attempts, backoff_base, backoff_max, retention) -> id */
PG_FUNCTION_INFO_V1(idempotency_create_topic);

Datum
idempotency_create_topic(PG_FUNCTION_ARGS)
{
	char	   *topic = topic_arg(fcinfo, 0);
	Oid			argtypes[7] = {TEXTOID, REGROLEOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID, BOOLOID};
	Datum		values[7];
	int			i;
	bool		isnull;
	int32		id;

	for (i = 1; i <= 5; i++)
		not_null(fcinfo, i, i == 1 ? "max_attempts" : i == 2 ? "backoff_base" :
				 i == 3 ? "backoff_max" : i == 4 ? "retention" : "notify");
	if (PG_GETARG_INT32(1) < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_attempts must be at least 1")));
	check_interval(PG_GETARG_INTERVAL_P(2), "backoff_base", false);
	check_interval(PG_GETARG_INTERVAL_P(3), "backoff_max", false);
	check_interval(PG_GETARG_INTERVAL_P(4), "retention", false);

	values[0] = CStringGetTextDatum(topic);
	values[1] = ObjectIdGetDatum(GetUserId());
	for (i = 1; i <= 5; i++)
		values[i + 1] = PG_GETARG_DATUM(i);
	SPI_connect();
	if (idem_run_as_owner(&plan_create,
						  "INSERT INTO idempotency.outbox_topic AS t"
						  "  (name, owner, max_attempts, backoff_base, backoff_max, retention, notify)"
						  " VALUES ($1, $2, $3, $4, $5, $6, $7)"
						  " ON CONFLICT (name) DO NOTHING RETURNING t.id",
						  7, argtypes, values, NULL, SPI_OK_INSERT_RETURNING) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("topic \"%s\" already exists", topic),
				 errdetail("Topic names are shared by every role of the database.")));
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
	char	   *topic = topic_arg(fcinfo, 0);
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
			check_interval(PG_GETARG_INTERVAL_P(i),
						   i == 2 ? "backoff_base" : i == 3 ? "backoff_max" : "retention", false);
	SPI_connect();
	(void) topic_lookup(topic, RIGHT_OWN, &t, InvalidSnapshot, false);
	values[0] = Int32GetDatum(t.id);
	for (i = 1; i <= 5; i++)
	{
		values[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
	}
	idem_run_as_owner(&plan_alter,
					  "UPDATE idempotency.outbox_topic AS t"
					  "   SET max_attempts = COALESCE($2, t.max_attempts),"
					  "       backoff_base = COALESCE($3, t.backoff_base),"
					  "       backoff_max = COALESCE($4, t.backoff_max),"
					  "       retention = COALESCE($5, t.retention),"
					  "       notify = COALESCE($6, t.notify)"
					  " WHERE t.id OPERATOR(pg_catalog.=) $1",
					  6, argtypes, values, nulls, SPI_OK_UPDATE);
	topics_changed();
	SPI_finish();
	PG_RETURN_VOID();
}

/* drop_topic(topic, force): the caller's topic with its grants and messages */
PG_FUNCTION_INFO_V1(idempotency_drop_topic);

Datum
idempotency_drop_topic(PG_FUNCTION_ARGS)
{
	char	   *topic = topic_arg(fcinfo, 0);
	bool		force = !PG_ARGISNULL(1) && PG_GETARG_BOOL(1);
	Oid			argtypes[1] = {INT4OID};
	Datum		values[1];
	Topic		t;

	SPI_connect();
	for (;;)
	{
		Topic		now;

		(void) topic_lookup(topic, RIGHT_OWN, &t, InvalidSnapshot, false);
		/* wait for the publishers' transactions; hold off new ones */
		(void) topic_lock(t.id, ExclusiveLock);
		/* another drop_topic() may have committed meanwhile */
		if (topic_lookup(topic, RIGHT_OWN, &now, GetLatestSnapshot(), true) &&
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
	 * With the lock, READ COMMITTED's statements saw every message that
	 * will ever have been published to the topic.  A transaction snapshot
	 * may not have: a message committed since would outlive its topic.
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
	topics_changed();
	SPI_finish();
	PG_RETURN_VOID();
}

/* grant_topic(topic, grantee, publish, consume): share one of the caller's topics */
PG_FUNCTION_INFO_V1(idempotency_grant_topic);

Datum
idempotency_grant_topic(PG_FUNCTION_ARGS)
{
	char	   *topic = topic_arg(fcinfo, 0);
	Oid			argtypes[5] = {INT4OID, REGROLEOID, REGROLEOID, BOOLOID, BOOLOID};
	Datum		values[5];
	Topic		t;

	not_null(fcinfo, 1, "grantee");
	not_null(fcinfo, 2, "publish");
	not_null(fcinfo, 3, "consume");
	SPI_connect();
	(void) topic_lookup(topic, RIGHT_OWN, &t, InvalidSnapshot, false);
	values[0] = Int32GetDatum(t.id);
	values[1] = PG_GETARG_DATUM(1);
	values[2] = ObjectIdGetDatum(t.owner);
	values[3] = PG_GETARG_DATUM(2);
	values[4] = PG_GETARG_DATUM(3);
	idem_run_as_owner(&plan_grant,
					  "INSERT INTO idempotency.outbox_grant AS g"
					  "  (topic_id, grantee, topic_owner, can_publish, can_consume)"
					  " VALUES ($1, $2, $3, $4, $5)"
					  " ON CONFLICT (topic_id, grantee) DO UPDATE"
					  "   SET can_publish = excluded.can_publish, can_consume = excluded.can_consume",
					  5, argtypes, values, NULL, SPI_OK_INSERT);
	topics_changed();
	SPI_finish();
	PG_RETURN_VOID();
}

/* revoke_topic(topic, grantee) -> whether the role had a grant */
PG_FUNCTION_INFO_V1(idempotency_revoke_topic);

Datum
idempotency_revoke_topic(PG_FUNCTION_ARGS)
{
	char	   *topic = topic_arg(fcinfo, 0);
	Oid			argtypes[2] = {INT4OID, REGROLEOID};
	Datum		values[2];
	Topic		t;
	bool		found;

	not_null(fcinfo, 1, "grantee");
	SPI_connect();
	(void) topic_lookup(topic, RIGHT_OWN, &t, InvalidSnapshot, false);
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

/* ---------------------------------------------------------------------
 * publish
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_publish = NULL;

/*
 * publish(topic, payload, message_key, headers, deliver_after) -> message id
 *
 * The hot path: the topic and the caller's right from the backend's cache,
 * the key's lock (keyed messages), the row id from the sequence, the
 * message id from the row id, one prepared INSERT, one NOTIFY.
 */
PG_FUNCTION_INFO_V1(idempotency_publish);

Datum
idempotency_publish(PG_FUNCTION_ARGS)
{
	char	   *topic = topic_arg(fcinfo, 0);
	Oid			argtypes[11] = {INT8OID, INT4OID, REGROLEOID, UUIDOID, TEXTOID, JSONBOID,
	JSONBOID, TIMESTAMPTZOID, TIMESTAMPTZOID, REGROLEOID, TEXTOID};
	Datum		values[11];
	char		nulls[11] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz available = now;
	Topic		t;
	int64		id;
	MemoryContext caller_cxt;

	not_null(fcinfo, 1, "payload");
	if (!PG_ARGISNULL(3) && !JB_ROOT_IS_OBJECT(PG_GETARG_JSONB_P(3)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers must be a JSON object"),
				 errdetail("A message's headers are {\"name\": \"value\", ...}.")));
	if (!PG_ARGISNULL(4))
	{
		check_interval(PG_GETARG_INTERVAL_P(4), "deliver_after", false);
		available = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
															TimestampTzGetDatum(now),
															PG_GETARG_DATUM(4)));
	}

	caller_cxt = CurrentMemoryContext;
	SPI_connect();
	topic_for_publish(topic, &t);

	/* keyed: the key's lock before the id (see the file comment) */
	if (!PG_ARGISNULL(2))
		key_lock(PG_GETARG_TEXT_PP(0), PG_GETARG_TEXT_PP(2));
	outbox_relids();			/* the lookup may have reset them */
	id = nextval_internal(message_seq_relid, false);

	values[0] = Int64GetDatum(id);
	values[1] = Int32GetDatum(t.id);
	values[2] = ObjectIdGetDatum(t.owner);
	/* returned after SPI_finish(): allocated in the caller's context */
	values[3] = message_uuid(caller_cxt);
	values[4] = PG_ARGISNULL(2) ? (Datum) 0 : PG_GETARG_DATUM(2);
	nulls[4] = PG_ARGISNULL(2) ? 'n' : ' ';
	values[5] = PG_GETARG_DATUM(1);
	values[6] = PG_ARGISNULL(3) ? DirectFunctionCall1(jsonb_in, CStringGetDatum("{}")) :
		PG_GETARG_DATUM(3);
	values[7] = TimestampTzGetDatum(available);
	values[8] = TimestampTzGetDatum(now);
	values[9] = ObjectIdGetDatum(GetUserId());
	values[10] = CStringGetTextDatum("pending");
	if (idem_run_as_owner(&plan_publish,
						  "INSERT INTO idempotency.outbox_message"
						  "  (id, topic_id, owner, message_id, message_key, payload, headers,"
						  "   available_at, published_at, published_by, state)"
						  " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
						  11, argtypes, values, nulls, SPI_OK_INSERT) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
				 errmsg("the message was not stored in table idempotency.outbox_message"),
				 errdetail("A trigger on the table skipped the row.")));
	SPI_finish();

	idem_wake_at_commit(t.id);	/* wakeup.c: wait_for() */
	if (t.notify)
		notify_topic(topic);
	PG_RETURN_DATUM(values[3]);
}

/* ---------------------------------------------------------------------
 * Relays
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_claim = NULL;
static SPIPlanPtr plan_ack = NULL;
static SPIPlanPtr plan_nack = NULL;
static SPIPlanPtr plan_release = NULL;
static SPIPlanPtr plan_redrive = NULL;
static SPIPlanPtr plan_redrive_pick = NULL;

/* the caller may consume the message's topic: the condition ack etc. share */
#define MAY_CONSUME \
	"   AND t.id OPERATOR(pg_catalog.=) m.topic_id" \
	"   AND (t.owner OPERATOR(pg_catalog.=) $3" \
	"        OR EXISTS (SELECT 1 FROM idempotency.outbox_grant AS g" \
	"                    WHERE g.topic_id OPERATOR(pg_catalog.=) t.id" \
	"                      AND g.grantee OPERATOR(pg_catalog.=) $3" \
	"                      AND g.can_consume))"

/*
 * The claim statements.  Both lock candidates FOR UPDATE SKIP LOCKED in
 * availability order, re-check state and available_at on the locked row,
 * and update it (a lapsed claim at max_attempts: dead instead), after a
 * CTE "cand": ids of ready messages that are unkeyed or the earliest
 * pending message of their key.  They return the outbox_claim columns and
 * whether the message was claimed (false: it went dead; claim_run() counts
 * those and the claim runs again for the places they took).
 */
#define CLAIM_SQL_REST \
	", c AS (" \
	" UPDATE idempotency.outbox_message AS m" \
	"    SET attempts = CASE WHEN m.attempts OPERATOR(pg_catalog.>=) $6 THEN m.attempts" \
	"                   ELSE m.attempts OPERATOR(pg_catalog.+) 1 END," \
	"        claim = CASE WHEN m.attempts OPERATOR(pg_catalog.>=) $6 THEN NULL ELSE $3 END," \
	"        available_at = $4," \
	"        state = CASE WHEN m.attempts OPERATOR(pg_catalog.>=) $6 THEN 'dead' ELSE 'pending' END," \
	"        last_error = CASE WHEN m.claim IS NULL THEN m.last_error" \
	"                     ELSE '{\"error\": \"visibility timeout: the claim lapsed without ack or nack\"}'::pg_catalog.jsonb END" \
	"  WHERE m.id OPERATOR(pg_catalog.=) ANY (ARRAY(" \
	"        SELECT r.id FROM idempotency.outbox_message AS r" \
	"         WHERE r.id OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT cand.id FROM cand))" \
	"           AND r.state OPERATOR(pg_catalog.=) 'pending'" \
	"           AND r.available_at OPERATOR(pg_catalog.<=) $5" \
	"         ORDER BY r.available_at, r.id" \
	"         LIMIT $2 FOR UPDATE SKIP LOCKED))" \
	"    AND m.state OPERATOR(pg_catalog.=) 'pending'" \
	"    AND m.available_at OPERATOR(pg_catalog.<=) $5" \
	" RETURNING m.id, m.message_id, m.message_key, m.payload, m.headers," \
	"           m.attempts, m.published_at, m.state)" \
	" SELECT c.id, c.message_id, $7, c.message_key, c.payload, c.headers," \
	"        c.attempts, c.published_at, $3, $4," \
	"        c.state OPERATOR(pg_catalog.=) 'pending'" \
	"   FROM c ORDER BY c.id"

/*
 * The window: the first $8 ready messages in availability order (max(64, 4 x batch_size)), those
 * that are unkeyed or their key's earliest pending message.  Enough almost
 * always; without the bound a claim would look at every message of a
 * key's backlog (each one blocked behind the key's head) whenever fewer
 * than batch_size messages are claimable.
 */
#define CLAIM_WINDOW \
	"cand AS (" \
	" SELECT w.id FROM (SELECT w0.id, w0.message_key FROM idempotency.outbox_message AS w0" \
	"                    WHERE w0.topic_id OPERATOR(pg_catalog.=) $1" \
	"                      AND w0.state OPERATOR(pg_catalog.=) 'pending'" \
	"                      AND w0.available_at OPERATOR(pg_catalog.<=) $5" \
	"                    ORDER BY w0.available_at, w0.id LIMIT $8) AS w" \
	"  WHERE w.message_key IS NULL OR NOT EXISTS (" \
	"        SELECT 1 FROM idempotency.outbox_message AS p" \
	"         WHERE p.topic_id OPERATOR(pg_catalog.=) $1" \
	"           AND p.message_key OPERATOR(pg_catalog.=) w.message_key" \
	"           AND p.state OPERATOR(pg_catalog.=) 'pending'" \
	"           AND p.id OPERATOR(pg_catalog.<) w.id))"

/*
 * Beyond the window (it was full, the claim was not): the earliest pending
 * message of every key, found by skipping through the key index one key
 * at a time (cost: the number of keys with pending messages, not of
 * messages), and the ready unkeyed messages from their own index.  So a
 * key's backlog never holds up other keys' messages.
 */
#define CLAIM_BEYOND \
	"k(key) AS (" \
	" (SELECT s.message_key FROM idempotency.outbox_message AS s" \
	"   WHERE s.topic_id OPERATOR(pg_catalog.=) $1 AND s.state OPERATOR(pg_catalog.=) 'pending'" \
	"     AND s.message_key IS NOT NULL" \
	"   ORDER BY s.message_key LIMIT 1)" \
	" UNION ALL" \
	" SELECT (SELECT s.message_key FROM idempotency.outbox_message AS s" \
	"          WHERE s.topic_id OPERATOR(pg_catalog.=) $1 AND s.state OPERATOR(pg_catalog.=) 'pending'" \
	"            AND s.message_key OPERATOR(pg_catalog.>) k.key" \
	"          ORDER BY s.message_key LIMIT 1)" \
	"   FROM k WHERE k.key IS NOT NULL)," \
	" cand AS (" \
	" SELECT (SELECT h.id FROM idempotency.outbox_message AS h" \
	"          WHERE h.topic_id OPERATOR(pg_catalog.=) $1 AND h.state OPERATOR(pg_catalog.=) 'pending'" \
	"            AND h.message_key OPERATOR(pg_catalog.=) k.key" \
	"          ORDER BY h.id LIMIT 1) AS id" \
	"   FROM k WHERE k.key IS NOT NULL AND $8 OPERATOR(pg_catalog.>) 0" \
	" UNION ALL" \
	" (SELECT u.id FROM idempotency.outbox_message AS u" \
	"   WHERE u.topic_id OPERATOR(pg_catalog.=) $1 AND u.state OPERATOR(pg_catalog.=) 'pending'" \
	"     AND u.message_key IS NULL AND u.available_at OPERATOR(pg_catalog.<=) $5" \
	"   ORDER BY u.available_at, u.id LIMIT $2))"

static const char *const claim_window_sql =
"WITH RECURSIVE " CLAIM_WINDOW CLAIM_SQL_REST;
static const char *const claim_beyond_sql =
"WITH RECURSIVE " CLAIM_BEYOND CLAIM_SQL_REST;

static SPIPlanPtr plan_claim_beyond = NULL;
static SPIPlanPtr plan_window_full = NULL;

/*
 * Run a claim statement for up to remaining messages: the claimed ones go
 * to the result, and the statement runs again as long as some of those it
 * took went dead instead (each run turns at least one message dead, so
 * this ends) and fewer than remaining were claimed.  Returns how many were
 * claimed.
 */
static int32
claim_run(SPIPlanPtr *plan, const char *sql, Oid *argtypes, Datum *values,
		  int32 remaining, ReturnSetInfo *rsinfo)
{
	int32		claimed = 0;

	for (;;)
	{
		uint64		n;
		uint64		i;
		uint64		dead = 0;

		values[1] = Int32GetDatum(remaining - claimed);
		n = idem_run_as_owner(plan, sql, 8, argtypes, values, NULL, SPI_OK_SELECT);
		for (i = 0; i < n; i++)
		{
			Datum		cols[11];
			bool		nulls[11];

			heap_deform_tuple(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, cols, nulls);
			if (!DatumGetBool(cols[10]))
			{
				dead++;
				continue;
			}
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, cols, nulls);
			claimed++;
		}
		if (dead == 0 || claimed >= remaining)
			return claimed;
	}
}

/*
 * claim(topic, batch_size, visibility) -> the claimed messages (outbox_claim)
 *
 * See the file comment for the order and the concurrency.  First from the
 * window (CLAIM_WINDOW); when that was full of blocked messages and gave
 * fewer than batch_size, also from beyond it (CLAIM_BEYOND).
 */
PG_FUNCTION_INFO_V1(idempotency_claim);

Datum
idempotency_claim(PG_FUNCTION_ARGS)
{
	char	   *topic = topic_arg(fcinfo, 0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			argtypes[8] = {INT4OID, INT4OID, UUIDOID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, INT4OID, TEXTOID, INT4OID};
	Datum		values[8];
	TimestampTz now = GetCurrentTimestamp();
	int32		batch;
	int32		window;
	Topic		t;
	int32		n;

	not_null(fcinfo, 1, "batch_size");
	not_null(fcinfo, 2, "visibility");
	batch = PG_GETARG_INT32(1);
	if (batch < 1 || batch > CLAIM_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch_size must be between 1 and %d", CLAIM_MAX_BATCH)));
	check_interval(PG_GETARG_INTERVAL_P(2), "visibility", true);
	idem_init_materialized_srf(fcinfo);
	window = Max(CLAIM_WINDOW_MIN, batch * 4);

	SPI_connect();
	(void) topic_lookup(topic, RIGHT_CONSUME, &t, InvalidSnapshot, false);
	values[0] = Int32GetDatum(t.id);
	values[1] = Int32GetDatum(batch);
	values[2] = DirectFunctionCall1(gen_random_uuid, (Datum) 0);
	values[3] = DirectFunctionCall2(timestamptz_pl_interval, TimestampTzGetDatum(now),
									PG_GETARG_DATUM(2));
	values[4] = TimestampTzGetDatum(now);
	values[5] = Int32GetDatum(t.max_attempts);
	values[6] = CStringGetTextDatum(topic);
	values[7] = Int32GetDatum(window);
	n = claim_run(&plan_claim, claim_window_sql, argtypes, values, batch, rsinfo);

	if (n < batch)
	{
		Oid			wtypes[3] = {INT4OID, TIMESTAMPTZOID, INT4OID};
		Datum		wvalues[3];
		bool		isnull;
		bool		full;

		/* was the window full?  (then messages beyond it may be claimable) */
		wvalues[0] = values[0];
		wvalues[1] = values[4];
		wvalues[2] = values[7];
		idem_run_as_owner(&plan_window_full,
						  "SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>=) $3 FROM ("
						  " SELECT 1 FROM idempotency.outbox_message AS w0"
						  "  WHERE w0.topic_id OPERATOR(pg_catalog.=) $1"
						  "    AND w0.state OPERATOR(pg_catalog.=) 'pending'"
						  "    AND w0.available_at OPERATOR(pg_catalog.<=) $2"
						  "  LIMIT $3) AS w",
						  3, wtypes, wvalues, NULL, SPI_OK_SELECT);
		full = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
		if (full)
			(void) claim_run(&plan_claim_beyond, claim_beyond_sql, argtypes, values,
							 batch - n, rsinfo);
	}
	SPI_finish();
	return (Datum) 0;
}

/*
 * Run one of the statements that change the claimed messages (ack, nack,
 * release): $1 claim, $2 ids, $3 the caller, $4 now, then extra.
 */
static int32
claimed_update(SPIPlanPtr *plan, const char *sql, FunctionCallInfo fcinfo,
			   int nextra, Oid *extratypes, Datum *extra, char *extranulls,
			   bool notify)
{
	MemoryContext cxt = CurrentMemoryContext;
	char	   *topic = NULL;
	int32		topic_id = 0;
	bool		topic_notify = false;
	Oid			argtypes[6] = {UUIDOID, INT8ARRAYOID, REGROLEOID, TIMESTAMPTZOID};
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	int			i;
	uint64		n;

	not_null(fcinfo, 0, "claim");
	values[0] = PG_GETARG_DATUM(0);
	values[1] = ids_arg(fcinfo, 1);
	values[2] = ObjectIdGetDatum(GetUserId());
	values[3] = TimestampTzGetDatum(GetCurrentTimestamp());
	for (i = 0; i < nextra; i++)
	{
		argtypes[4 + i] = extratypes[i];
		values[4 + i] = extra[i];
		nulls[4 + i] = extranulls[i];
	}
	SPI_connect();
	n = idem_run_as_owner(plan, sql, 4 + nextra, argtypes, values, nulls,
						  notify ? SPI_OK_UPDATE_RETURNING : SPI_OK_UPDATE);
	if (notify && n > 0)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;

		/* messages of one claim share its topic: (id, name, notify) */
		topic_id = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
		topic = MemoryContextStrdup(cxt, SPI_getvalue(tup, desc, 2));
		topic_notify = DatumGetBool(SPI_getbinval(tup, desc, 3, &isnull));
	}
	SPI_finish();
	if (topic != NULL)
	{
		idem_wake_at_commit(topic_id);	/* wakeup.c: wait_for() */
		if (topic_notify)
			notify_topic(topic);
	}
	return (int32) n;
}

/* ack(claim, ids) -> how many of the claim's messages became delivered */
PG_FUNCTION_INFO_V1(idempotency_ack);

Datum
idempotency_ack(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(claimed_update(&plan_ack,
								   "UPDATE idempotency.outbox_message AS m"
								   "   SET state = 'delivered', claim = NULL, delivered_at = $4,"
								   "       expires_at = $4 OPERATOR(pg_catalog.+) t.retention"
								   "  FROM idempotency.outbox_topic AS t"
								   " WHERE m.id OPERATOR(pg_catalog.=) ANY ($2)"
								   "   AND m.claim OPERATOR(pg_catalog.=) $1"
								   "   AND m.state OPERATOR(pg_catalog.=) 'pending'"
								   MAY_CONSUME,
								   fcinfo, 0, NULL, NULL, NULL, false));
}

/*
 * The default backoff, backoff_base * 2^(attempt - 1) capped at backoff_max,
 * is capped before it is doubled: the product is computed only when
 * backoff_max / 2^(attempt - 1) exceeds backoff_base, so it is below
 * backoff_max and cannot leave the interval's range (10 hours * 2^30 did).
 */
#define BACKOFF_FACTOR \
	"pg_catalog.power(2::pg_catalog.float8," \
	" LEAST(GREATEST(m.attempts OPERATOR(pg_catalog.-) 1, 0), 30)::pg_catalog.float8)"

/* nack(claim, ids, error, retry_in) -> how many were given back (or went dead) */
PG_FUNCTION_INFO_V1(idempotency_nack);

Datum
idempotency_nack(PG_FUNCTION_ARGS)
{
	Oid			types[2] = {JSONBOID, INTERVALOID};
	Datum		extra[2];
	char		nulls[2];

	if (!PG_ARGISNULL(3))
		check_interval(PG_GETARG_INTERVAL_P(3), "retry_in", false);
	extra[0] = PG_ARGISNULL(2) ? (Datum) 0 : PG_GETARG_DATUM(2);
	nulls[0] = PG_ARGISNULL(2) ? 'n' : ' ';
	extra[1] = PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3);
	nulls[1] = PG_ARGISNULL(3) ? 'n' : ' ';
	PG_RETURN_INT32(claimed_update(&plan_nack,
								   "UPDATE idempotency.outbox_message AS m"
								   "   SET claim = NULL, last_error = $5,"
								   "       state = CASE WHEN m.attempts OPERATOR(pg_catalog.>=) t.max_attempts"
								   "               THEN 'dead' ELSE 'pending' END,"
								   "       available_at = $4 OPERATOR(pg_catalog.+) COALESCE($6,"
								   "           CASE WHEN t.backoff_max OPERATOR(pg_catalog./) " BACKOFF_FACTOR
								   "                     OPERATOR(pg_catalog.<=) t.backoff_base"
								   "           THEN t.backoff_max"
								   "           ELSE LEAST(t.backoff_max, t.backoff_base OPERATOR(pg_catalog.*) " BACKOFF_FACTOR ") END)"
								   "  FROM idempotency.outbox_topic AS t"
								   " WHERE m.id OPERATOR(pg_catalog.=) ANY ($2)"
								   "   AND m.claim OPERATOR(pg_catalog.=) $1"
								   "   AND m.state OPERATOR(pg_catalog.=) 'pending'"
								   MAY_CONSUME,
								   fcinfo, 2, types, extra, nulls, false));
}

/* release(claim, ids) -> how many were given back unattempted (other relays are woken) */
PG_FUNCTION_INFO_V1(idempotency_release);

Datum
idempotency_release(PG_FUNCTION_ARGS)
{
	int32		n = claimed_update(&plan_release,
								   "UPDATE idempotency.outbox_message AS m"
								   "   SET claim = NULL, available_at = $4,"
								   "       attempts = GREATEST(m.attempts OPERATOR(pg_catalog.-) 1, 0)"
								   "  FROM idempotency.outbox_topic AS t"
								   " WHERE m.id OPERATOR(pg_catalog.=) ANY ($2)"
								   "   AND m.claim OPERATOR(pg_catalog.=) $1"
								   "   AND m.state OPERATOR(pg_catalog.=) 'pending'"
								   MAY_CONSUME
								   " RETURNING t.id, t.name, t.notify",
								   fcinfo, 0, NULL, NULL, NULL, true);

	PG_RETURN_INT32(n);
}

/*
 * redrive(topic, ids) -> how many dead messages were made pending again
 *
 * A redriven message goes to the back of its key: it takes a new row id
 * (its message_id stays), drawn after its key's lock as publish() draws
 * one, so it is claimed only after every message of its key published
 * before the redrive, and a message of the key that is out (claimed, not
 * yet acked) keeps it waiting.  Without that, its old, smaller id let the
 * claim hand it out beside the one in flight.  The dead messages are
 * locked first (FOR UPDATE): a concurrent redrive of them waits, then finds
 * them pending.
 */
PG_FUNCTION_INFO_V1(idempotency_redrive);

Datum
idempotency_redrive(PG_FUNCTION_ARGS)
{
	char	   *topic = topic_arg(fcinfo, 0);
	Oid			argtypes[3] = {INT4OID, INT8ARRAYOID, TIMESTAMPTZOID};
	Datum		values[3];
	char		nulls[3] = {' ', ' ', ' '};
	Oid			utypes[3] = {INT8ARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID};
	Datum		uvalues[3];
	Datum	   *old_ids;
	Datum	   *new_ids;
	Oid			seq;
	Topic		t;
	uint64		n;
	uint64		i;

	if (!PG_ARGISNULL(1))
		values[1] = ids_arg(fcinfo, 1);
	else
	{
		values[1] = (Datum) 0;
		nulls[1] = 'n';
	}
	SPI_connect();
	(void) topic_lookup(topic, RIGHT_CONSUME, &t, InvalidSnapshot, false);
	values[0] = Int32GetDatum(t.id);
	values[2] = TimestampTzGetDatum(GetCurrentTimestamp());
	n = idem_run_as_owner(&plan_redrive_pick,
						  "SELECT m.id, m.message_key FROM idempotency.outbox_message AS m"
						  " WHERE m.topic_id OPERATOR(pg_catalog.=) $1"
						  "   AND m.state OPERATOR(pg_catalog.=) 'dead'"
						  "   AND ($2 IS NULL OR m.id OPERATOR(pg_catalog.=) ANY ($2))"
						  " ORDER BY m.id FOR UPDATE",
						  2, argtypes, values, nulls, SPI_OK_SELECT);
	if (n == 0)
	{
		SPI_finish();
		PG_RETURN_INT32(0);
	}

	/* in id order: the key's lock, then the new id (see publish()) */
	old_ids = palloc(n * sizeof(Datum));
	new_ids = palloc(n * sizeof(Datum));
	outbox_relids();
	seq = message_seq_relid;
	for (i = 0; i < n; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		bool		isnull;
		Datum		key;

		old_ids[i] = SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull);
		key = SPI_getbinval(tup, SPI_tuptable->tupdesc, 2, &isnull);
		if (!isnull)
			key_lock(PG_GETARG_TEXT_PP(0), DatumGetTextPP(key));
		new_ids[i] = Int64GetDatum(nextval_internal(seq, false));
	}
	uvalues[0] = PointerGetDatum(construct_array(old_ids, (int) n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	uvalues[1] = PointerGetDatum(construct_array(new_ids, (int) n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	uvalues[2] = values[2];
	n = idem_run_as_owner(&plan_redrive,
						  "UPDATE idempotency.outbox_message AS m"
						  "   SET id = r.new_id, state = 'pending', attempts = 0, claim = NULL,"
						  "       available_at = $3"
						  "  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS r(old_id, new_id)"
						  " WHERE m.id OPERATOR(pg_catalog.=) r.old_id"
						  "   AND m.state OPERATOR(pg_catalog.=) 'dead'",
						  3, utypes, uvalues, NULL, SPI_OK_UPDATE);
	SPI_finish();
	if (n > 0)
	{
		idem_wake_at_commit(t.id);	/* wakeup.c: wait_for() */
		if (t.notify)
			notify_topic(topic);
	}
	PG_RETURN_INT32((int32) n);
}
