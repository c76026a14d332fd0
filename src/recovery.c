/*-------------------------------------------------------------------------
 *
 * recovery.c
 *	  Recovery points: idempotency.checkpoint() and derive_key().
 *
 * A request that calls other systems runs in phases under one lease-mode
 * key.  Each phase commits its business writes together with
 * checkpoint(key, point, state, attempt), which records on the key's row
 * the phase just finished and a jsonb state; a retry's begin() (and
 * lookup()) returns the last committed point and state, and the handler
 * skips the phases before it.  checkpoint() is fenced exactly as
 * complete(..., attempt) is (guard.c: idem_guard_lease_holder; IK004 for a
 * taken-over, finished, unknown or expired key, and for a
 * single-transaction key).
 *
 * derive_key(key, step, scope) is "idk_" + base32 of the first 128 bits of
 * an HMAC-SHA256, under a secret only the extension's owner reads, over
 * the key row's derive_seed and created_at, the scope, the key and the
 * step: the same for every attempt of the key's life, so another system's
 * own idempotency turns a repeated call into a replay.  It belongs to the
 * row, not to the role's name.  The seed versions (0.5.0's rows, dumps of
 * 0.5.0) and why the secret is not lock_secret: src/README.md,
 * "Recovery points".
 *
 * Locking: checkpoint() takes the key lock (through guard.c) and writes
 * the row as the extension's owner in the caller's transaction
 * (keystore.c); on Citus the lease holder check also locks the row on the
 * key's shard (SELECT ... FOR UPDATE).  derive_key() reads the secret
 * table and the key's row and takes no lock of its own.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/cryptohash.h"
#include "common/sha2.h"
#include "common/hmac.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"

#include "guard.h"
#include "idempotency.h"
#include "keystore.h"
#include "stats.h"

#define DERIVE_SECRET_LEN 32	/* bytes of HMAC-SHA256 key */
#define DERIVE_BITS_BYTES 16	/* 128 bits of the MAC are kept */
#define DERIVE_PREFIX "idk_"

/* ---------------------------------------------------------------------
 * Local state
 * ---------------------------------------------------------------------
 */
static SPIPlanPtr plan_secret = NULL;

/* ---------------------------------------------------------------------
 * Helpers
 * ---------------------------------------------------------------------
 */

/*
 * A name argument (a recovery point, a step): not null (22004), not empty
 * and at most idempotency.max_key_length characters (22023).
 */
static text *
name_arg(FunctionCallInfo fcinfo, int argno, const char *what)
{
	text	   *t;
	int			len;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what)));
	t = PG_GETARG_TEXT_PP(argno);
	len = VARSIZE_ANY_EXHDR(t);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what)));
	if (pg_mbstrlen_with_len(VARDATA_ANY(t), len) > idem_max_key_length)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long", what),
				 errdetail("The %s has %d characters; idempotency.max_key_length allows %d.",
						   what, pg_mbstrlen_with_len(VARDATA_ANY(t), len),
						   idem_max_key_length)));
	return t;
}

/* 55000 unless the installed SQL objects have recovery points */
static void
require_recovery(const char *what)
{
	if (!idem_keystore_has_recovery())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s needs version 0.5.0 of extension idempotency", what),
				 errdetail("The library is 0.5.0 or later, the extension's SQL objects are older."),
				 errhint("Update the extension: ALTER EXTENSION idempotency UPDATE.")));
}

/* which row of idempotency.derive_secret a key derives with */
typedef enum DeriveSecret
{
	SECRET_OLDEST,				/* the oldest: 0.5.0's rule (a 0.5.0 table, a
								 * version 1 seed) */
	SECRET_RESTORED_050,		/* the oldest restored from a dump of 0.5.0 (a
								 * row without a seed) */
	SECRET_TAGGED				/* the one whose tag the seed carries */
} DeriveSecret;

/*
 * Read the secret a key derives with (see DeriveSecret), as the owner.
 * tag: SEED_TAG_LEN bytes, for SECRET_TAGGED.
 */
#define SEED_TAG_LEN 8
static SPIPlanPtr plan_secret_050 = NULL;
static SPIPlanPtr plan_secret_tag = NULL;

static void
load_derive_secret(uint8 *secret, DeriveSecret which, const uint8 *tag,
				   const KeyId *id)
{
	Oid			nsp = get_namespace_oid("idempotency", true);
	bool		isnull;
	Datum		d;
	bytea	   *b;
	uint64		n;

	if (!OidIsValid(nsp) || !OidIsValid(get_relname_relid("derive_secret", nsp)))
		require_recovery("idempotency.derive_key()");	/* before the update */
	if (!OidIsValid(nsp) || !OidIsValid(get_relname_relid("derive_secret", nsp)))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table idempotency.derive_secret does not exist"),
				 errhint("Update the extension: ALTER EXTENSION idempotency UPDATE.")));
	SPI_connect();
	if (which == SECRET_TAGGED)
	{
		Oid			argtypes[1] = {BYTEAOID};
		Datum		values[1];
		bytea	   *t = palloc(VARHDRSZ + SEED_TAG_LEN);

		SET_VARSIZE(t, VARHDRSZ + SEED_TAG_LEN);
		memcpy(VARDATA(t), tag, SEED_TAG_LEN);
		values[0] = PointerGetDatum(t);
		n = idem_run_as_owner(&plan_secret_tag,
							  "SELECT s.secret FROM idempotency.derive_secret AS s"
							  " WHERE pg_catalog.substr(pg_catalog.sha256(s.secret), 1, 8)"
							  "       OPERATOR(pg_catalog.=) $1"
							  " ORDER BY s.created_at, s.secret LIMIT 1",
							  1, argtypes, values, NULL, SPI_OK_SELECT);
		if (n != 1)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("the derive secret of %s is not in table idempotency.derive_secret",
							idem_describe_key(id)),
					 errdetail("The key's derive_seed names the secret it derives with; no row of the table is that secret."),
					 errhint("Restore the row from a dump of the database the key came from; another secret would change its derived keys (see docs/reference.md, \"derive_key()\").")));
	}
	else if (which == SECRET_RESTORED_050)
	{
		n = idem_run_as_owner(&plan_secret_050,
							  "SELECT s.secret FROM idempotency.derive_secret AS s"
							  " WHERE s.restored_050"
							  " ORDER BY s.created_at, s.secret LIMIT 1",
							  0, NULL, NULL, NULL, SPI_OK_SELECT);
		if (n != 1)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("table idempotency.derive_secret has no secret restored from 0.5.0"),
					 errdetail("%s was restored from a dump of 0.5.0 (it has no derive_seed); it derives with the secret restored from that dump.",
							   idem_describe_key(id)),
					 errhint("Restore the dump's rows of idempotency.derive_secret too; another secret would change its derived keys (see docs/reference.md, \"derive_key()\").")));
	}
	else
	{
		n = idem_run_as_owner(&plan_secret,
							  "SELECT s.secret FROM idempotency.derive_secret AS s"
							  " ORDER BY s.created_at, s.secret LIMIT 1",
							  0, NULL, NULL, NULL, SPI_OK_SELECT);
		if (n != 1)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("table idempotency.derive_secret is empty"),
					 errdetail("derive_key() needs the secret the extension's install script creates."),
					 errhint("Restore the row from a dump of this database; a new secret changes every derived key (see docs/reference.md, \"derive_key()\").")));
	}
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	b = isnull ? NULL : DatumGetByteaPP(d);
	if (b == NULL || VARSIZE_ANY_EXHDR(b) != DERIVE_SECRET_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table idempotency.derive_secret holds no usable secret"),
				 errdetail("The secret must be %d bytes.", DERIVE_SECRET_LEN)));
	memcpy(secret, VARDATA_ANY(b), DERIVE_SECRET_LEN);
	SPI_finish();
}

/* 8 bytes, most significant first (timestamptz_send's order) */
static uint64
be_int64(const uint8 *p)
{
	uint64		v = 0;

	for (int i = 0; i < 8; i++)
		v = (v << 8) | p[i];
	return v;
}

/* feed one length-prefixed field to the MAC */
static void
mac_field(pg_hmac_ctx *ctx, const char *data, uint32 len)
{
	uint8		lenbuf[4];

	lenbuf[0] = (uint8) (len >> 24);
	lenbuf[1] = (uint8) (len >> 16);
	lenbuf[2] = (uint8) (len >> 8);
	lenbuf[3] = (uint8) len;
	if (pg_hmac_update(ctx, lenbuf, 4) < 0 ||
		pg_hmac_update(ctx, (const uint8 *) data, len) < 0)
		elog(ERROR, "could not compute HMAC-SHA256: %s", pg_hmac_error(ctx));
}

/* ---------------------------------------------------------------------
 * SQL-callable functions
 * ---------------------------------------------------------------------
 */

/* checkpoint(key, point, state, attempt, scope): record a recovery point */
PG_FUNCTION_INFO_V1(idempotency_checkpoint);

Datum
idempotency_checkpoint(PG_FUNCTION_ARGS)
{
	KeyId		id = idem_keyid(fcinfo, 0, 4, "idempotency key");
	text	   *point = name_arg(fcinfo, 1, "recovery point");
	Jsonb	   *state = PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2);
	int32		attempt;
	HeldKey    *held;
	HeldKey		h;
	static SPIPlanPtr route = NULL;

	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("attempt must not be null"),
				 errhint("Pass the attempts value that begin() returned.")));
	attempt = PG_GETARG_INT32(3);
	require_recovery("idempotency.checkpoint()");
	/* Citus: the key's shard on another node: the call runs there */
	if (idem_route_key(&id))
		return idem_route_call(fcinfo, IDEM_ROUTE_KEYS, PG_GETARG_DATUM(0), &route);

	held = idem_held_lookup(&id);
	if (held && held->state == HELD_BEGUN)
	{
		idem_stats_count(&id, IDEM_STAT_IK004);
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_KEY_NOT_HELD),
				 errmsg("%s is not held by a lease", idem_describe_key(&id)),
				 errdetail("This transaction began it without a lease; its work commits at once, so there is no point to resume from."),
				 errhint("Begin the key with lease => an interval to run it in phases.")));
	}

	/* the attempt holds the lease (IK004 otherwise); takes the key lock */
	idem_guard_lease_holder(&id, attempt, &h);
	if (idem_keystore_checkpoint(&id, point, state) != 1)
		elog(ERROR, "%s vanished under its key lock", idem_describe_key(&id));
	PG_RETURN_VOID();
}

/* derive_key(key, step, scope) -> text: the key to give another system */
PG_FUNCTION_INFO_V1(idempotency_derive_key);

Datum
idempotency_derive_key(PG_FUNCTION_ARGS)
{
	static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz234567";
	KeyId		id = idem_keyid(fcinfo, 0, 2, "idempotency key");
	text	   *step = name_arg(fcinfo, 1, "step");
	uint8		secret[DERIVE_SECRET_LEN];
	uint8		mac[PG_SHA256_DIGEST_LENGTH];
	bytea	   *seed = NULL;
	TimestampTz created_at = 0;
	const char *seed_data;
	int			seed_len;
	pg_hmac_ctx *ctx;
	char		out[sizeof(DERIVE_PREFIX) + (DERIVE_BITS_BYTES * 8 + 4) / 5];
	char	   *p;
	uint32		acc = 0;
	int			bits = 0;

	if (!idem_keystore_seed(&id, &seed, &created_at))
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_KEY_NOT_HELD),
				 errmsg("%s has no stored row to derive from", idem_describe_key(&id)),
				 errdetail("derive_key() derives from the key's own row: a key begun with a lease has one from begin(); a single-transaction key has none before complete() or fail(), and an expired or unknown key none at all."),
				 errhint("Begin the key with lease => an interval before calling another system with a derived key.")));
	if (created_at == GetCurrentTransactionStartTimestamp())
	{
		/*
		 * The row's life began in this transaction (a new life's created_at
		 * is its transaction's start; a takeover keeps the row's): if this
		 * transaction rolls back, the retry draws another seed and derives
		 * another key, and the other system would see two.
		 */
		ereport(ERROR,
				(errcode(ERRCODE_IDEMPOTENCY_KEY_NOT_HELD),
				 errmsg("%s was begun in this transaction", idem_describe_key(&id)),
				 errdetail("derive_key() derives from the key's committed row: if this transaction rolled back, a retry would begin the key anew and derive another key."),
				 errhint("Commit the begin() first: begin the key with lease => an interval in its own transaction, then derive.")));
	}
	if (seed != NULL)
	{
		seed_data = VARDATA_ANY(seed);
		seed_len = VARSIZE_ANY_EXHDR(seed);
	}
	else
	{
		seed_data = NULL;
		seed_len = 0;
	}

	/*
	 * version 0: created_at (8), the secret's tag (8), the role's name;
	 * version 1: 16 bytes; version 2: the secret's tag (8), 16 bytes
	 */
	if (seed != NULL &&
		(seed_len < 1 || seed_data[0] > 2 ||
		 (seed_data[0] == 0 && seed_len < 1 + 8 + SEED_TAG_LEN) ||
		 (seed_data[0] == 2 && seed_len < 1 + SEED_TAG_LEN)))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("%s has a derive seed of unknown version", idem_describe_key(&id)),
				 errdetail("derive_seed must start with byte 0, 1 or 2; it has %d bytes.", seed_len)));

	if (seed == NULL)
		load_derive_secret(secret, idem_keystore_has_seed() ? SECRET_RESTORED_050 : SECRET_OLDEST,
						   NULL, &id);
	else if (seed_data[0] == 0)
		load_derive_secret(secret, SECRET_TAGGED, (const uint8 *) seed_data + 9, &id);
	else if (seed_data[0] == 2)
		load_derive_secret(secret, SECRET_TAGGED, (const uint8 *) seed_data + 1, &id);
	else
		load_derive_secret(secret, SECRET_OLDEST, NULL, &id);

	ctx = pg_hmac_create(PG_SHA256);
	if (ctx == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory")));
	if (pg_hmac_init(ctx, secret, DERIVE_SECRET_LEN) < 0)
		elog(ERROR, "could not compute HMAC-SHA256: %s", pg_hmac_error(ctx));
	if (seed == NULL)
	{
		/*
		 * a row stored by 0.5.0 without a seed (restored from its dump), or
		 * any key of a 0.5.0 table: 0.5.0's key, from the role's name now
		 */
		const char *name = GetUserNameFromId(id.owner, false);

		mac_field(ctx, "idempotency.derive_key v1", strlen("idempotency.derive_key v1"));
		mac_field(ctx, name, strlen(name));
	}
	else if (seed_data[0] == 0 && be_int64((const uint8 *) seed_data + 1) == (uint64) created_at)
	{
		/*
		 * a row stored before 0.6.0, still in the life it had then: 0.5.0's
		 * key, from the role's name the update froze
		 */
		mac_field(ctx, "idempotency.derive_key v1", strlen("idempotency.derive_key v1"));
		mac_field(ctx, seed_data + 9 + SEED_TAG_LEN, seed_len - 9 - SEED_TAG_LEN);
	}
	else
	{
		uint8		when[8];

		for (int i = 0; i < 8; i++)
			when[i] = (uint8) ((uint64) created_at >> (56 - 8 * i));
		mac_field(ctx, "idempotency.derive_key v2", strlen("idempotency.derive_key v2"));
		mac_field(ctx, seed_data + 1, seed_len - 1);
		mac_field(ctx, (const char *) when, sizeof(when));
	}
	mac_field(ctx, id.scope, id.scope_len);
	mac_field(ctx, id.key, id.key_len);
	mac_field(ctx, VARDATA_ANY(step), VARSIZE_ANY_EXHDR(step));
	if (pg_hmac_final(ctx, mac, sizeof(mac)) < 0)
		elog(ERROR, "could not compute HMAC-SHA256: %s", pg_hmac_error(ctx));
	pg_hmac_free(ctx);
	explicit_bzero(secret, sizeof(secret));

	/* base32 of the first 128 bits: 26 characters */
	strcpy(out, DERIVE_PREFIX);
	p = out + strlen(DERIVE_PREFIX);
	for (int i = 0; i < DERIVE_BITS_BYTES; i++)
	{
		acc = (acc << 8) | mac[i];
		bits += 8;
		while (bits >= 5)
		{
			*p++ = alphabet[(acc >> (bits - 5)) & 31];
			bits -= 5;
		}
	}
	if (bits > 0)
		*p++ = alphabet[(acc << (5 - bits)) & 31];
	*p = '\0';
	PG_RETURN_TEXT_P(cstring_to_text(out));
}
