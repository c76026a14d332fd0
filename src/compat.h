/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  Every difference between the PostgreSQL majors the extension builds
 *	  against, in one place.  The .c files use the names below and never
 *	  test PG_VERSION_NUM themselves.
 *
 * Majors: 15, 17 and 18 are built with -Wall -Wextra -Werror and every
 * suite runs on them.  16 is untested (no Debian suite ships it): the
 * thresholds at 160000 are taken from the server's source, and every
 * branch a 16 build takes is one that 15 or 17 compiles.  13 and 14 are
 * not supported.
 *
 * The minor-release ABI trap: 15.9, 16.5 and 17.1 added a field to
 * ResultRelInfo, and an extension that allocated one with its own sizeof
 * overwrote memory.  So executor nodes are allocated by the server, never
 * by us (IDEM_NEW_RESULT_REL below), and the server structs we size or
 * whose fields we read are listed in src/README.md, "PostgreSQL versions
 * and the server's structs", so that a minor release's change is checked
 * against them.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_COMPAT_H
#define IDEMPOTENCY_COMPAT_H

#if PG_VERSION_NUM < 150000
#error "idempotency needs PostgreSQL 15 or later (tested: 15, 17, 18)"
#endif

#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "access/table.h"
#include "common/base64.h"
#include "common/cryptohash.h"
#include "common/sha2.h"
#include "executor/executor.h"
#include "nodes/pg_list.h"
#include "storage/proc.h"
#include "utils/guc.h"
#include "utils/guc_tables.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/tuplestore.h"
#include "utils/wait_event.h"

#if PG_VERSION_NUM >= 170000
#include "storage/procarray.h"
#else
#include "storage/sinvaladt.h"
#endif

/* ---------------------------------------------------------------------
 * sha256 (pg_cryptohash; the same on every supported major)
 * ---------------------------------------------------------------------
 */
typedef struct IdemSha256
{
	pg_cryptohash_ctx *ctx;
} IdemSha256;

static inline void
idem_sha256_init(IdemSha256 *st)
{
	st->ctx = pg_cryptohash_create(PG_SHA256);
	if (pg_cryptohash_init(st->ctx) < 0)
		elog(ERROR, "could not initialize sha256 context");
}

static inline void
idem_sha256_update(IdemSha256 *st, const void *data, size_t len)
{
	if (pg_cryptohash_update(st->ctx, (const uint8 *) data, len) < 0)
		elog(ERROR, "could not update sha256 context");
}

/* out has PG_SHA256_DIGEST_LENGTH (32) bytes */
static inline void
idem_sha256_final(IdemSha256 *st, uint8 *out)
{
	if (pg_cryptohash_final(st->ctx, out, PG_SHA256_DIGEST_LENGTH) < 0)
		elog(ERROR, "could not finalize sha256 context");
	pg_cryptohash_free(st->ctx);
}

/* ---------------------------------------------------------------------
 * the PGPROC of a virtual transaction's backend: ProcNumber since 17
 * (storage/procarray.h), BackendId before (storage/sinvaladt.h)
 * ---------------------------------------------------------------------
 */
#if PG_VERSION_NUM >= 170000
#define IDEM_VXID_PROC(vxid) ProcNumberGetProc((vxid).procNumber)
#else
#define IDEM_VXID_PROC(vxid) BackendIdGetProc((vxid).backendId)
#endif

/* ---------------------------------------------------------------------
 * this backend's local transaction id (inside vxid since 17)
 * ---------------------------------------------------------------------
 */
#if PG_VERSION_NUM >= 170000
#define IDEM_MY_LXID (MyProc->vxid.lxid)
#else
#define IDEM_MY_LXID (MyProc->lxid)
#endif

/* ---------------------------------------------------------------------
 * executor: a ResultRelInfo for rel (locked by the caller), allocated and
 * initialised by the server (makeNode + InitResultRelInfo inside
 * ExecGetTriggerResultRel, so its sizeof is the running server's: see the
 * ABI trap above), with no range-table entry (index 0, as core's own
 * trigger and partition-routing targets have).  The relation is opened
 * once more (NoLock); IDEM_FREE_RESULT_REL closes its indexes and that
 * reference.  ExecCloseResultRelations() must not see it (it asserts that
 * such an entry has no open indexes): we never call it.
 * ---------------------------------------------------------------------
 */
#define IDEM_NEW_RESULT_REL(estate, rel) \
	ExecGetTriggerResultRel((estate), RelationGetRelid(rel), NULL)

static inline void
idem_free_result_rel(ResultRelInfo *rri)
{
	ExecCloseIndices(rri);
	table_close(rri->ri_RelationDesc, NoLock);
}

/* the executor's simple-relation insert (as logical replication apply) */
#define IDEM_SIMPLE_INSERT(rri, estate, slot) \
	ExecSimpleRelationInsert((rri), (estate), (slot))

/* ---------------------------------------------------------------------
 * relcache and index scans
 * ---------------------------------------------------------------------
 */

/*
 * The primary key index (InvalidOid if none).  18 returns a deferrable one
 * only when asked: as before 18, a deferrable primary key is none.
 */
#if PG_VERSION_NUM >= 180000
#define IDEM_PRIMARY_KEY_INDEX(rel) RelationGetPrimaryKeyIndex((rel), false)
#else
#define IDEM_PRIMARY_KEY_INDEX(rel) RelationGetPrimaryKeyIndex(rel)
#endif

/* an index scan; 18 takes instrumentation (none here) */
#if PG_VERSION_NUM >= 180000
#define IDEM_INDEX_BEGINSCAN(heap, index, snap, nkeys, norderbys) \
	index_beginscan((heap), (index), (snap), NULL, (nkeys), (norderbys))
#else
#define IDEM_INDEX_BEGINSCAN(heap, index, snap, nkeys, norderbys) \
	index_beginscan((heap), (index), (snap), (nkeys), (norderbys))
#endif

/* ---------------------------------------------------------------------
 * base64 of bytes: 18 takes them as uint8, before as char
 * ---------------------------------------------------------------------
 */
#if PG_VERSION_NUM >= 180000
#define IDEM_B64_ENCODE(src, len, dst, dstlen) \
	pg_b64_encode((const uint8 *) (src), (len), (dst), (dstlen))
#else
#define IDEM_B64_ENCODE(src, len, dst, dstlen) \
	pg_b64_encode((const char *) (src), (len), (dst), (dstlen))
#endif

/* MERGE's statement tag */
#define IDEM_IS_MERGE_TAG(tag) ((tag) == T_MergeStmt)

/* parse analysis with parameters of types the parser may resolve */
#define IDEM_PARSE_ANALYZE_VARPARAMS(rs, sql, types, ntypes) \
	parse_analyze_varparams((rs), (sql), (types), (ntypes), NULL)

/* set-returning functions in materialize mode */
static inline void
idem_init_materialized_srf(FunctionCallInfo fcinfo)
{
	InitMaterializedSRF(fcinfo, 0);
}

/* GUCs: no other library may take our prefix */
#define IDEM_RESERVE_GUC_PREFIX(prefix) MarkGUCPrefixReserved(prefix)

/* ---------------------------------------------------------------------
 * shared memory of a preloaded library: requested from shmem_request_hook
 * (which refuses requests made elsewhere).  idem_request_shmem(fn), called
 * from _PG_init, makes fn request it (RequestAddinShmemSpace,
 * RequestNamedLWLockTranche) at the right time, chaining any previous hook.
 * ---------------------------------------------------------------------
 */
typedef void (*IdemShmemRequestFn) (void);

static IdemShmemRequestFn idem_shmem_request_fn pg_attribute_unused() = NULL;
static shmem_request_hook_type idem_prev_shmem_request_hook pg_attribute_unused() = NULL;

static inline void
idem_shmem_request_chain(void)
{
	if (idem_prev_shmem_request_hook)
		idem_prev_shmem_request_hook();
	idem_shmem_request_fn();
}

static inline void
idem_request_shmem(IdemShmemRequestFn fn)
{
	idem_shmem_request_fn = fn;
	idem_prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = idem_shmem_request_chain;
}

/* ---------------------------------------------------------------------
 * the wait event a long wait of ours shows in pg_stat_activity: a named
 * one where the server has custom wait events (17), else "Extension"
 * ---------------------------------------------------------------------
 */
#if PG_VERSION_NUM >= 170000
static inline uint32
idem_wait_event(const char *name)
{
	return WaitEventExtensionNew(name);
}
#else
static inline uint32
idem_wait_event(const char *name pg_attribute_unused())
{
	return PG_WAIT_EXTENSION;
}
#endif

/* ---------------------------------------------------------------------
 * a database left half-dropped by an interrupted DROP DATABASE (marked by
 * datconnlimit since 15.4, 14.9, 13.12): nobody may connect to it
 * ---------------------------------------------------------------------
 */
#ifdef DATCONNLIMIT_INVALID_DB
#define IDEM_DATABASE_IS_INVALID(form) database_is_invalid_form(form)
#else
#define IDEM_DATABASE_IS_INVALID(form) false
#endif

/* ---------------------------------------------------------------------
 * Encoding conversion that stops at what it cannot convert
 * (pg_do_encoding_conversion_buf with noError), and the valid prefix of a
 * string (pg_encoding_verifymbstr): the same on every supported major.
 * dest has room for len * MAX_CONVERSION_GROWTH + 1 bytes; both return the
 * bytes of src taken.
 * ---------------------------------------------------------------------
 */
static inline int
idem_convert_prefix(Oid proc, int src_encoding, int dest_encoding,
					const char *src, int len, char *dest)
{
	return pg_do_encoding_conversion_buf(proc, src_encoding, dest_encoding,
										 (unsigned char *) src, len,
										 (unsigned char *) dest,
										 len * MAX_CONVERSION_GROWTH + 1, true);
}

static inline int
idem_valid_prefix(int encoding, const char *src, int len, char *dest)
{
	int			n = pg_encoding_verifymbstr(encoding, src, len);

	memcpy(dest, src, n);
	dest[n] = '\0';
	return n;
}

/* ---------------------------------------------------------------------
 * every setting (worker.c): 16 returns the count through an argument and
 * a copy of the array, 15 the array itself and GetNumConfigOptions()
 * ---------------------------------------------------------------------
 */
static inline struct config_generic **
idem_guc_variables(int *n)
{
#if PG_VERSION_NUM >= 160000
	return get_guc_variables(n);
#else
	*n = GetNumConfigOptions();
	return get_guc_variables();
#endif
}

#endif							/* IDEMPOTENCY_COMPAT_H */
