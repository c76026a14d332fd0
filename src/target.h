/*-------------------------------------------------------------------------
 *
 * target.h
 *	  The write helpers' shared layer (target.c): the target table and its
 *	  columns from the catalog, the id argument converted exactly to the id
 *	  column's type, SQL fragments built from catalog facts, and the bounded
 *	  cache of prepared statements.  Used by machine.c, versioned.c and
 *	  insert_once.c; it calls nothing of theirs.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPOTENCY_TARGET_H
#define IDEMPOTENCY_TARGET_H

#include "postgres.h"

#include "executor/spi.h"
#include "fmgr.h"
#include "nodes/pg_list.h"
#include "utils/jsonb.h"

/* Most kept plan pairs per backend; the least recently used go first */
#define IDEM_HELPER_PLANS_MAX 256

/* The target table of a helper call, locked RowExclusiveLock */
typedef struct IdemTarget
{
	Oid			relid;
	char	   *qualname;		/* "schema"."table", quoted */
	char	   *relname;		/* for messages */
} IdemTarget;

/* One column of the target */
typedef struct IdemColumn
{
	const char *name;
	const char *quoted;
	AttrNumber	attnum;
	Oid			type;
	int32		typmod;
} IdemColumn;

/* The statements of one helper for one table and column set */
typedef struct IdemPlans
{
	SPIPlanPtr	work;			/* the statement that does the work */
	SPIPlanPtr	probe;			/* the one that finds out why it did not */
} IdemPlans;

/* Targets, columns, arguments */
extern IdemTarget idem_target_arg(FunctionCallInfo fcinfo, int argno);
extern IdemColumn idem_column(const IdemTarget *t, const char *name);
extern const char *idem_name_arg(FunctionCallInfo fcinfo, int argno,
								 const char *what);
extern List *idem_object_columns(const IdemTarget *t, Jsonb *jb,
								 const char *what);
extern Datum idem_id_value(FunctionCallInfo fcinfo, int argno,
						   const IdemColumn *idc);
extern char *idem_id_text(FunctionCallInfo fcinfo, int argno);
extern bool idem_is_integer_type(Oid type);
extern int64 idem_integer_datum(Datum d, Oid type);

/* SQL fragments */
extern char *idem_type_sql(Oid type, int32 typmod);
extern char *idem_operator_sql(Oid type, int which);
extern char *idem_record_sql(const char *base, const char *json);
extern Datum idem_null_row(const IdemTarget *t, Oid *rowtype);

/* Plans */
extern Datum idem_helper_call(PGFunction body, FunctionCallInfo fcinfo);
extern bool idem_plans_fetch(Oid relid, const char *sig, IdemPlans *out);
extern SPIPlanPtr idem_target_prepare(const char *sql, int nargs, Oid *argtypes);
extern void idem_plans_store(Oid relid, const char *sig, IdemPlans *plans);
extern void idem_update_hidden(FunctionCallInfo fcinfo, const IdemTarget *t,
							   const IdemColumn *idc, const char *what);
extern void idem_probe_row(SPIPlanPtr probe, Datum *values,
						   FunctionCallInfo fcinfo, const IdemTarget *t,
						   const IdemColumn *idc, const char *what);

#endif							/* IDEMPOTENCY_TARGET_H */
