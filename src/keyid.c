/*-------------------------------------------------------------------------
 *
 * keyid.c
 *	  Ground floor: the identity of a key (owner role, scope, key): building
 *	  and validating it from SQL arguments, hashing it, describing it in
 *	  messages; and the expiry of a new key and the seconds until a lease
 *	  ends.
 *
 * Design of the hash.  KeyId.hash names the key lock (keystore.c: an
 * advisory lock tag, visible to every role in pg_locks) and keys the
 * per-transaction table (guard.c).  It must not let one role reach
 * another's keys: with a public hash function a role could craft a key
 * whose lock equals another role's key (and so delay or block it), or
 * recognise another role's key in pg_locks.  So it is SipHash-2-4, a
 * keyed pseudo-random function, over (owner, scope, key) with a 128-bit
 * secret per database kept in idempotency.lock_secret, a table only the
 * extension's owner can read.  Without the secret a role can neither
 * predict nor invert the tag; a chance collision (2^-64 per pair) only
 * makes one request wait for another, never gives a wrong answer.
 *
 * The secret is read once per backend (a scan of the table) and used
 * for the rest of the transaction that read it even if an invalidation
 * arrives meanwhile, so a transaction never hashes one key two ways.  A
 * trigger on the table (lock_secret_changed) invalidates it when the row
 * changes, so every backend reads a new secret at its next transaction.
 * That read takes a fresh snapshot, not the transaction's (under
 * REPEATABLE READ that one may predate the change), and only a read that
 * succeeded clears the invalidation (load_secret()).  Until
 * ALTER EXTENSION idempotency UPDATE has created the table, the 0.3.0 hash
 * is used, so old and new libraries agree during the update.
 *
 * No locks of its own.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "executor/tuptable.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idempotency.h"

/* ---------------------------------------------------------------------
 * GUCs
 * ---------------------------------------------------------------------
 */
int			idem_default_ttl_s = 24 * 60 * 60;
int			idem_max_key_length = 255;

#define DESCRIBE_MAX_BYTES 100
#define SECRET_LEN 16

/* ---------------------------------------------------------------------
 * Local state: the lock secret
 * ---------------------------------------------------------------------
 */
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
 * Read the secret (see the file comment); sets secret_state.
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
					 errhint("Insert one random 16-byte secret (see the README, \"Table idempotency.lock_secret\").")));
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

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */

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

/* ---------------------------------------------------------------------
 * Interface
 * ---------------------------------------------------------------------
 */

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
 * outbox.c names a message key's lock with owner InvalidOid)
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
TimestampTz
idem_expiry_of(const Interval *ttl, TimestampTz now)
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

/* idem_expiry_of() of SQL argument ttlarg */
TimestampTz
idem_expiry(FunctionCallInfo fcinfo, int ttlarg, TimestampTz now)
{
	return idem_expiry_of(PG_ARGISNULL(ttlarg) ? NULL : PG_GETARG_INTERVAL_P(ttlarg), now);
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

/* from _PG_init: our GUCs, our relcache callback */
void
idem_keyid_init(void)
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
