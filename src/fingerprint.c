/*-------------------------------------------------------------------------
 *
 * fingerprint.c
 *	  idempotency.fingerprint(jsonb): sha256 of a canonical encoding.
 *
 * Design: two jsonb values that are equal under jsonb's "=" must hash the
 * same.  jsonb already sorts object keys, drops duplicate keys and forgets
 * whitespace, so walking it with the jsonb iterator gives one order for
 * equal values.  The one thing it keeps that "=" ignores is the display
 * scale of numbers ({"a":1.0} = {"a":1}), so numbers are written through
 * numeric_normalize(), which drops insignificant zeroes.
 *
 * Every token is written as a one-byte tag and a 4-byte big-endian number
 * (element count of a container, byte length of a key, string or number,
 * followed by those bytes), so no two different token streams encode to the same bytes
 * (a key "a" followed by string "bc" differs from key "ab" and string "c").
 *
 * No locks, no shared state.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"

#include "compat.h"
#include "idempotency.h"

/* ---------------------------------------------------------------------
 * hashing helpers
 * ---------------------------------------------------------------------
 */
typedef struct FpState
{
	IdemSha256	sha;
} FpState;

static void
fp_bytes(FpState *st, const void *data, size_t len)
{
	idem_sha256_update(&st->sha, data, len);
}

/* a tag and a 4-byte big-endian number (a length or an element count) */
static void
fp_head(FpState *st, char tag, uint32 n)
{
	uint8		head[5];

	head[0] = (uint8) tag;
	head[1] = (uint8) (n >> 24);
	head[2] = (uint8) (n >> 16);
	head[3] = (uint8) (n >> 8);
	head[4] = (uint8) n;
	fp_bytes(st, head, sizeof(head));
}

/* a tag, the length of data, and data */
static void
fp_token(FpState *st, char tag, const char *data, uint32 len)
{
	fp_head(st, tag, len);
	if (len > 0)
		fp_bytes(st, data, len);
}

static void
fp_scalar(FpState *st, JsonbValue *v)
{
	switch (v->type)
	{
		case jbvNull:
			fp_head(st, 'z', 0);
			break;
		case jbvBool:
			fp_head(st, v->val.boolean ? 't' : 'f', 0);
			break;
		case jbvString:
			fp_token(st, 's', v->val.string.val, v->val.string.len);
			break;
		case jbvNumeric:
			{
				char	   *s = numeric_normalize(v->val.numeric);

				fp_token(st, 'n', s, strlen(s));
				pfree(s);
				break;
			}
		default:
			elog(ERROR, "unexpected jsonb value type %d", (int) v->type);
	}
}

/* ---------------------------------------------------------------------
 * idem_fingerprint: write the sha256 of jb's canonical encoding to out
 * ---------------------------------------------------------------------
 */
void
idem_fingerprint(Jsonb *jb, uint8 *out)
{
	FpState		st;
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;

	idem_sha256_init(&st.sha);

	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		switch (tok)
		{
			case WJB_BEGIN_ARRAY:
				fp_head(&st, v.val.array.rawScalar ? 'r' : '[',
						(uint32) v.val.array.nElems);
				break;
			case WJB_END_ARRAY:
				fp_head(&st, ']', 0);
				break;
			case WJB_BEGIN_OBJECT:
				fp_head(&st, '{', (uint32) v.val.object.nPairs);
				break;
			case WJB_END_OBJECT:
				fp_head(&st, '}', 0);
				break;
			case WJB_KEY:
				fp_token(&st, 'k', v.val.string.val, v.val.string.len);
				break;
			case WJB_VALUE:
			case WJB_ELEM:
				fp_scalar(&st, &v);
				break;
			default:
				elog(ERROR, "unexpected jsonb iterator token %d", (int) tok);
		}
	}

	idem_sha256_final(&st.sha, out);
}

/* ---------------------------------------------------------------------
 * SQL-callable
 * ---------------------------------------------------------------------
 */

/* fingerprint(jsonb) -> bytea: sha256 of the canonical encoding */
PG_FUNCTION_INFO_V1(idempotency_fingerprint);

Datum
idempotency_fingerprint(PG_FUNCTION_ARGS)
{
	Jsonb	   *jb = PG_GETARG_JSONB_P(0);
	bytea	   *result = (bytea *) palloc(VARHDRSZ + FINGERPRINT_LEN);

	SET_VARSIZE(result, VARHDRSZ + FINGERPRINT_LEN);
	idem_fingerprint(jb, (uint8 *) VARDATA(result));
	PG_FREE_IF_COPY(jb, 0);
	PG_RETURN_BYTEA_P(result);
}
