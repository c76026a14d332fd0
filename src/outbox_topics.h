/*-------------------------------------------------------------------------
 *
 * outbox_topics.h
 *	  The outbox's topics (outbox_topics.c): a topic and the caller's
 *	  rights on it, and what is drawn under a topic (a message key's lock,
 *	  a message's row id); and the argument checks every outbox function
 *	  shares, inline.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_TOPICS_H
#define OUTBOX_TOPICS_H

#include "fmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/snapshot.h"
#include "utils/timestamp.h"

#define TOPIC_MAX_LEN 40

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

/*
 * SQL: the role in col (a roleref column; a regrole in the update window)
 * exists.  A topic whose owner was dropped belongs to no role: the grants
 * its owner gave give nothing, and create_topic() takes its name over.
 */
#define OUTBOX_ROLE_EXISTS(col) \
	"EXISTS (SELECT FROM pg_catalog.pg_roles AS r" \
	" WHERE r.oid OPERATOR(pg_catalog.=) " col "::pg_catalog.oid)"

typedef enum TopicRight
{
	RIGHT_PUBLISH,
	RIGHT_CONSUME,
	RIGHT_OWN
} TopicRight;

extern void idem_outbox_topics_init(void);
extern bool idem_outbox_topic_lookup(const char *name, TopicRight right,
									 Topic *out, Snapshot snap,
									 bool missing_ok);
extern int64 idem_outbox_publish_topic(const char *name, text *topic,
									   text *key, Topic *out);
extern int64 idem_outbox_next_id(text *topic, text *key);

/* ---------------------------------------------------------------------
 * Argument checks (inline: each outbox function's own, no call)
 * ---------------------------------------------------------------------
 */

/* 22004 for a NULL argument that must not be NULL */
static inline void
idem_outbox_not_null(FunctionCallInfo fcinfo, int arg, const char *name)
{
	if (PG_ARGISNULL(arg))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name)));
}

/* the topic argument, validated: 1..40 of [A-Za-z0-9_.:-] (22023) */
static inline char *
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
static inline void
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

/* int8[] argument arg as a Datum, 22004 if NULL, 22023 if it has NULLs */
static inline Datum
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

#endif							/* OUTBOX_TOPICS_H */
