/*-------------------------------------------------------------------------
 *
 * keystore.c
 *	  The key store (stores floor): a key's identity, the rows of
 *	  idempotency.idempotency_key and the key lock, one entry per operation
 *	  (keystore.h).
 *
 * Sections, in order: a key's identity (validated, hashed with the
 * database's secret, described; fresh 128-bit values; expiry); the key
 * lock; the table (which it is, its shape, the path it takes); the fast
 * path; reading a row; writing a row; a key opened and held (the guard's
 * one call before its work); a call carried to its shard's node on Citus.
 * The Citus statements themselves are the Citus module's (keycitus.c, one
 * floor below), called from here only.
 *
 * Paths kept, chosen once per table shape (store_resolve()):
 *   fast: every request on a table as shipped (a primary key probe, an
 *     executor insert);
 *   SQL (prepared statements): users whose key table is not as shipped,
 *     the partitioning recipe of docs/reference.md, a trigger, a changed
 *     column type; 37% more instructions per once(), which is why the fast
 *     path stays in front of it;
 *   the _rp and seed variants: a database whose key table is still of
 *     0.4.0 or 0.5.0 (the library serves every database of the cluster,
 *     each updated when its owner runs ALTER EXTENSION UPDATE): kept for
 *     that upgrade window;
 *   Citus (keycitus.c): a key table in pg_dist_partition.
 * Why each: src/README.md, "The key table's paths and versions".
 *
 * Locking: AccessShareLock on lock_secret while the secret is read; the
 * key lock (ExclusiveLock on a keyed advisory tag) serialises a key's
 * writers on one server; AccessShareLock on the table while its shape is
 * read, RowExclusiveLock to write; on Citus the shard's primary
 * key or row lock, and a carried call's RowExclusiveLock on the route
 * table's shard.  src/README.md, "Locking".
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/genam.h"
#include "access/relation.h"
#include "access/skey.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"
#include "keystore.h"
#include "stats.h"

/* ---------------------------------------------------------------------
 * A key's identity
 *
 * Building and validating (owner role, scope, key) from SQL arguments,
 * hashing it, describing it in messages; fresh 128-bit values (derive
 * seeds, message ids); the expiry of a new key and the seconds until a
 * lease ends.
 *
 * Design of the hash.  KeyId.hash names the key lock (an advisory lock
 * tag, visible to every role in pg_locks) and keys the per-transaction
 * table (guard.c).  It must not let one role reach another's keys: with a
 * public hash function a role could craft a key whose lock equals another
 * role's key (and so delay or block it), or recognise another role's key
 * in pg_locks.  So it is SipHash-2-4, a keyed pseudo-random function, over
 * (owner, scope, key) with a 128-bit secret per database kept in
 * idempotency.lock_secret, a table only the extension's owner can read.
 * Without the secret a role can neither predict nor invert the tag; a
 * chance collision (2^-64 per pair) only makes one request wait for
 * another, never gives a wrong answer.
 *
 * The secret is read once per backend (a scan of the table) and used for
 * the rest of the transaction that read it even if an invalidation arrives
 * meanwhile, so a transaction never hashes one key two ways.  A trigger on
 * the table (lock_secret_changed) invalidates it when the row changes, so
 * every backend reads a new secret at its next transaction.  That read
 * takes a fresh snapshot, not the transaction's (under REPEATABLE READ
 * that one may predate the change), and only a read that succeeded clears
 * the invalidation (load_secret()).  Until ALTER EXTENSION idempotency
 * UPDATE has created the table, the 0.3.0 hash is used, so old and new
 * libraries agree during the update.
 * ---------------------------------------------------------------------
 */

/* GUCs */
static int	idem_default_ttl_s = 24 * 60 * 60;
int			idem_max_key_length = 255;

#define DESCRIBE_MAX_BYTES 100
#define SECRET_LEN 16

/* the identity: local state: the lock secret */
typedef enum SecretState
{
	SECRET_UNKNOWN,				/* not read yet, or invalidated */
	SECRET_LEGACY,				/* no idempotency.lock_secret (before 0.4.0) */
	SECRET_KEYED				/* secret_k0/k1 hold it */
} SecretState;

static SecretState secret_state = SECRET_UNKNOWN;
static bool secret_stale = false;	/* an invalidation arrived */
static LocalTransactionId secret_lxid = InvalidLocalTransactionId;
static Oid	secret_relid = InvalidOid;
static uint64 secret_k0;
static uint64 secret_k1;

static void
keyid_relcache(Oid relid)
{
	if (relid == InvalidOid || relid == secret_relid)
		secret_stale = true;
}

/* little-endian 64-bit word from 8 bytes */
static inline uint64
le64(const uint8 *p)
{
	uint64		v = 0;

	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

/*
 * Read the secret (see the section comment); sets secret_state.
 *
 * The read uses a fresh snapshot, not the transaction's: under REPEATABLE
 * READ the transaction's snapshot may predate the change whose invalidation
 * brought us here, and the old secret read with it would be kept for good.
 * The relation is locked before that snapshot is taken, so an invalidation
 * still queued is processed first (it marks the secret stale again: one
 * extra read next transaction, never a missed one).  The secret counts as
 * read for this transaction (secret_lxid, secret_stale) only once the read
 * has succeeded: an error mid-read leaves it stale, and the next key_hash()
 * reads again even in the same transaction (after a rolled-back savepoint).
 */
static void
load_secret(void)
{
	Oid			nsp;
	Oid			rel;
	bool		isnull;
	Datum		d;
	bytea	   *secret;

	/*
	 * A parallel worker may not take a new snapshot; the guard refuses to
	 * work there anyway (25000), after the key's hash is computed.
	 */
	bool		parallel = IsInParallelMode();

	idem_relcache_watch();
	nsp = get_namespace_oid("idempotency", true);
	rel = OidIsValid(nsp) ? get_relname_relid("lock_secret", nsp) : InvalidOid;
	secret_relid = rel;
	if (!OidIsValid(rel))
	{
		secret_stale = false;
		secret_lxid = IDEM_MY_LXID;
		secret_state = SECRET_LEGACY;
		return;
	}
	/* from here an invalidation marks the secret stale again */
	secret_stale = false;
	PG_TRY();
	{
		Relation	r = table_open(rel, AccessShareLock);
		TupleDesc	td = RelationGetDescr(r);
		AttrNumber	att = InvalidAttrNumber;
		bool		is_bytea;
		Snapshot	snap = RegisterSnapshot(parallel ? GetActiveSnapshot() : GetLatestSnapshot());
		TupleTableSlot *slot = table_slot_create(r, NULL);
		TableScanDesc scan = table_beginscan(r, snap, 0, NULL);
		int			rows = 0;

		/* the column from the open descriptor: no catalog lookup */
		for (int i = 0; i < td->natts; i++)
			if (!TupleDescAttr(td, i)->attisdropped &&
				strcmp(NameStr(TupleDescAttr(td, i)->attname), "secret") == 0)
				att = i + 1;
		is_bytea = att > 0 && TupleDescAttr(td, att - 1)->atttypid == BYTEAOID;
		secret = NULL;
		while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
		{
			if (++rows > 1)
				break;
			if (is_bytea)
			{
				d = slot_getattr(slot, att, &isnull);
				if (!isnull)
					secret = DatumGetByteaPCopy(d);
			}
		}
		table_endscan(scan);
		ExecDropSingleTupleTableSlot(slot);
		UnregisterSnapshot(snap);
		table_close(r, AccessShareLock);
		if (rows != 1)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("table idempotency.lock_secret must hold exactly one row"),
					 errhint("Insert one random 16-byte secret (see docs/reference.md, \"Table idempotency.lock_secret\").")));
		if (secret == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("table idempotency.lock_secret holds no usable secret"),
					 errdetail("Its column secret must be a non-null bytea of %d bytes.", SECRET_LEN)));
		if (VARSIZE_ANY_EXHDR(secret) != SECRET_LEN)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("table idempotency.lock_secret holds no usable secret"),
					 errdetail("The secret has %d bytes; it must have %d.",
							   (int) VARSIZE_ANY_EXHDR(secret), SECRET_LEN)));
		secret_k0 = le64((const uint8 *) VARDATA_ANY(secret));
		secret_k1 = le64((const uint8 *) VARDATA_ANY(secret) + 8);
		explicit_bzero(VARDATA_ANY(secret), SECRET_LEN);
		pfree(secret);
	}
	PG_CATCH();
	{
		secret_stale = true;
		secret_lxid = InvalidLocalTransactionId;
		PG_RE_THROW();
	}
	PG_END_TRY();
	secret_lxid = IDEM_MY_LXID;
	secret_state = SECRET_KEYED;
	/* read with the transaction's snapshot: read it again next time */
	if (parallel)
		secret_stale = true;
}

/* ---------------------------------------------------------------------
 * SipHash-2-4 (Aumasson and Bernstein, 2012)
 * ---------------------------------------------------------------------
 */
#define ROTL64(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND \
	do { \
		v0 += v1; v1 = ROTL64(v1, 13); v1 ^= v0; v0 = ROTL64(v0, 32); \
		v2 += v3; v3 = ROTL64(v3, 16); v3 ^= v2; \
		v0 += v3; v3 = ROTL64(v3, 21); v3 ^= v0; \
		v2 += v1; v1 = ROTL64(v1, 17); v1 ^= v2; v2 = ROTL64(v2, 32); \
	} while (0)

static uint64
siphash24(const uint8 *in, size_t len, uint64 k0, uint64 k1)
{
	uint64		v0 = UINT64CONST(0x736f6d6570736575) ^ k0;
	uint64		v1 = UINT64CONST(0x646f72616e646f6d) ^ k1;
	uint64		v2 = UINT64CONST(0x6c7967656e657261) ^ k0;
	uint64		v3 = UINT64CONST(0x7465646279746573) ^ k1;
	uint64		last = ((uint64) len) << 56;
	size_t		full = len - (len % 8);
	size_t		i;

	for (i = 0; i < full; i += 8)
	{
		uint64		m = le64(in + i);

		v3 ^= m;
		SIPROUND;
		SIPROUND;
		v0 ^= m;
	}
	for (i = 0; i < len % 8; i++)
		last |= ((uint64) in[full + i]) << (8 * i);
	v3 ^= last;
	SIPROUND;
	SIPROUND;
	v0 ^= last;
	v2 ^= 0xff;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}

/* the hash of a key identity: see the file comment */
static uint64
key_hash(const KeyId *id)
{
	uint8		buf[8 + MAX_KEY_BYTES];
	uint32		owner = id->owner;
	uint32		scope_len = id->scope_len;

	if (secret_state == SECRET_UNKNOWN ||
		(secret_lxid != IDEM_MY_LXID &&
		 (secret_stale || secret_state == SECRET_LEGACY)))
		load_secret();
	secret_lxid = IDEM_MY_LXID;

	if (secret_state == SECRET_LEGACY)
	{
		uint64		h = hash_bytes_extended((const unsigned char *) id->scope,
											id->scope_len, (uint64) id->owner);

		return hash_bytes_extended((const unsigned char *) id->key, id->key_len, h);
	}

	/* owner and scope length first, so (scope, key) pairs cannot shift */
	memcpy(buf, &owner, 4);
	memcpy(buf + 4, &scope_len, 4);
	memcpy(buf + 8, id->scope, id->scope_len);
	memcpy(buf + 8 + id->scope_len, id->key, id->key_len);
	return siphash24(buf, 8 + id->scope_len + id->key_len, secret_k0, secret_k1);
}

/*
 * Fresh unique values (message ids, derive seeds): 128 bits of a keyed
 * SipHash stream, the key drawn from pg_strong_random() once per process
 * (after the fork: never in the postmaster, so no two backends share it),
 * the input a per-process counter.  Nothing copied with a database (a
 * template clone, a restored dump, a point-in-time recovery that rewinds a
 * sequence) enters it, so two values collide only as two random 128-bit
 * values do; without the key the next value cannot be guessed from the
 * last.  One pg_strong_random() call costs ~30k instructions; the stream
 * costs two SipHash rounds a value.
 */
static uint64 stream_k0,
			stream_k1;
static uint64 stream_counter = 0;
static pid_t stream_pid = 0;

void
idem_unique128(uint8 *out)
{
	uint8		in[9];
	uint64		h[2];

	if (stream_pid != MyProcPid)
	{
		uint8		key[16];

		if (!pg_strong_random(key, sizeof(key)))
			ereport(ERROR,
					(errcode(ERRCODE_INTERNAL_ERROR),
					 errmsg("could not generate random bytes")));
		stream_k0 = le64(key);
		stream_k1 = le64(key + 8);
		explicit_bzero(key, sizeof(key));
		stream_counter = 0;
		stream_pid = MyProcPid;
	}
	stream_counter++;
	memcpy(in, &stream_counter, 8);
	for (int i = 0; i < 2; i++)
	{
		in[8] = (uint8) i;
		h[i] = siphash24(in, sizeof(in), stream_k0, stream_k1);
	}
	memcpy(out, h, 16);
}

/* the identity: helpers */

/* s, clipped to DESCRIBE_MAX_BYTES at a character boundary */
static void
append_clipped(StringInfo buf, const char *s, int len)
{
	if (len <= DESCRIBE_MAX_BYTES)
		appendBinaryStringInfo(buf, s, len);
	else
	{
		appendBinaryStringInfo(buf, s, pg_mbcliplen(s, len, DESCRIBE_MAX_BYTES));
		appendStringInfoString(buf, "...");
	}
}

static void
check_length(const char *what, const char *s, int len)
{
	int			nchars = pg_mbstrlen_with_len(s, len);

	if (nchars > idem_max_key_length)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_IDEMPOTENCY_KEY),
				 errmsg("%s is too long", what),
				 errdetail("The %s has %d characters; idempotency.max_key_length allows %d.",
						   what, nchars, idem_max_key_length)));
}

/* the identity: interface */

/* "idempotency key "k"" or "idempotency key "k" in scope "s"", for messages */
char *
idem_describe_key(const KeyId *id)
{
	StringInfoData buf;

	initStringInfo(&buf);
	appendStringInfoString(&buf, "idempotency key \"");
	append_clipped(&buf, id->key, id->key_len);
	appendStringInfoChar(&buf, '"');
	if (id->scope_len > 0)
	{
		appendStringInfoString(&buf, " in scope \"");
		append_clipped(&buf, id->scope, id->scope_len);
		appendStringInfoChar(&buf, '"');
	}
	return buf.data;
}

/* Validate scope argument scopearg (IK003) and return it as a C string. */
char *
idem_scope_arg(FunctionCallInfo fcinfo, int scopearg)
{
	char	   *scope;

	if (PG_ARGISNULL(scopearg))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_IDEMPOTENCY_KEY),
				 errmsg("idempotency scope must not be null"),
				 errhint("Use '' (the default) for no scope.")));
	scope = text_to_cstring(PG_GETARG_TEXT_PP(scopearg));
	check_length("idempotency scope", scope, strlen(scope));
	return scope;
}

/*
 * Build the identity of key (or message id: what names it in messages)
 * and scope for the current role.  Raises IK003.
 */
KeyId
idem_make_keyid(text *key, text *scope, const char *what)
{
	KeyId		id;

	if (key == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_IDEMPOTENCY_KEY),
				 errmsg("%s must not be null", what)));
	if (scope == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_IDEMPOTENCY_KEY),
				 errmsg("idempotency scope must not be null"),
				 errhint("Use '' (the default) for no scope.")));
	id.key = text_to_cstring(key);
	id.key_len = strlen(id.key);
	id.scope = text_to_cstring(scope);
	id.scope_len = strlen(id.scope);
	check_length("idempotency scope", id.scope, id.scope_len);

	if (id.key_len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_IDEMPOTENCY_KEY),
				 errmsg("%s must not be empty", what)));
	check_length(what, id.key, id.key_len);
	if (id.key_len + id.scope_len > MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_IDEMPOTENCY_KEY),
				 errmsg("%s is too long", what),
				 errdetail("The %s and its scope take %d bytes together; at most %d are allowed.",
						   what, id.key_len + id.scope_len, MAX_KEY_BYTES)));

	id.owner = GetUserId();
	id.hash = key_hash(&id);
	return id;
}

/*
 * The keyed hash of id as it stands (for a caller that changed its owner:
 * outbox_topics.c names a message key's lock with owner InvalidOid)
 */
uint64
idem_key_hash(const KeyId *id)
{
	return key_hash(id);
}

/* idem_make_keyid() of SQL arguments keyarg and scopearg */
KeyId
idem_keyid(FunctionCallInfo fcinfo, int keyarg, int scopearg, const char *what)
{
	return idem_make_keyid(PG_ARGISNULL(keyarg) ? NULL : PG_GETARG_TEXT_PP(keyarg),
						   PG_ARGISNULL(scopearg) ? NULL : PG_GETARG_TEXT_PP(scopearg),
						   what);
}

/* now + ttl (NULL: idempotency.default_ttl); 22023 if not positive */
static TimestampTz
expiry_of(const Interval *ttl, TimestampTz now)
{
	TimestampTz expires_at;

	if (ttl == NULL)
		return now + (TimestampTz) idem_default_ttl_s * USECS_PER_SEC;
	expires_at = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														 TimestampTzGetDatum(now),
														 IntervalPGetDatum(ttl)));
	if (expires_at <= now)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must be positive")));
	return expires_at;
}

/*
 * ceil of (until - now) in whole seconds, at least 0 and at most INT32_MAX
 * (a lease may last longer than 2^31 seconds): lookup()'s retry_after and
 * IK002's "retry after N seconds"
 */
int32
idem_seconds_until(TimestampTz until, TimestampTz now)
{
	int64		us = until - now;

	if (us <= 0)
		return 0;
	return (int32) Min((us + USECS_PER_SEC - 1) / USECS_PER_SEC, PG_INT32_MAX);
}

/* expiry_of() of SQL argument ttlarg */
TimestampTz
idem_expiry(FunctionCallInfo fcinfo, int ttlarg, TimestampTz now)
{
	return expiry_of(PG_ARGISNULL(ttlarg) ? NULL : PG_GETARG_INTERVAL_P(ttlarg), now);
}

/*
 * lock_secret_changed(): statement trigger on idempotency.lock_secret.  A
 * row change sends no relcache invalidation by itself; this one makes every
 * backend read the secret again at its next transaction.
 */
PG_FUNCTION_INFO_V1(idempotency_lock_secret_changed);

Datum
idempotency_lock_secret_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("lock_secret_changed() must be called as a trigger")));
	CacheInvalidateRelcache(trigdata->tg_relation);
	PG_RETURN_POINTER(NULL);
}

/* from idem_keystore_init(): the identity's GUCs and relcache callback */
static void
keyid_init(void)
{
	DefineCustomIntVariable("idempotency.default_ttl",
							"How long a key lives when begin() is given no ttl.",
							"An expired key behaves as if it did not exist.",
							&idem_default_ttl_s,
							24 * 60 * 60, 1, INT_MAX,
							PGC_USERSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.max_key_length",
							"Longest idempotency key or scope accepted, in characters.",
							NULL,
							&idem_max_key_length,
							255, 1, 1024,
							PGC_USERSET, 0,
							NULL, NULL, NULL);
	idem_relcache_add(keyid_relcache);
}

/*
 * What the sections share: the key table as resolved, and the parts of
 * its statements.
 */
/* the columns the guard reads and writes, in $n order of the statements */
typedef enum StoreCol
{
	COL_OWNER, COL_SCOPE, COL_KEY, COL_STATUS, COL_REQUEST_HASH, COL_RESPONSE,
	COL_RETRYABLE, COL_ATTEMPTS, COL_CREATED_AT, COL_UPDATED_AT,
	COL_EXPIRES_AT, COL_LOCKED_UNTIL,
	/* since 0.5.0 (recovery points); a 0.4.0 table has none of them */
	COL_RECOVERY_POINT, COL_RECOVERY_STATE,
	/* since 0.6.0 (derive_key()'s per-key seed); a 0.5.0 table has none */
	COL_DERIVE_SEED, NUM_COLS
} StoreCol;

/* the columns every version has (the row written by INSERT and UPDATE) */
#define NUM_BASE_COLS COL_RECOVERY_POINT

/*
 * A write's $13 (values[SEED_ARG]; the recovery point columns are never
 * written from these arrays): the derive_seed of a row written now, on a
 * table that has the column (idem_store.seed).  idem_store_write_types is
 * idem_store_col_types' first twelve and bytea.
 */
#define SEED_ARG NUM_BASE_COLS
#define NUM_SEED_ARGS (NUM_BASE_COLS + 1)
static Oid	idem_store_write_types[NUM_SEED_ARGS];
static bytea *store_new_seed(void);

/* the key table as store_resolve() found it  */
typedef struct KeyStore
{
	Oid			relid;			/* InvalidOid: not resolved, or changed */
	bool		fast;			/* the fast path (the table section) */
	bool		recovery;		/* has the recovery point columns */
	bool		seed;			/* has derive_seed (0.6.0) */
	bool		citus;			/* distributed by Citus */
	AttrNumber	attnums[NUM_COLS];
} KeyStore;

static KeyStore idem_store;
static Oid	idem_store_col_types[NUM_COLS];

/* what the error context of a statement on the table says */
typedef struct StoreErrorArg
{
	const KeyId *id;
	const char *doing;			/* "reading", "storing" */
} StoreErrorArg;

static void store_error_context(void *arg);
static void store_bad_table(const char *detail);
static void store_resolve(void);
static Relation store_open(LOCKMODE lockmode);
static void store_key_values(const KeyId *id, Datum *values);
static void store_check_writable(const KeyId *id);

/* the fast path */
static bool store_probe(Relation heap, const KeyId *id, Snapshot snap,
						StoredKey *out, MemoryContext outcxt,
						TransactionId *xmin);
static void store_insert(Relation rel, Datum *values, const char *nulls);

/* =====================================================================
 * The lock that lets one transaction at a time work on a key.
 *
 * Design: a heavyweight lock in ExclusiveLock mode on an advisory lock tag
 * (database, 64-bit hash of owner+scope+key, field4 = KEYLOCK_FIELD4).  The
 * field4 value keeps it apart from pg_advisory_lock()'s keys (which use 1
 * and 2), and it shows in pg_locks as locktype 'advisory', objsubid 18756.
 * It is a transaction-level lock: released at commit or abort, and when a
 * subtransaction that took it rolls back.  A replay may release it early.
 *
 * The first attempt never waits (keylock_try).  When the key is busy we
 * wait (keylock_wait) at most
 * idempotency.lock_wait by running the ordinary lock wait with the
 * backend's LockTimeout set to that value for the duration of the wait;
 * the resulting lock timeout is turned into IK002.  Deadlocks between keys
 * are found by the ordinary deadlock detector.
 *
 * Two different keys share a lock only if their 64-bit hashes collide;
 * the cost of that is a needless wait, never a wrong answer.
 *
 * =====================================================================
 */
/* ---------------------------------------------------------------------
 * GUCs
 * ---------------------------------------------------------------------
 */
static int	idem_lock_wait_ms = 5000;
static int	idem_log_waits_ms = -1;

#define KEYLOCK_FIELD4 0x4944	/* 18756 */

static void
set_tag(LOCKTAG *tag, const KeyId *id)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId,
						 (uint32) (id->hash >> 32), (uint32) id->hash,
						 KEYLOCK_FIELD4);
}

/* process id of a holder of tag other than us, 0 if none is known */
static int
holder_pid(const LOCKTAG *tag)
{
	VirtualTransactionId *vxids = GetLockConflicts(tag, ExclusiveLock, NULL);

	for (; VirtualTransactionIdIsValid(*vxids); vxids++)
	{
		PGPROC	   *proc;

		proc = IDEM_VXID_PROC(*vxids);
		if (proc != NULL && proc->pid != 0)
			return proc->pid;
	}
	return 0;
}

/*
 * IK002 for a key another transaction holds.  The client's DETAIL names no
 * process: behind a connection pooler a backend pid means nothing to the
 * client, so the pid goes to the server log only.
 */
static void
report_in_progress(const KeyId *id, const LOCKTAG *tag)
{
	int			pid = holder_pid(tag);

	idem_stats_count(id, IDEM_STAT_IK002);
	ereport(ERROR,
			(errcode(ERRCODE_IDEMPOTENCY_KEY_IN_PROGRESS),
			 errmsg("%s is in progress in another transaction", idem_describe_key(id)),
			 errdetail("Another transaction holds it; this request waited %d ms (idempotency.lock_wait).",
					   idem_lock_wait_ms),
			 pid != 0 ?
			 errdetail_log("The transaction of process %d holds it; this request waited %d ms (idempotency.lock_wait).",
						   pid, idem_lock_wait_ms) : 0,
			 errhint("Retry after the first request has finished (HTTP 409 with Retry-After).")));
}

/*
 * Try to take the lock of key id for this transaction without waiting:
 * KEYLOCK_TAKEN (this call took it), KEYLOCK_HELD (this transaction held it
 * already) or KEYLOCK_BUSY (another transaction holds it).
 */
static KeyLockResult
keylock_try(const KeyId *id)
{
	LOCKTAG		tag;
	LockAcquireResult res;

	set_tag(&tag, id);
	res = LockAcquire(&tag, ExclusiveLock, false, true);
	if (res == LOCKACQUIRE_NOT_AVAIL)
		return KEYLOCK_BUSY;
	return res == LOCKACQUIRE_OK ? KEYLOCK_TAKEN : KEYLOCK_HELD;
}

/*
 * Wait for the lock of key id, at most idempotency.lock_wait, and take it.
 * Raises IK002 on timeout (at once when lock_wait is 0).
 */
static void
keylock_wait(const KeyId *id)
{
	LOCKTAG		tag;
	volatile bool timed_out = false;
	int			save_timeout;
	MemoryContext cxt = CurrentMemoryContext;
	TimestampTz start;
	double		ms;

	set_tag(&tag, id);
	if (idem_lock_wait_ms <= 0)
	{
		if (LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL)
			return;
		report_in_progress(id, &tag);
	}

	start = GetCurrentTimestamp();	/* for idempotency.stats, log_waits */
	save_timeout = LockTimeout;
	LockTimeout = idem_lock_wait_ms;
	PG_TRY();
	{
		(void) LockAcquire(&tag, ExclusiveLock, false, false);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		LockTimeout = save_timeout;
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
		{
			FreeErrorData(edata);
			PG_RE_THROW();
		}
		FlushErrorState();
		FreeErrorData(edata);
		timed_out = true;
	}
	PG_END_TRY();
	LockTimeout = save_timeout;
	ms = (double) (GetCurrentTimestamp() - start) / 1000.0;
	idem_stats_wait(id, ms);
	if (idem_log_waits_ms >= 0 && ms >= idem_log_waits_ms)
	{
		const char *role = GetUserNameFromId(id->owner, true);

		ereport(LOG,
				(errmsg("process %d waited %.3f ms for %s of role \"%s\"",
						MyProcPid, ms, idem_describe_key(id), role ? role : "?"),
				 timed_out ?
				 errdetail("It gave up after idempotency.lock_wait (%d ms) and raised IK002.",
						   idem_lock_wait_ms) :
				 errdetail("It then took the key.")));
	}

	if (timed_out)
		report_in_progress(id, &tag);
}

/* Give back a lock keylock_try() took (a replay, forget() of no key) */
static void
keylock_release(const KeyId *id)
{
	LOCKTAG		tag;

	set_tag(&tag, id);
	LockRelease(&tag, ExclusiveLock, false);
}

/* ---------------------------------------------------------------------
 * Is the key busy (lookup.c); the lock's GUCs
 * ---------------------------------------------------------------------
 */

/*
 * Does another transaction hold the lock of key id now?  Looks at the lock
 * table without taking or queueing for the lock (for lookup()).
 */
bool
idem_keylock_busy(const KeyId *id)
{
	LOCKTAG		tag;

	set_tag(&tag, id);
	/* a prepared transaction counts too (its holder has no process) */
	return VirtualTransactionIdIsValid(*GetLockConflicts(&tag, ExclusiveLock, NULL));
}

/* from _PG_init: our GUC */
static void
keylock_init(void)
{
	DefineCustomIntVariable("idempotency.lock_wait",
							"How long begin() waits for a key another transaction holds.",
							"After this time begin() raises IK002; 0 raises it at once.",
							&idem_lock_wait_ms,
							5000, 0, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idempotency.log_waits",
							"Logs a wait for a key lock that took at least this long.",
							"-1 (the default) logs none; 0 logs every wait.",
							&idem_log_waits_ms,
							-1, -1, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/* =====================================================================
 * The table: which table holds the keys, its shape, and the path every
 * read and write takes.
 *
 * The table may be as shipped or changed by a DBA (a trigger, a CHECK
 * constraint, a column type, hash partitioning); a row is written under
 * every rule the executor enforces, and read back in the guard's types.
 * The path is chosen per table shape and cached in idem_store until the
 * table's relcache invalidation: fast (a plain heap of the shipped columns
 * and types, no triggers or rules, btree primary key: the fast path section), SQL
 * (anything else: prepared statements in the read and write sections, which
 * PostgreSQL routes and coerces) or Citus (the table is in
 * pg_dist_partition: keycitus.c; idem_table_distributed() asks the same of
 * the other tables).  Also here: whether the table has the columns of
 * 0.5.0 (recovery) and 0.6.0 (derive_seed), a new row's derive seed
 * (store_new_seed()), and what every statement shares (its error
 * context, the 25006 refusal, the key's values as $1..$3).  Why each
 * path, and the older table versions: src/README.md, "The key table's
 * paths and versions".
 *
 * Locking: AccessShareLock on the table (and its primary key) while its
 * shape is read; store_open() takes the caller's lock and looks again
 * when taking it revealed a change.
 *
 * =====================================================================
 */
/* ---------------------------------------------------------------------
 * Local state
 * ---------------------------------------------------------------------
 */

static const char *const col_names[NUM_COLS] = {
	"owner", "scope", "key", "status", "request_hash", "response", "retryable",
	"attempts", "created_at", "updated_at", "expires_at", "locked_until",
	"recovery_point", "recovery_state", "derive_seed"
};

static Oid	idem_store_col_types[NUM_COLS] = {
	REGROLEOID, TEXTOID, TEXTOID, TEXTOID, BYTEAOID, JSONBOID, BOOLOID,
	INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	TEXTOID, JSONBOID, BYTEAOID
};

static Oid	idem_store_write_types[NUM_SEED_ARGS] = {
	REGROLEOID, TEXTOID, TEXTOID, TEXTOID, BYTEAOID, JSONBOID, BOOLOID,
	INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	BYTEAOID
};

/* NOT NULL as shipped: the fast path relies on it */
static const bool col_notnull[NUM_COLS] = {
	true, true, true, true, false, false, false, true, true, true, true, false,
	false, false, false
};

static KeyStore idem_store = {InvalidOid};	/* idempotency.idempotency_key */

/* the other tables: distributed by Citus?  (idem_table_distributed) */
static const char *const table_names[IDEM_NTABLES] = {
	"token", "seen_message", "state_machine"
};
static Oid	table_relid[IDEM_NTABLES];	/* InvalidOid: not looked yet */
static bool table_citus[IDEM_NTABLES];

/* ---------------------------------------------------------------------
 * For the key store's files (keystore.h)
 * ---------------------------------------------------------------------
 */
/*
 * The tag of the derive secret new seeds carry (store_new_seed()):
 * the first 8 bytes of the SHA-256 of the oldest row of
 * idempotency.derive_secret, read once per backend (read_secret_tag()).
 * Any row's tag would do (a seed names its own secret), so rows a
 * restore adds later need no invalidation; the table's relcache
 * invalidation (DROP EXTENSION, TRUNCATE) reads it again.
 */
#define SEED_TAG_LEN 8
#define SEED_RANDOM_LEN 16
static Oid	tag_relid = InvalidOid; /* InvalidOid: not read yet */
static bool tag_found;
static uint8 tag_bytes[SEED_TAG_LEN];

static void
keystore_relcache(Oid relid)
{
	if (relid == InvalidOid || relid == idem_store.relid)
		idem_store.relid = InvalidOid;
	if (relid == InvalidOid || relid == tag_relid)
		tag_relid = InvalidOid;
	for (int i = 0; i < IDEM_NTABLES; i++)
		if (relid == InvalidOid || relid == table_relid[i])
			table_relid[i] = InvalidOid;
	idem_shard_inval(relid);
}

/*
 * The number of td's live column name (InvalidAttrNumber: none), as
 * get_attnum() answers it, from a descriptor the caller has open: no
 * catalog lookup.
 */
static AttrNumber
column_of(TupleDesc td, const char *name)
{
	for (int i = 0; i < td->natts; i++)
	{
		Form_pg_attribute a = TupleDescAttr(td, i);

		if (!a->attisdropped && strcmp(NameStr(a->attname), name) == 0)
			return a->attnum;
	}
	return InvalidAttrNumber;
}

/* error context callback of a statement on the table (arg: StoreErrorArg) */
static void
store_error_context(void *arg)
{
	StoreErrorArg *a = (StoreErrorArg *) arg;

	errcontext("%s %s in table idempotency.idempotency_key",
			   a->doing, idem_describe_key(a->id));
}

/* 55000: the table cannot hold keys, for the reason detail says */
static void
store_bad_table(const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("table idempotency.idempotency_key cannot hold idempotency keys"),
			 errdetail_internal("%s", detail),
			 errhint("Restore the table as the extension's install script creates it, or see docs/reference.md (\"Partitioning the key table\").")));
}

/* the oid of type idempotency.roleref (InvalidOid before 0.6.0) */
static Oid
roleref_type(Oid nsp)
{
	return OidIsValid(nsp) ?
		GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
						CStringGetDatum("roleref"), ObjectIdGetDatum(nsp)) :
		InvalidOid;
}

/*
 * On Citus a table's owner column is an idempotency.roleref (see
 * IDEM_OWNER_EQ_CITUS).  A table distributed by hand, without distribute(),
 * still has a regrole there (Citus copies it in binary: another node's
 * oid), and one distributed by 0.5.0 a text name (a renamed role's key is
 * not found, a new role of the old name finds it): refuse both rather than
 * compare oids of another node or names.
 */
static void
citus_owner_check(Oid relid, const char *table)
{
	AttrNumber	att = get_attnum(relid, "owner");
	Oid			type;
	Oid			nsp;

	if (att == InvalidAttrNumber)
		return;
	type = get_atttype(relid, att);
	nsp = get_namespace_oid("idempotency", true);
	if (OidIsValid(nsp) && type == roleref_type(nsp))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("table idempotency.%s is distributed by Citus, but its owner column is of type %s", table,
					format_type_be(type)),
			 errdetail("On Citus the owner column is idempotency.roleref: role oids differ from node to node (a regrole copied in binary names another role), and a role's name changes with ALTER ROLE ... RENAME (a text owner pays a renamed role's retry twice)."),
			 errhint("On the coordinator, run SELECT idempotency.distribute(); it converts the column.")));
}

/*
 * Is table t of the extension known to Citus?  Then its statements compare
 * owners by name (IDEM_OWNER_EQ_CITUS).  Cached until the table changes;
 * false when it does not exist (an older version of the extension).
 */
bool
idem_table_distributed(IdemTable t)
{
	if (!OidIsValid(table_relid[t]))
	{
		Oid			nsp;
		Oid			relid;

		idem_relcache_watch();
		nsp = get_namespace_oid("idempotency", true);
		relid = OidIsValid(nsp) ? get_relname_relid(table_names[t], nsp) : InvalidOid;
		if (!OidIsValid(relid))
			return false;
		table_citus[t] = idem_citus_table(relid);
		if (table_citus[t])
			citus_owner_check(relid, table_names[t]);
		table_relid[t] = relid;
	}
	return table_citus[t];
}

/*
 * The tag of the oldest secret of idempotency.derive_secret (by created_at,
 * then secret), as SELECT substr(sha256(secret), 1, 8) ... ORDER BY
 * created_at, secret LIMIT 1 reads it, with the transaction's snapshot:
 * a scan of the table's few rows, without the parser, planner or SPI, and
 * no user code (the extension's own table, read as its owner would).
 * false when the table has no row.
 */
static bool
read_secret_tag(Oid relid, uint8 *tag)
{
	Relation	rel = table_open(relid, AccessShareLock);
	TupleDesc	td = RelationGetDescr(rel);
	AttrNumber	att_secret = column_of(td, "secret");
	AttrNumber	att_created = column_of(td, "created_at");
	Snapshot	snap = RegisterSnapshot(GetTransactionSnapshot());
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	TableScanDesc scan = table_beginscan(rel, snap, 0, NULL);
	bytea	   *best = NULL;
	TimestampTz best_at = 0;
	bool		best_at_null = false;

	if (att_secret <= 0 || att_created <= 0 ||
		TupleDescAttr(td, att_secret - 1)->atttypid != BYTEAOID ||
		TupleDescAttr(td, att_created - 1)->atttypid != TIMESTAMPTZOID)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table idempotency.derive_secret holds no usable secret"),
				 errdetail("Its columns must be secret bytea and created_at timestamptz.")));
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		d = slot_getattr(slot, att_secret, &isnull);
		bytea	   *secret;
		bool		at_null;
		TimestampTz at;
		int			cmp;

		if (isnull)
			continue;
		secret = DatumGetByteaPP(d);
		at = DatumGetTimestampTz(slot_getattr(slot, att_created, &at_null));
		if (best == NULL)
			cmp = -1;
		else if (at_null != best_at_null)
			cmp = at_null ? 1 : -1; /* NULLS LAST, as ORDER BY */
		else if (!at_null && at != best_at)
			cmp = at < best_at ? -1 : 1;
		else
		{
			int			len = VARSIZE_ANY_EXHDR(secret);
			int			best_len = VARSIZE_ANY_EXHDR(best);

			/* bytea order: memcmp of the common prefix, then the shorter */
			cmp = memcmp(VARDATA_ANY(secret), VARDATA_ANY(best), Min(len, best_len));
			if (cmp == 0)
				cmp = len < best_len ? -1 : len > best_len ? 1 : 0;
		}
		if (cmp < 0)
		{
			if (best != NULL)
				pfree(best);
			best = DatumGetByteaPCopy(d);
			best_at = at;
			best_at_null = at_null;
		}
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snap);
	table_close(rel, AccessShareLock);
	if (best == NULL)
		return false;
	{
		IdemSha256	sha;
		uint8		digest[PG_SHA256_DIGEST_LENGTH];

		idem_sha256_init(&sha);
		idem_sha256_update(&sha, VARDATA_ANY(best), VARSIZE_ANY_EXHDR(best));
		idem_sha256_final(&sha, digest);
		memcpy(tag, digest, SEED_TAG_LEN);
		explicit_bzero(VARDATA_ANY(best), VARSIZE_ANY_EXHDR(best));
		pfree(best);
	}
	return true;
}

/*
 * derive_key()'s seed for a row written now (recovery.c): version 2, the
 * tag of a derive secret (the one it derives with), 16 fresh bytes; version
 * 1 (16 fresh bytes, the oldest secret) when the secret table is empty,
 * and on Citus, where the secret is a reference table that a call carried
 * to a shard's node may not read (a distributed query from a query on a
 * shard) and every node shares the coordinator's one secret.
 */
static bytea *
store_new_seed(void)
{
	bytea	   *seed;
	uint8	   *p;

	if (idem_store.citus)
	{
		seed = palloc(VARHDRSZ + 1 + SEED_RANDOM_LEN);
		SET_VARSIZE(seed, VARHDRSZ + 1 + SEED_RANDOM_LEN);
		VARDATA(seed)[0] = 1;
		idem_unique128((uint8 *) VARDATA(seed) + 1);
		return seed;
	}
	if (!OidIsValid(tag_relid))
	{
		Oid			nsp = get_namespace_oid("idempotency", true);
		Oid			rel = OidIsValid(nsp) ? get_relname_relid("derive_secret", nsp) : InvalidOid;

		idem_relcache_watch();
		tag_found = OidIsValid(rel) && read_secret_tag(rel, tag_bytes);
		tag_relid = rel;
	}
	seed = palloc(VARHDRSZ + 1 + SEED_TAG_LEN + SEED_RANDOM_LEN);
	p = (uint8 *) VARDATA(seed);
	if (tag_found)
	{
		*p++ = 2;
		memcpy(p, tag_bytes, SEED_TAG_LEN);
		p += SEED_TAG_LEN;
	}
	else
		*p++ = 1;
	idem_unique128(p);
	SET_VARSIZE(seed, VARHDRSZ + (p + SEED_RANDOM_LEN - (uint8 *) VARDATA(seed)));
	return seed;
}

/* the table t (InvalidOid when absent); after idem_table_distributed(t) */
static Oid
key_table_relid(IdemTable t)
{
	(void) idem_table_distributed(t);
	return table_relid[t];
}

/*
 * Find the table, check that it can hold keys, and choose the path (see
 * the file comment).  Cached until the table changes.
 */
static void
store_resolve(void)
{
	Oid			nsp,
				relid = InvalidOid;
	Relation	rel;
	TupleDesc	td;
	int			ncols = 0;
	bool		fast;
	bool		citus;
	int			want;
	Oid			pk = InvalidOid;

	if (OidIsValid(idem_store.relid))
		return;
	idem_relcache_watch();
	nsp = get_namespace_oid("idempotency", true);
	if (OidIsValid(nsp))
		relid = get_relname_relid("idempotency_key", nsp);
	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table idempotency.idempotency_key does not exist"),
				 errhint("Run CREATE EXTENSION idempotency in this database.")));

	rel = relation_open(relid, AccessShareLock);
	td = RelationGetDescr(rel);
	if (rel->rd_rel->relkind != RELKIND_RELATION &&
		rel->rd_rel->relkind != RELKIND_PARTITIONED_TABLE)
		store_bad_table("It is not a table.");
	citus = idem_citus_table(relid);
	if (citus)
		citus_owner_check(relid, "idempotency_key");
	fast = rel->rd_rel->relkind == RELKIND_RELATION &&
		rel->trigdesc == NULL && rel->rd_rules == NULL && !citus;
	for (int i = 0; i < td->natts; i++)
		if (!TupleDescAttr(td, i)->attisdropped)
			ncols++;

	/*
	 * The recovery point columns came with 0.5.0: without both of them (a
	 * 0.4.0 table, before or during ALTER EXTENSION UPDATE) the guard works
	 * as before and checkpoint() asks for the update.
	 */
	idem_store.recovery = column_of(td, col_names[COL_RECOVERY_POINT]) > 0 &&
		column_of(td, col_names[COL_RECOVERY_STATE]) > 0;

	/*
	 * derive_seed came with 0.6.0: a 0.5.0 table (during ALTER EXTENSION
	 * UPDATE) is served without it, and derive_key() derives as 0.5.0 did.
	 * Both paths write a new row's seed (store_new_seed()): the column has no
	 * DEFAULT, so that the rows a dump of 0.5.0 restores have none.
	 */
	idem_store.seed = idem_store.recovery && column_of(td, col_names[COL_DERIVE_SEED]) > 0;
	want = idem_store.seed ? NUM_COLS : idem_store.recovery ? COL_DERIVE_SEED : NUM_BASE_COLS;
	fast = fast && ncols == want;
	for (int i = 0; i < want; i++)
	{
		AttrNumber	att = column_of(td, col_names[i]);
		Form_pg_attribute a;

		if (att == InvalidAttrNumber || att < 0)
			store_bad_table(psprintf("It has no column \"%s\".", col_names[i]));
		a = TupleDescAttr(td, att - 1);

		/*
		 * a domain, a typmod or another type: SQL coerces, we do not.  The
		 * owner is idempotency.roleref since 0.6.0 (regrole before): an oid
		 * either way
		 */
		if ((a->atttypid != idem_store_col_types[i] &&
			 !(i == COL_OWNER && a->atttypid == roleref_type(nsp))) ||
			a->atttypmod != -1)
			fast = false;
		/* the probe reads these without a null check */
		if (!a->attnotnull && col_notnull[i])
			fast = false;
		idem_store.attnums[i] = att;
	}
	/* the probe needs a btree primary key on exactly (owner, scope, key) */
	if (fast)
	{
		pk = IDEM_PRIMARY_KEY_INDEX(rel);
		fast = OidIsValid(pk);
	}
	if (fast)
	{
		Relation	index = index_open(pk, AccessShareLock);
		int			seen = 0;

		fast = index->rd_rel->relam == BTREE_AM_OID &&
			index->rd_index->indnkeyatts == 3;
		for (int i = 0; fast && i < 3; i++)
		{
			AttrNumber	att = index->rd_index->indkey.values[i];

			if (att == idem_store.attnums[COL_OWNER])
				seen |= 1;
			else if (att == idem_store.attnums[COL_SCOPE])
				seen |= 2;
			else if (att == idem_store.attnums[COL_KEY])
				seen |= 4;
		}
		fast = fast && seen == 7;
		index_close(index, AccessShareLock);
	}
	relation_close(rel, NoLock);
	idem_store.fast = fast;
	idem_store.citus = citus;
	idem_store.relid = relid;
}

/*
 * Open the key table with lockmode, after any change to it that taking the
 * lock revealed (another session's ALTER TABLE or ALTER EXTENSION UPDATE
 * may have committed since store_resolve() looked).
 */
static Relation
store_open(LOCKMODE lockmode)
{
	for (;;)
	{
		Oid			relid;
		Relation	rel;

		store_resolve();
		relid = idem_store.relid;
		rel = table_open(relid, lockmode);
		if (idem_store.relid == relid)
			return rel;
		/* invalidated while we waited for the lock: look again */
		table_close(rel, lockmode);
	}
}

/* $1..$3 of every statement: the key's owner, scope and key */
static void
store_key_values(const KeyId *id, Datum *values)
{
	values[0] = ObjectIdGetDatum(id->owner);
	values[1] = PointerGetDatum(cstring_to_text_with_len(id->scope, id->scope_len));
	values[2] = PointerGetDatum(cstring_to_text_with_len(id->key, id->key_len));
}

/* 25006 unless this transaction may write */
static void
store_check_writable(const KeyId *id)
{
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot store %s during recovery", idem_describe_key(id)),
				 errdetail("This server is a hot standby; it can replay finished keys but not store new ones."),
				 errhint("Send requests that do work to the primary server.")));
	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot store %s in a read-only transaction", idem_describe_key(id))));
}

/* ---------------------------------------------------------------------
 * Interface (keystore.h)
 * ---------------------------------------------------------------------
 */
/*
 * Is the key table distributed by Citus?  Then a key's serialization point
 * is its shard's primary key (a claim, keystore_lock()),
 * not the node-local key lock.  Cached (see the file comment).
 */
static bool
keystore_distributed(const KeyId *id)
{
	ErrorContextCallback errcb;
	StoreErrorArg arg = {id, "reading"};

	if (OidIsValid(idem_store.relid))
		return idem_store.citus;
	/* a table that cannot hold keys is reported as the read would */
	errcb.callback = store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	store_resolve();
	error_context_stack = errcb.previous;
	return idem_store.citus;
}

/*
 * Whether the key table has the recovery point columns (0.5.0 and later):
 * checkpoint() needs them.
 */
bool
idem_keystore_has_recovery(void)
{
	store_resolve();
	return idem_store.recovery;
}

/* whether the key table has derive_seed (0.6.0; not during the update) */
bool
idem_keystore_has_seed(void)
{
	store_resolve();
	return idem_store.seed;
}

/* from _PG_init: our relcache callback */
static void
keytable_init(void)
{
	idem_relcache_add(keystore_relcache);
}

/* =====================================================================
 * The fast path: a key's row read by probing the primary key, a new row
 * written through the executor.
 *
 * Design: taken only for a table of the shipped shape (the table section: a plain
 * heap with exactly the shipped columns and types, no triggers and no
 * rules).  Lookups probe the primary key directly (index_beginscan): no
 * parser, planner or executor on the path every request takes.  A new row
 * goes through the executor's simple-relation insert, as logical
 * replication apply writes rows: NOT NULL and CHECK constraints, every
 * index that is ready for inserts (so CREATE INDEX CONCURRENTLY and REINDEX
 * CONCURRENTLY stay consistent), expression and partial indexes, exclusion
 * constraints.  The executor's structures come from the server's
 * constructors (compat.h).
 *
 * Locking: the caller has opened the table (store_open()); the probe
 * takes AccessShareLock on the primary key.  Snapshots are the caller's.
 *
 * =====================================================================
 */
/* ---------------------------------------------------------------------
 * The fast path: a probe of the primary key, an insert through the executor
 * ---------------------------------------------------------------------
 */


/*
 * Probe the primary key for key id under snapshot snap.  Returns whether a
 * row is visible; fills *out (response copied into outcxt) and *xmin.
 */
static bool
store_probe(Relation heap, const KeyId *id, Snapshot snap, StoredKey *out,
			MemoryContext outcxt, TransactionId *xmin)
{
	Relation	index;
	TupleTableSlot *slot;
	ScanKeyData skey[3];
	IndexScanDesc scan;
	bool		found;

	/*
	 * The primary key as the relcache knows it now that the table is locked
	 * (store_resolve() checked its columns).
	 */
	index = index_open(IDEM_PRIMARY_KEY_INDEX(heap), AccessShareLock);
	slot = table_slot_create(heap, NULL);

	for (int i = 0; i < 3; i++)
	{
		AttrNumber	att = index->rd_index->indkey.values[i];
		const char *val;
		int			len;

		if (att == idem_store.attnums[COL_OWNER])
		{
			ScanKeyInit(&skey[i], i + 1, BTEqualStrategyNumber, F_OIDEQ,
						ObjectIdGetDatum(id->owner));
			continue;
		}
		if (att == idem_store.attnums[COL_SCOPE])
		{
			val = id->scope;
			len = id->scope_len;
		}
		else if (att == idem_store.attnums[COL_KEY])
		{
			val = id->key;
			len = id->key_len;
		}
		else
			elog(ERROR, "primary key of idempotency.idempotency_key changed under us");
		ScanKeyEntryInitialize(&skey[i], 0, i + 1, BTEqualStrategyNumber,
							   InvalidOid, index->rd_indcollation[i], F_TEXTEQ,
							   PointerGetDatum(cstring_to_text_with_len(val, len)));
	}
	scan = IDEM_INDEX_BEGINSCAN(heap, index, snap, 3, 0);
	index_rescan(scan, skey, 3, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (found && out != NULL)
	{
		bool		isnull;
		Datum		d;
		char	   *status;

#define COL(c) slot_getattr(slot, idem_store.attnums[c], &isnull)
		memset(out, 0, sizeof(StoredKey));
		out->found = true;
		status = TextDatumGetCString(COL(COL_STATUS));
		out->status = status[0];	/* i(n_progress), c(ompleted), f(ailed) */
		pfree(status);
		d = COL(COL_REQUEST_HASH);
		if (!isnull)
		{
			bytea	   *h = DatumGetByteaPP(d);

			if (VARSIZE_ANY_EXHDR(h) == FINGERPRINT_LEN)
			{
				out->has_hash = true;
				memcpy(out->request_hash, VARDATA_ANY(h), FINGERPRINT_LEN);
			}
		}
		d = COL(COL_RESPONSE);
		if (!isnull)
		{
			MemoryContext old = MemoryContextSwitchTo(outcxt);

			out->response = DatumGetJsonbPCopy(d);
			MemoryContextSwitchTo(old);
		}
		d = COL(COL_RETRYABLE);
		out->retryable = isnull ? false : DatumGetBool(d);
		out->attempts = DatumGetInt32(COL(COL_ATTEMPTS));
		out->created_at = DatumGetTimestampTz(COL(COL_CREATED_AT));
		out->updated_at = DatumGetTimestampTz(COL(COL_UPDATED_AT));
		out->expires_at = DatumGetTimestampTz(COL(COL_EXPIRES_AT));
		d = COL(COL_LOCKED_UNTIL);
		out->locked_until = isnull ? 0 : DatumGetTimestampTz(d);
		if (idem_store.recovery)
		{
			MemoryContext old = MemoryContextSwitchTo(outcxt);

			d = COL(COL_RECOVERY_POINT);
			if (!isnull)
				out->recovery_point = DatumGetTextPCopy(d);
			d = COL(COL_RECOVERY_STATE);
			if (!isnull)
				out->recovery_state = DatumGetJsonbPCopy(d);
			MemoryContextSwitchTo(old);
		}
#undef COL
	}
	if (found)
	{
		bool		isnull;

		*xmin = DatumGetTransactionId(slot_getsysattr(slot, MinTransactionIdAttributeNumber,
													  &isnull));
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	return found;
}

/*
 * Insert a row through the executor's simple-relation insert (the way
 * logical replication apply does): constraints, index readiness, every
 * index.  Only on the fast path: no triggers, rules or partitions, and
 * values already of the columns' types.  values/nulls are in $n order
 * (the write section's, the seed at SEED_ARG).
 */
static void
store_insert(Relation rel, Datum *values, const char *nulls)
{
	TupleDesc	td = RelationGetDescr(rel);
	EState	   *estate = CreateExecutorState();
	ResultRelInfo *rri;
	TupleTableSlot *slot;

	/* allocated by the server, never by us (compat.h: the ABI trap) */
	rri = IDEM_NEW_RESULT_REL(estate, rel);
	estate->es_output_cid = GetCurrentCommandId(true);
	ExecOpenIndices(rri, false);

	slot = ExecInitExtraTupleSlot(estate, td, &TTSOpsVirtual);
	ExecClearTuple(slot);
	memset(slot->tts_isnull, true, sizeof(bool) * td->natts);
	for (int i = 0; i < NUM_BASE_COLS; i++)
	{
		slot->tts_values[idem_store.attnums[i] - 1] = values[i];
		slot->tts_isnull[idem_store.attnums[i] - 1] = nulls[i] == 'n';
	}
	if (idem_store.seed)
	{
		/* the new row's seed, as the SQL path's $13 (the write section) */
		slot->tts_values[idem_store.attnums[COL_DERIVE_SEED] - 1] = values[SEED_ARG];
		slot->tts_isnull[idem_store.attnums[COL_DERIVE_SEED] - 1] = nulls[SEED_ARG] == 'n';
	}
	ExecStoreVirtualTuple(slot);
	IDEM_SIMPLE_INSERT(rri, estate, slot);

	idem_free_result_rel(rri);
	ExecResetTupleTable(estate->es_tupleTable, false);
	FreeExecutorState(estate);
}

/* =====================================================================
 * Reading a key's row: lookup, peek, lock, and the seed derive_key()
 * needs.
 *
 * Design: the fast path probes the primary key (the fast path); otherwise a
 * prepared SELECT (the SQL path, here) casts every column to the type the
 * guard reads, or on Citus the same through keycitus.c.  Every statement is
 * schema-qualified, every operator OPERATOR(pg_catalog.=), every value a
 * parameter; it runs as the extension's owner (runas.c) for the caller's
 * own role only (on Citus: on a shard of this node as the owner, through
 * Citus's route, reads only, as the caller).  Errors raised underneath name
 * the key and the table (an error context).
 *
 * Isolation: under READ COMMITTED every lookup sees the latest committed
 * state.  Under REPEATABLE READ and SERIALIZABLE the row may have changed
 * after the transaction's snapshot; the lookup then compares with the
 * latest committed version and raises a serialization failure (40001), so
 * the client retries and gets the stored answer.  On Citus the row lives on
 * the shard's node, where keystore_lock()'s locking read raises it.
 *
 * Locking: AccessShareLock on the table.  When another transaction holds
 * the key lock, begin() reads once without waiting for it: it only acts on
 * a live finished key, which changes only by expiring.  On Citus
 * keystore_lock() locks the row (SELECT ... FOR UPDATE).
 *
 * =====================================================================
 */
/* ---------------------------------------------------------------------
 * Local state
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_select = NULL;
static SPIPlanPtr plan_select_rp = NULL;

static const char *const sql_select = SELECT_BASE FROM_KEYS KEY_WHERE;
static const char *const sql_select_rp = SELECT_BASE SELECT_RP FROM_KEYS KEY_WHERE;

/* ---------------------------------------------------------------------
 * SQL path
 * ---------------------------------------------------------------------
 */

/*
 * Look key id up with the prepared SELECT under snapshot snap (InvalidSnapshot:
 * SPI's own, as for any statement).  Returns whether a row was found.
 */
static bool
sql_probe(const KeyId *id, Snapshot snap, StoredKey *out, MemoryContext outcxt,
		  TransactionId *xmin, bool lock)
{
	Oid			argtypes[3] = {REGROLEOID, TEXTOID, TEXTOID};
	Datum		values[3];
	uint64		n;
	HeapTuple	tup;
	TupleDesc	td;
	bool		isnull;
	Datum		d;

	ShardPlans *sp = NULL;

	store_key_values(id, values);
	if (idem_store.citus)
	{
		/* the owner as a regrole (keycitus.h: IDEM_OWNER_EQ_CITUS) */
		argtypes[0] = REGROLEOID;
		sp = idem_store_shard(idem_store.relid, id);
	}
	SPI_connect();
	if (idem_store.citus || lock)
	{
		CitusStmt	k = lock ? (idem_store.recovery ? SS_LOCK_RP : SS_LOCK) :
			(idem_store.recovery ? SS_SELECT_RP : SS_SELECT);

		n = idem_store_citus_run(sp, k, 3, argtypes, values, NULL, SPI_OK_SELECT);
	}
	else if (idem_store.recovery)
		n = idem_run_as_owner_snap(&plan_select_rp, sql_select_rp, 3, argtypes,
								   values, NULL, SPI_OK_SELECT, snap);
	else
		n = idem_run_as_owner_snap(&plan_select, sql_select, 3, argtypes,
								   values, NULL, SPI_OK_SELECT, snap);
	if (n > 1)
		store_bad_table(psprintf("It holds " UINT64_FORMAT " rows for one key: its primary key on (key, scope, owner) is missing.", n));
	if (n == 0)
	{
		SPI_finish();
		return false;
	}
	tup = SPI_tuptable->vals[0];
	td = SPI_tuptable->tupdesc;
	*xmin = DatumGetTransactionId(SPI_getbinval(tup, td, 9, &isnull));
	if (out != NULL)
	{
		char	   *status;

		memset(out, 0, sizeof(StoredKey));
		out->found = true;
		d = SPI_getbinval(tup, td, 1, &isnull);
		if (isnull)
			store_bad_table("A row has a null status.");
		status = TextDatumGetCString(d);
		out->status = status[0];
		d = SPI_getbinval(tup, td, 2, &isnull);
		if (!isnull)
		{
			bytea	   *h = DatumGetByteaPP(d);

			if (VARSIZE_ANY_EXHDR(h) == FINGERPRINT_LEN)
			{
				out->has_hash = true;
				memcpy(out->request_hash, VARDATA_ANY(h), FINGERPRINT_LEN);
			}
		}
		d = SPI_getbinval(tup, td, 3, &isnull);
		if (!isnull)
		{
			MemoryContext old = MemoryContextSwitchTo(outcxt);

			out->response = DatumGetJsonbPCopy(d);
			MemoryContextSwitchTo(old);
		}
		d = SPI_getbinval(tup, td, 4, &isnull);
		out->retryable = isnull ? false : DatumGetBool(d);
		d = SPI_getbinval(tup, td, 5, &isnull);
		out->attempts = isnull ? 1 : DatumGetInt32(d);
		d = SPI_getbinval(tup, td, 6, &isnull);
		out->created_at = isnull ? 0 : DatumGetTimestampTz(d);
		d = SPI_getbinval(tup, td, 10, &isnull);
		out->updated_at = isnull ? 0 : DatumGetTimestampTz(d);
		d = SPI_getbinval(tup, td, 7, &isnull);
		if (isnull)
			store_bad_table("A row has a null expires_at.");
		out->expires_at = DatumGetTimestampTz(d);
		d = SPI_getbinval(tup, td, 8, &isnull);
		out->locked_until = isnull ? 0 : DatumGetTimestampTz(d);
		if (idem_store.recovery)
		{
			MemoryContext old = MemoryContextSwitchTo(outcxt);

			d = SPI_getbinval(tup, td, 11, &isnull);
			if (!isnull)
				out->recovery_point = DatumGetTextPCopy(d);
			d = SPI_getbinval(tup, td, 12, &isnull);
			if (!isnull)
				out->recovery_state = DatumGetJsonbPCopy(d);
			MemoryContextSwitchTo(old);
		}
	}
	SPI_finish();
	return true;
}

/* ---------------------------------------------------------------------
 * Interface
 * ---------------------------------------------------------------------
 */

/*
 * Read the stored row of key id (expired or not) into *out; the response
 * is copied into outcxt.
 *
 * With the snapshot rules of an SQL statement: the command counter is
 * advanced (so this transaction's own earlier writes are seen) and the
 * transaction snapshot is taken (fresh under READ COMMITTED).  Under
 * REPEATABLE READ and SERIALIZABLE the latest committed version is
 * compared too (see the file comment).
 *
 * No privileges are checked: like every statement of the key store, the
 * lookup acts
 * as the table's owner, for the caller's own role only.
 */
static void
keystore_read(const KeyId *id, StoredKey *out, MemoryContext outcxt,
			  bool check_latest, bool lock)
{
	TransactionId xmin = InvalidTransactionId;
	ErrorContextCallback errcb;
	StoreErrorArg arg = {id, "reading"};
	Relation	heap;

	errcb.callback = store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;

	heap = store_open(AccessShareLock);
	memset(out, 0, sizeof(StoredKey));
	if (idem_store.fast)
	{
		CommandCounterIncrement();
		PushActiveSnapshot(GetTransactionSnapshot());
		UpdateActiveSnapshotCommandId();
		(void) store_probe(heap, id, GetActiveSnapshot(), out, outcxt, &xmin);
		PopActiveSnapshot();
	}
	else
		(void) sql_probe(id, InvalidSnapshot, out, outcxt, &xmin, lock);

	/*
	 * On Citus the row lives on the shard's node, where a locking read raises
	 * the serialization failure itself; a local snapshot says nothing about
	 * it.
	 */
	if (check_latest && IsolationUsesXactSnapshot() && !idem_store.citus)
	{
		TransactionId latest_xmin = InvalidTransactionId;
		bool		latest;

		if (idem_store.fast)
			latest = store_probe(heap, id, GetLatestSnapshot(), NULL, outcxt, &latest_xmin);
		else
			latest = sql_probe(id, GetLatestSnapshot(), NULL, outcxt,
							   &latest_xmin, false);
		if (latest != out->found || (latest && latest_xmin != xmin))
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent use of %s",
							idem_describe_key(id)),
					 errdetail("Another transaction stored a result for this key after this transaction took its snapshot."),
					 errhint("Retry the transaction; it will see the stored result.")));
	}
	table_close(heap, NoLock);
	error_context_stack = errcb.previous;
}

static void
keystore_lookup(const KeyId *id, StoredKey *out, MemoryContext outcxt)
{
	keystore_read(id, out, outcxt, true, false);
}

/*
 * The same read for looking only (lookup()): no comparison with the latest
 * committed version, since nothing is decided on it.
 */
void
idem_keystore_peek(const KeyId *id, StoredKey *out, MemoryContext outcxt)
{
	keystore_read(id, out, outcxt, false, false);
}

/*
 * The lookup of keystore_lookup() locking the row where it lives
 * (SELECT ... FOR UPDATE): on Citus, a transaction that holds the row
 * (a claim or a lock from any node) is waited for, and the row read is
 * the latest committed one.  Without Citus, the same as the lookup (the
 * key lock serialises).
 */
static void
keystore_lock(const KeyId *id, StoredKey *out, MemoryContext outcxt)
{
	keystore_read(id, out, outcxt, true, keystore_distributed(id));
}

/*
 * derive_key(): the seed and creation time of key id's live row (the
 * caller's own: run as the extension's owner for that owner only; on Citus
 * through Citus's route, by the owner's name).  Returns false when no live
 * row is visible: never stored (a single-transaction key before its
 * complete()), rolled back, expired, or another role's.  The seed is
 * copied into the caller's memory context; *seed is NULL for a row with
 * none (restored from a dump of 0.5.0), and for every row of a table from
 * before 0.6.0 (during the update; *created_at is 0 then): recovery.c
 * derives those as 0.5.0 did.
 */
static SPIPlanPtr plan_seed = NULL;
static SPIPlanPtr plan_seed_citus = NULL;

#define SELECT_SEED \
"SELECT k.derive_seed::pg_catalog.bytea, k.created_at::pg_catalog.timestamptz" \
FROM_KEYS
#define LIVE_SEED "   AND k.expires_at OPERATOR(pg_catalog.>) $4"

bool
idem_keystore_seed(const KeyId *id, bytea **seed, TimestampTz *created_at)
{
	Oid			argtypes[4] = {REGROLEOID, TEXTOID, TEXTOID, TIMESTAMPTZOID};
	Datum		values[4];
	MemoryContext cxt = CurrentMemoryContext;
	bool		found = false;
	uint64		n;
	ErrorContextCallback errcb;
	StoreErrorArg arg = {id, "reading the derive seed of"};

	store_resolve();
	*seed = NULL;
	*created_at = 0;
	if (!idem_store.seed)
		return true;			/* a 0.5.0 table: any key, as 0.5.0 did */
	errcb.callback = store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	store_key_values(id, values);
	values[3] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	SPI_connect();
	if (idem_store.citus)
	{
		argtypes[0] = REGROLEOID;	/* keycitus.h: IDEM_OWNER_EQ_CITUS */
		n = idem_run_as(false, &plan_seed_citus,
						SELECT_SEED KEY_WHERE_CITUS LIVE_SEED, 4, argtypes,
						values, NULL, SPI_OK_SELECT);
	}
	else
		n = idem_run_as_owner(&plan_seed, SELECT_SEED KEY_WHERE LIVE_SEED, 4,
							  argtypes, values, NULL, SPI_OK_SELECT);
	if (n == 1)
	{
		HeapTuple	tup = SPI_tuptable->vals[0];
		TupleDesc	td = SPI_tuptable->tupdesc;
		bool		isnull;
		Datum		d = SPI_getbinval(tup, td, 1, &isnull);

		if (!isnull)
		{
			MemoryContext old = MemoryContextSwitchTo(cxt);

			*seed = DatumGetByteaPCopy(d);
			MemoryContextSwitchTo(old);
		}
		*created_at = DatumGetTimestampTz(SPI_getbinval(tup, td, 2, &isnull));
		found = true;
	}
	SPI_finish();
	error_context_stack = errcb.previous;
	return found;
}

/* =====================================================================
 * Writing a key's row: the outcome of a held key, a checkpoint's recovery
 * point, a Citus claim.
 *
 * Design: a new row goes through the executor on the fast path
 * (the fast path), else a prepared INSERT; an update (a retry, the end of a
 * lease, a checkpoint) is always a prepared UPDATE; on Citus every write
 * is one of keycitus.c's statements (an upsert, a claim, a checkpoint by
 * the owner's name).  Every statement is schema-qualified, every operator
 * OPERATOR(pg_catalog.=), every value a parameter; it runs as the
 * extension's owner (runas.c) for the caller's own role only (on Citus as
 * the caller).  Every write refuses a read-only transaction and a hot
 * standby (25006).  Errors raised underneath name the key and the table
 * (an error context).
 *
 * Locking: writers hold the key lock (above), so no other
 * begin()/complete()/fail() writes the same key concurrently; on Citus the
 * row lock on the shard (a claim or keystore_lock()).  RowExclusiveLock
 * on the table for an insert.
 *
 * =====================================================================
 */
/* ---------------------------------------------------------------------
 * Local state
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_insert = NULL;
static SPIPlanPtr plan_insert_seed = NULL;
static SPIPlanPtr plan_update = NULL;
static SPIPlanPtr plan_update_rp = NULL;
static SPIPlanPtr plan_update_seed = NULL;
static SPIPlanPtr plan_checkpoint = NULL;
static SPIPlanPtr plan_update_freeze = NULL;
static SPIPlanPtr plan_checkpoint_freeze = NULL;

static const char *const sql_insert =
"INSERT INTO idempotency.idempotency_key AS k"
"  (owner, scope, key, status, request_hash, response, retryable, attempts,"
"   created_at, updated_at, expires_at, locked_until)"
" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

/* since 0.6.0: with the new row's derive_seed (no DEFAULT: see the table section) */
static const char *const sql_insert_seed =
"INSERT INTO idempotency.idempotency_key AS k"
"  (owner, scope, key, status, request_hash, response, retryable, attempts,"
"   created_at, updated_at, expires_at, locked_until, derive_seed)"
" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)";

#define UPDATE_BASE \
"UPDATE idempotency.idempotency_key AS k" \
"   SET status = $4, request_hash = $5, response = $6, retryable = $7," \
"       attempts = $8, created_at = $9, updated_at = $10, expires_at = $11," \
"       locked_until = $12"

/* a retry or the end of the work: the recovery point stays */
static const char *const sql_update = UPDATE_BASE KEY_WHERE;

/*
 * Since 0.6.0 a write in the same life also freezes the seed of a row that
 * has none (restored from a dump of 0.5.0, which derives from its role's
 * name now): version 0, the row's created_at, the tag of the secret it
 * derives with (the oldest restored from 0.5.0) and the role's name, as the
 * update freezes the rows it finds, so that a rename from then on changes
 * nothing.  Evaluated only for such a row (COALESCE).
 */
#define FREEZE_SEED \
", derive_seed = COALESCE(k.derive_seed," \
"    pg_catalog.decode('00', 'hex')" \
"    OPERATOR(pg_catalog.||) pg_catalog.timestamptz_send(k.created_at)" \
"    OPERATOR(pg_catalog.||) (SELECT pg_catalog.substr(pg_catalog.sha256(s.secret), 1, 8)" \
"                               FROM idempotency.derive_secret AS s WHERE s.restored_050" \
"                              ORDER BY s.created_at, s.secret LIMIT 1)" \
"    OPERATOR(pg_catalog.||) pg_catalog.convert_to(" \
"        (SELECT r.rolname::pg_catalog.text FROM pg_catalog.pg_roles AS r" \
"          WHERE r.oid OPERATOR(pg_catalog.=) k.owner::pg_catalog.oid)," \
"        pg_catalog.getdatabaseencoding()))"
static const char *const sql_update_freeze = UPDATE_BASE FREEZE_SEED KEY_WHERE;

/* new work over an expired row: its recovery point goes too */
static const char *const sql_update_rp =
UPDATE_BASE ", recovery_point = NULL, recovery_state = NULL" KEY_WHERE;

/*
 * since 0.6.0, new work over an expired row: a new seed too (a row restored
 * from a dump of 0.5.0 has none, and 0.5.0's derivation would give the new
 * life the old life's downstream keys)
 */
static const char *const sql_update_seed =
UPDATE_BASE ", recovery_point = NULL, recovery_state = NULL, derive_seed = $13" KEY_WHERE;

/* checkpoint(): the recovery point of a held lease */
static const char *const sql_checkpoint =
"UPDATE idempotency.idempotency_key AS k"
"   SET recovery_point = $4, recovery_state = $5, updated_at = $6" KEY_WHERE;
static const char *const sql_checkpoint_freeze =
"UPDATE idempotency.idempotency_key AS k"
"   SET recovery_point = $4, recovery_state = $5, updated_at = $6" FREEZE_SEED KEY_WHERE;

/* ---------------------------------------------------------------------
 * Interface
 * ---------------------------------------------------------------------
 */
/* the row of held key h, in $n order */
static void
row_values(const HeldKey *h, const char *status, Jsonb *response,
		   bool retryable_null, bool retryable, Datum *values, char *nulls)
{
	bytea	   *hash;

	memset(nulls, ' ', NUM_COLS);
	store_key_values(&h->id, values);
	values[COL_STATUS] = CStringGetTextDatum(status);
	if (h->has_hash)
	{
		hash = palloc(VARHDRSZ + FINGERPRINT_LEN);
		SET_VARSIZE(hash, VARHDRSZ + FINGERPRINT_LEN);
		memcpy(VARDATA(hash), h->request_hash, FINGERPRINT_LEN);
		values[COL_REQUEST_HASH] = PointerGetDatum(hash);
	}
	else
		nulls[COL_REQUEST_HASH] = 'n';
	if (response)
		values[COL_RESPONSE] = JsonbPGetDatum(response);
	else
		nulls[COL_RESPONSE] = 'n';
	values[COL_RETRYABLE] = BoolGetDatum(retryable);
	if (retryable_null)
		nulls[COL_RETRYABLE] = 'n';
	values[COL_ATTEMPTS] = Int32GetDatum(h->attempts);
	values[COL_CREATED_AT] = TimestampTzGetDatum(h->created_at);
	values[COL_UPDATED_AT] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	values[COL_EXPIRES_AT] = TimestampTzGetDatum(h->expires_at);
	values[COL_LOCKED_UNTIL] = TimestampTzGetDatum(h->locked_until);
	if (h->locked_until == 0)
		nulls[COL_LOCKED_UNTIL] = 'n';

	/*
	 * $13: the seed of a new row or a new life, where the table has one (an
	 * UPDATE that finds no row falls back to the INSERT)
	 */
	store_resolve();
	if (idem_store.seed)
		values[SEED_ARG] = PointerGetDatum(store_new_seed());
	else
		nulls[SEED_ARG] = 'n';
}

/*
 * Store the outcome of held key h: an UPDATE when a row (perhaps expired)
 * was there at begin(), else an INSERT.  An UPDATE that finds nothing
 * (the expired row was purged meanwhile) falls back to the INSERT.
 */
void
idem_keystore_write(const HeldKey *h, const char *status, Jsonb *response,
					bool retryable_null, bool retryable)
{
	Datum		values[NUM_COLS];
	char		nulls[NUM_COLS];
	bool		connected = false;
	bool		done = false;
	ErrorContextCallback errcb;
	StoreErrorArg arg = {&h->id, "storing"};

	store_check_writable(&h->id);
	errcb.callback = store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	row_values(h, status, response, retryable_null, retryable, values, nulls);

	store_resolve();
	if (idem_store.citus)
	{
		ShardPlans *sp = idem_store_shard(idem_store.relid, &h->id);

		/* the row this transaction claimed or locked, or a new one */
		SPI_connect();
		connected = true;
		done = idem_store_citus_run(sp, h->reset_point && idem_store.recovery ?
									SS_UPSERT_RP : SS_UPSERT, NUM_SEED_ARGS,
									idem_store_write_types, values, nulls,
									SPI_OK_INSERT) > 0;
	}
	else if (h->row_exists)
	{
		SPI_connect();
		connected = true;
		if (h->reset_point && idem_store.seed)
			done = idem_run_as_owner(&plan_update_seed, sql_update_seed, NUM_SEED_ARGS,
									 idem_store_write_types, values, nulls, SPI_OK_UPDATE) > 0;
		else if (h->reset_point && idem_store.recovery)
			done = idem_run_as_owner(&plan_update_rp, sql_update_rp, NUM_BASE_COLS,
									 idem_store_col_types, values, nulls, SPI_OK_UPDATE) > 0;
		else
			done = idem_store.seed ?
				idem_run_as_owner(&plan_update_freeze, sql_update_freeze, NUM_BASE_COLS,
								  idem_store_col_types, values, nulls, SPI_OK_UPDATE) > 0 :
				idem_run_as_owner(&plan_update, sql_update, NUM_BASE_COLS,
								  idem_store_col_types, values, nulls, SPI_OK_UPDATE) > 0;
	}
	if (!done)
	{
		Relation	rel = store_open(RowExclusiveLock);

		if (idem_store.fast)
		{
			SavedUser	saved;

			/*
			 * as the SQL path would: a DBA's CHECK or index functions run as
			 * the owner
			 */
			idem_as_owner(&saved);
			store_insert(rel, values, nulls);
			idem_as_caller(&saved);
		}
		table_close(rel, NoLock);
		if (!idem_store.fast)
		{
			if (!connected)
				SPI_connect();
			connected = true;
			if ((idem_store.seed ?
				 idem_run_as_owner(&plan_insert_seed, sql_insert_seed, NUM_SEED_ARGS,
								   idem_store_write_types, values, nulls, SPI_OK_INSERT) :
				 idem_run_as_owner(&plan_insert, sql_insert, NUM_BASE_COLS,
								   idem_store_col_types, values, nulls,
								   SPI_OK_INSERT)) != 1)
				ereport(ERROR,
						(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
						 errmsg("%s was not stored in table idempotency.idempotency_key",
								idem_describe_key(&h->id)),
						 errdetail("A trigger or rule on the table skipped the row, so a duplicate could not find it.")));
		}
	}
	if (connected)
		SPI_finish();
	error_context_stack = errcb.previous;
}

/*
 * checkpoint(): set the recovery point and state of key id, whose lease
 * the caller holds (the key lock too: guard.c's lease holder check; on
 * Citus the row lock on the shard).  In the caller's transaction, as the
 * extension's owner (on Citus on the key's shard, which is on this node:
 * the call was carried here).  Returns the rows updated (1, or 0 if the
 * row is gone, which the locks rule out).
 */
uint64
idem_keystore_checkpoint(const KeyId *id, text *point, Jsonb *state)
{
	Oid			argtypes[6] = {
		REGROLEOID, TEXTOID, TEXTOID, TEXTOID, JSONBOID, TIMESTAMPTZOID
	};
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	uint64		n;
	ShardPlans *sp;
	ErrorContextCallback errcb;
	StoreErrorArg arg = {id, "storing the recovery point of"};

	store_check_writable(id);
	if (!idem_keystore_has_recovery())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table idempotency.idempotency_key has no recovery point columns"),
				 errdetail("The library is version 0.5.0 or later; the extension's SQL objects are older."),
				 errhint("Update the extension: ALTER EXTENSION idempotency UPDATE.")));
	errcb.callback = store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;

	store_key_values(id, values);
	values[3] = PointerGetDatum(point);
	if (state)
		values[4] = JsonbPGetDatum(state);
	else
		nulls[4] = 'n';
	values[5] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	store_resolve();
	sp = idem_store.citus ? idem_store_shard(idem_store.relid, id) : NULL;
	SPI_connect();
	if (idem_store.citus)
	{
		/* the owner as a regrole (keycitus.h: IDEM_OWNER_EQ_CITUS) */
		argtypes[0] = REGROLEOID;
		n = idem_store_citus_run(sp, SS_CHECKPOINT, 6, argtypes, values, nulls,
								 SPI_OK_UPDATE);
	}
	else
		n = idem_store.seed ?
			idem_run_as_owner(&plan_checkpoint_freeze, sql_checkpoint_freeze, 6, argtypes,
							  values, nulls, SPI_OK_UPDATE) :
			idem_run_as_owner(&plan_checkpoint, sql_checkpoint, 6, argtypes,
							  values, nulls, SPI_OK_UPDATE);
	SPI_finish();
	error_context_stack = errcb.previous;
	return n;
}

/*
 * Citus: claim key h->id for this transaction with an in_progress row
 * (INSERT ... ON CONFLICT DO NOTHING, routed to the key's shard).  Returns
 * true when the row was inserted: until this transaction ends, a claim of
 * the same key from any node waits for it on the shard's primary key, and
 * then finds the row this transaction left (or none, after a rollback).
 * false when a committed row is there (perhaps committed while we waited):
 * the caller locks and reads it (keystore_lock()).  The new row has
 * no recovery point (the columns' default).
 */
static bool
keystore_claim(const HeldKey *h)
{
	Datum		values[NUM_COLS];
	char		nulls[NUM_COLS];
	bool		inserted;
	ShardPlans *sp;
	ErrorContextCallback errcb;
	StoreErrorArg arg = {&h->id, "claiming"};

	store_check_writable(&h->id);
	errcb.callback = store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	row_values(h, "in_progress", NULL, true, false, values, nulls);
	store_resolve();
	sp = idem_store_shard(idem_store.relid, &h->id);
	SPI_connect();
	inserted = idem_store_citus_run(sp, SS_CLAIM, NUM_SEED_ARGS,
									idem_store_write_types, values, nulls,
									SPI_OK_INSERT) > 0;
	SPI_finish();
	error_context_stack = errcb.previous;
	return inserted;
}

/*
 * forget() (ops.c): delete key id's live row, which this transaction has
 * taken (idem_keystore_take()), as the extension's owner: by an SQL DELETE
 * on a single server, on its shard on Citus (on this node: the call was
 * carried here, the carried call below).  Returns true when it deleted
 * the row, false when the row went meanwhile: on a single server only the
 * key lock keeps others out, and the purge, which does not take it, may
 * remove a row that expired after this transaction began.  A row still
 * there that the delete did not remove was skipped by a trigger or rule:
 * 09000, as a skipped write is, rather than a false that says there was
 * no key.
 */
static SPIPlanPtr plan_delete = NULL;

bool
idem_keystore_delete(const KeyId *id)
{
	Oid			argtypes[3] = {REGROLEOID, TEXTOID, TEXTOID};
	Datum		values[3];
	bool		deleted;
	ErrorContextCallback errcb;
	StoreErrorArg arg = {id, "forgetting"};

	store_check_writable(id);
	errcb.callback = store_error_context;
	errcb.arg = &arg;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	/* the owner as a regrole either way (keycitus.h: IDEM_OWNER_EQ_CITUS) */
	store_key_values(id, values);
	store_resolve();
	SPI_connect();
	if (idem_store.citus)
		deleted = idem_store_citus_run(idem_store_shard(idem_store.relid, id),
									   SS_DELETE, 3, argtypes, values, NULL,
									   SPI_OK_DELETE) > 0;
	else
		deleted = idem_run_as_owner(&plan_delete,
									"DELETE" FROM_KEYS KEY_WHERE,
									3, argtypes, values, NULL,
									SPI_OK_DELETE) > 0;
	SPI_finish();
	if (!deleted)
	{
		StoredKey	still;

		keystore_lookup(id, &still, CurrentMemoryContext);
		if (still.found)
			ereport(ERROR,
					(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
					 errmsg("%s was not deleted from table idempotency.idempotency_key",
							idem_describe_key(id)),
					 errdetail("A trigger or rule on the table skipped the delete; the key stands.")));
	}
	error_context_stack = errcb.previous;
	return deleted;
}

/* =====================================================================
 * A key opened and held: one call per guard operation.
 *
 * begin() opens its key with one call (idem_keystore_open()): whether the
 * call is carried to the key's shard on Citus, the new row's expiry, the
 * key lock, the row (on Citus, claimed on its shard when this transaction
 * may write).  A lease's holder holds its key with one call
 * (idem_keystore_hold()): the lock and the row, locked where it lives.
 * The guard decides from what they return and writes once
 * (idem_keystore_write()).
 *
 * Locking: the key lock as in the lock section; open() gives it back at
 * once when nothing will be written under it (a live finished row, or a
 * transaction that may not write); on Citus the shard's primary key or
 * row lock, kept to the transaction's end.
 * =====================================================================
 */

/* a live key that is finished: completed, or failed for good */
static bool
finished_row(const StoredKey *stored, TimestampTz now)
{
	return stored->found && stored->expires_at > now &&
		(stored->status == 'c' || (stored->status == 'f' && !stored->retryable));
}

/*
 * Citus: claim key id on its shard for this transaction.  Returns true
 * when this transaction wrote the in_progress row (the key was absent:
 * new); else *stored is the row there, locked until this transaction ends.
 */
static bool
claim_on_shard(const KeyId *id, const uint8 *hash, TimestampTz expires_at,
			   TimestampTz now, StoredKey *stored, MemoryContext cxt)
{
	HeldKey		row;

	memset(&row, 0, sizeof(row));
	row.id = *id;
	row.attempts = 1;
	row.created_at = now;
	row.expires_at = expires_at;
	if (hash != NULL)
	{
		row.has_hash = true;
		memcpy(row.request_hash, hash, FINGERPRINT_LEN);
	}
	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		if (keystore_claim(&row))
		{
			memset(stored, 0, sizeof(StoredKey));
			return true;
		}
		keystore_lock(id, stored, cxt);
		if (stored->found)
			return false;
		/* deleted in between (forget(), purge()): claim again */
	}
}

/*
 * Open key id for begin(): hash is the request's fingerprint (NULL: none),
 * ttl the new row's lifetime (NULL: default_ttl; 22023 unless positive),
 * now the transaction's start.  On Citus with the key's shard on another
 * node, sets out->routed and does nothing else: the call is carried there
 * (idem_route_call()).  Else takes the key lock if it is free and reads
 * the row; if another transaction holds the lock, reads first and returns
 * a live finished row without waiting (it can only change by expiring),
 * else waits at most lock_wait (IK002) and reads again, since the holder
 * may commit meanwhile.  On Citus, a transaction that may write claims the
 * key on its shard instead of reading (out->claimed when it wrote the
 * in_progress row).  The lock is given back when nothing will be written
 * under it: a finished row (out->finished), or a read-only transaction or
 * a standby.  The row is allocated in cxt.
 */
void
idem_keystore_open(const KeyId *id, const uint8 *hash, const Interval *ttl,
				   TimestampTz now, KeyOpen *out, MemoryContext cxt)
{
	bool		may_write = !(RecoveryInProgress() || XactReadOnly);
	bool		citus;
	bool		took_lock;
	KeyLockResult lock;

	memset(out, 0, sizeof(KeyOpen));
	out->expires_at = expiry_of(ttl, now);
	citus = keystore_distributed(id);
	if (citus && idem_route_key(id))
	{
		out->routed = true;
		return;
	}

	/*
	 * On Citus the shard decides whenever this transaction may write; a
	 * read-only one only looks, and the guard refuses it unless it replays.
	 */
	citus = citus && may_write;
	lock = keylock_try(id);
	took_lock = (lock == KEYLOCK_TAKEN);
	if (lock == KEYLOCK_BUSY)
	{
		keystore_lookup(id, &out->stored, cxt);
		if (finished_row(&out->stored, now))
		{
			out->finished = true;
			return;
		}
		keylock_wait(id);
		took_lock = true;
	}
	if (citus)
		out->claimed = claim_on_shard(id, hash, out->expires_at, now,
									  &out->stored, cxt);
	else
		keystore_lookup(id, &out->stored, cxt);
	out->finished = finished_row(&out->stored, now);
	/* a replay writes nothing, so it keeps nobody out */
	if (took_lock && (out->finished || !may_write))
		keylock_release(id);
}

/*
 * Hold key id for a lease's holder (complete(), fail(), checkpoint(),
 * renew() of an attempt begun earlier): take the key lock, waiting at most
 * lock_wait (IK002), and read the row locked where it lives (on Citus the
 * row lock on the shard keeps a takeover out).  The row is allocated in
 * cxt.
 */
void
idem_keystore_hold(const KeyId *id, StoredKey *out, MemoryContext cxt)
{
	if (keylock_try(id) == KEYLOCK_BUSY)
		keylock_wait(id);
	keystore_lock(id, out, cxt);
}

/*
 * Take key id for forget(): the key lock if no other transaction holds it
 * (KEYLOCK_BUSY: it does, and nothing was read; forget() never waits), and
 * the row read locked where it lives (on Citus the row lock on the shard
 * keeps a begin() through any node out).  When there is no live row (none,
 * expired, another role's) the lock this call took is given back.  The row
 * is allocated in cxt.
 */
KeyLockResult
idem_keystore_take(const KeyId *id, StoredKey *out, MemoryContext cxt)
{
	KeyLockResult lock = keylock_try(id);

	if (lock == KEYLOCK_BUSY)
	{
		memset(out, 0, sizeof(StoredKey));
		return lock;
	}
	keystore_lock(id, out, cxt);
	if (lock == KEYLOCK_TAKEN &&
		(!out->found || out->expires_at <= GetCurrentTransactionStartTimestamp()))
		keylock_release(id);
	return lock;
}

/* =====================================================================
 * Citus: carry a call to the node of its key's shard, and run a
 * statement on a shard of this node as the extension's owner.
 *
 * On Citus no role but the extension's owner writes the key, token and
 * seen-message tables either: rows are written where their shard lives, as
 * the owner (keycitus.c for keys, idem_shard_exec() here for tokens and
 * seen messages).  A call whose shard is on another node is carried there
 * whole: the SQL function calls itself on that node, with the same
 * arguments and the caller's settings, in the caller's distributed
 * transaction, through a router query with a modifying CTE on an
 * always-empty co-located table (key_route, token_route), so Citus
 * includes that node in its two-phase commit.  A routed call does what the
 * same call on the shard's node does, no more.  The query and why each of
 * its parts: src/README.md, "Citus in detail".
 *
 * Locking: a carried call's UPDATE takes RowExclusiveLock on the route
 * table's shard and matches no row.  PUBLIC may UPDATE that one column and
 * nothing else (a column grant, which LOCK TABLE does not accept), so no
 * role can lock a route table and hold up the others' carried calls.
 *
 * =====================================================================
 */
/* the route tables, by IdemRoute */
static const char *const route_sql[IDEM_NROUTES] = {
	"WITH r AS (UPDATE idempotency.key_route AS r SET k = r.k"
	" WHERE r.k OPERATOR(pg_catalog.=) $1 RETURNING r.k)",
	"WITH r AS (UPDATE idempotency.token_route AS r SET t = r.t"
	" WHERE r.t OPERATOR(pg_catalog.=) $1 RETURNING r.t)"
};
static const Oid route_type[IDEM_NROUTES] = {TEXTOID, UUIDOID};

/*
 * The caller's settings that a call acts on, carried with it: the carried
 * call runs in the session Citus keeps on the shard's node, whose settings
 * are the server's, not the ones the caller SET in its own session (before,
 * a role's SET idempotency.default_ttl = 3600 gave its keys and message ids
 * the server's day when carried, and its lock_wait was not honoured).  The
 * route query sets them there for the rest of the transaction (set_config
 * is_local), before the function runs: in the subquery c, whose volatile
 * target list the planner neither pulls up nor prunes, from columns of s,
 * so that Citus does not evaluate them on the node that plans the query.
 */
static const struct
{
	const char *name;
	const int  *value;
}			carried[] = {
	{"idempotency.default_ttl", &idem_default_ttl_s},
	{"idempotency.lock_wait", &idem_lock_wait_ms},
	{"idempotency.max_key_length", &idem_max_key_length},
};
#define NCARRIED ((int) lengthof(carried))

/*
 * Citus: is the shard of the key table row of id on another node?  (Then
 * the call must be carried there: idem_route_call.)  When it is here, its
 * metadata lock is taken (keycitus.c).
 */
bool
idem_route_key(const KeyId *id)
{
	Oid			shard_relid;

	if (!keystore_distributed(id))
		return false;
	return idem_local_shard(idem_store.relid, id, &shard_relid) == 0;
}

/* the same for table t, whose distribution value is value (text form) */
bool
idem_route_table(IdemTable t, const char *value, int len)
{
	KeyId		v;
	Oid			shard_relid;

	if (!idem_table_distributed(t))
		return false;
	memset(&v, 0, sizeof(v));
	v.key = value;
	v.key_len = len;
	v.scope = "";
	return idem_local_shard(key_table_relid(t), &v, &shard_relid) == 0;
}

/*
 * Is this backend running a task a Citus node sent it (a carried call
 * among them)?  Citus names its connections "citus_internal gpid=..."
 * (CITUS_APPLICATION_NAME_PREFIX).  Only a hint: a client may call itself
 * that too.
 */
bool
idem_route_arrived(void)
{
	const char *name = GetConfigOption("application_name", true, false);

	return name != NULL && strncmp(name, "citus_internal gpid=", 20) == 0;
}

/*
 * Call function fn (its qualified name) with nargs arguments of types
 * argtypes on the node of the shard group of value (of type
 * route_type[via]): see src/README.md, "Citus in detail".  *cache keeps
 * the plan (one per call site).  Returns its result, of type rettype, in
 * the caller's memory context; *isnull when it is null.
 */
Datum
idem_route_exec(IdemRoute via, Datum value, const char *fn, int nargs,
				const Oid *argtypes, const Datum *args, const bool *argnulls,
				Oid rettype, SPIPlanPtr *cache, bool *isnull)
{
	int			nparams = nargs + 1 + NCARRIED;
	Oid		   *types = palloc(sizeof(Oid) * nparams);
	Datum	   *values = palloc(sizeof(Datum) * nparams);
	char	   *nulls = palloc(nparams + 1);
	Datum		result;
	int16		typlen;
	bool		typbyval;
	MemoryContext caller_cxt = CurrentMemoryContext;

	types[0] = route_type[via];
	values[0] = value;
	nulls[0] = ' ';
	for (int i = 0; i < nargs; i++)
	{
		types[i + 1] = argtypes[i];
		values[i + 1] = argnulls[i] ? (Datum) 0 : args[i];
		nulls[i + 1] = argnulls[i] ? 'n' : ' ';
	}
	/* the caller's settings, each as text (the GUC's base unit) */
	for (int i = 0; i < NCARRIED; i++)
	{
		types[nargs + 1 + i] = TEXTOID;
		values[nargs + 1 + i] = CStringGetTextDatum(psprintf("%d", *carried[i].value));
		nulls[nargs + 1 + i] = ' ';
	}
	nulls[nparams] = '\0';

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (*cache == NULL)
	{
		StringInfoData sql;
		SPIPlanPtr	plan;

		/* the arguments positional, through the subquery's columns */
		initStringInfo(&sql);
		appendStringInfo(&sql, "%s SELECT %s(", route_sql[via], fn);
		for (int i = 0; i < nargs; i++)
			appendStringInfo(&sql, "%sc.a%d", i ? ", " : "", i + 1);
		appendStringInfoString(&sql, ") FROM (SELECT ");
		for (int i = 0; i < nargs; i++)
			appendStringInfo(&sql, "%s$%d AS a%d", i ? ", " : "", i + 2, i + 1);
		for (int i = 0; i < NCARRIED; i++)
			appendStringInfo(&sql, "%spg_catalog.set_config('%s', s.g%d, true) AS g%d",
							 (i || nargs) ? ", " : "", carried[i].name, i, i);
		appendStringInfoString(&sql, " FROM (SELECT pg_catalog.count(*)");
		for (int i = 0; i < NCARRIED; i++)
			appendStringInfo(&sql, ", $%d AS g%d", nargs + 2 + i, i);
		appendStringInfoString(&sql, " FROM r) AS s) AS c");

		/*
		 * A custom plan for each call: Citus cannot plan the modifying CTE of
		 * a generic plan (its parameters unknown), and prunes a custom one to
		 * the route's shard group.
		 */
		plan = SPI_prepare_cursor(sql.data, nparams, types, CURSOR_OPT_CUSTOM_PLAN);
		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		*cache = plan;
		pfree(sql.data);
	}
	if (SPI_execute_plan(*cache, values, nulls, false, 0) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "idempotency: the routed call of %s returned " UINT64_FORMAT " rows",
			 fn, (uint64) SPI_processed);
	result = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, isnull);
	get_typlenbyval(rettype, &typlen, &typbyval);
	if (!*isnull)
	{
		MemoryContext spi_cxt = MemoryContextSwitchTo(caller_cxt);

		result = datumCopy(result, typbyval, typlen);
		MemoryContextSwitchTo(spi_cxt);
	}
	SPI_finish();
	return *isnull ? (Datum) 0 : result;
}

/*
 * Call the SQL function of fcinfo again, with the same arguments, on the
 * node of the shard group of value: idem_route_exec().  Returns the
 * function's result there.
 */
Datum
idem_route_call(FunctionCallInfo fcinfo, IdemRoute via, Datum value,
				SPIPlanPtr *cache)
{
	Oid			fn = fcinfo->flinfo->fn_oid;
	int			nargs = PG_NARGS();
	Datum	   *args = palloc(sizeof(Datum) * Max(nargs, 1));
	bool	   *argnulls = palloc(sizeof(bool) * Max(nargs, 1));
	Oid		   *declared;
	int			ndeclared;
	Oid			rettype;
	char	   *name;
	char	   *paren;
	Datum		result;
	bool		isnull;

	rettype = get_func_signature(fn, &declared, &ndeclared);
	if (ndeclared != nargs)
		elog(ERROR, "idempotency: cannot route function %u: %d arguments, %d declared",
			 fn, nargs, ndeclared);
	for (int i = 0; i < nargs; i++)
	{
		argnulls[i] = PG_ARGISNULL(i);
		args[i] = argnulls[i] ? (Datum) 0 : PG_GETARG_DATUM(i);
	}
	/* the function by its qualified name (without its argument types) */
	name = format_procedure_qualified(fn);
	paren = strchr(name, '(');
	if (paren)
		*paren = '\0';
	result = idem_route_exec(via, value, name, nargs, declared, args, argnulls,
							 rettype, cache, &isnull);
	if (isnull)
		PG_RETURN_NULL();
	return result;
}

/*
 * Citus: run sql, a statement on table t of the extension (named in it as
 * shell, e.g. "idempotency.token"), on the shard of value when that shard
 * is on this node, as the extension's owner (inside SPI).  Returns false,
 * running nothing, when the shard is not here; else true with *processed
 * the rows processed.  Planned afresh each time (the text names the shard).
 */
bool
idem_shard_exec(IdemTable t, const char *value, int len, const char *shell,
				const char *sql, int nargs, Oid *argtypes, Datum *values,
				const char *nulls, int expect_rc, uint64 *processed)
{
	KeyId		v;
	Oid			shard_relid;
	const char *at = strstr(sql, shell);
	char	   *nsp;
	char	   *rel;
	StringInfoData buf;

	memset(&v, 0, sizeof(v));
	v.key = value;
	v.key_len = len;
	v.scope = "";
	if (idem_local_shard(key_table_relid(t), &v, &shard_relid) == 0)
		return false;
	nsp = get_namespace_name(get_rel_namespace(shard_relid));
	rel = get_rel_name(shard_relid);
	if (at == NULL || nsp == NULL || rel == NULL)
		elog(ERROR, "idempotency: a shard of %s is gone", shell);
	initStringInfo(&buf);
	appendBinaryStringInfo(&buf, sql, at - sql);
	appendStringInfoString(&buf, quote_qualified_identifier(nsp, rel));
	appendStringInfoString(&buf, at + strlen(shell));
	*processed = idem_run_as_owner_once(buf.data, nargs, argtypes, values,
										nulls, expect_rc);
	pfree(buf.data);
	return true;
}

/* from _PG_init: the GUCs lock_wait, log_waits, default_ttl and
 * max_key_length, the relcache callbacks */
void
idem_keystore_init(void)
{
	keylock_init();
	keytable_init();
	keyid_init();
}
