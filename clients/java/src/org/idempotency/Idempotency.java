/*
 * Idempotency: the guarded request on a JDBC connection, for the
 * idempotency PostgreSQL extension.
 *
 *   Idempotency.Response r = Idempotency.run(conn, key, requestJson, c -> {
 *       ... c.prepareStatement("INSERT ...") ...
 *       return Idempotency.Response.of(201, "application/json", body).header("Location", url);
 *   });
 *
 * One transaction on conn: set_config('idempotency.lock_wait', ..., true)
 * (SET LOCAL), begin(key, request, scope, ttl); a replay rolls back and
 * returns the stored response (replayed = true); new/retry runs the work on
 * conn, stores its response with complete() and commits.  A response that
 * Options.store refuses (by default 408, 409, 425, 429 and any 5xx) or an
 * exception rolls back (nothing stored: a resend runs again).
 * conn must be in autocommit mode on entry (as a pool hands it out): run()
 * owns the transaction, and would otherwise commit the caller's earlier,
 * uncommitted work with it, so it throws IllegalStateException instead.
 * 40001/40P01 re-run the whole transaction, work included (`retries`).
 * IK001, IK002 and IK003 come back as 422, 409 (with Retry-After) and 400
 * problem+json responses.  The connection is left in autocommit mode.
 *
 * Stored response (the extension's byte-exact replay convention):
 * {"status": 201, "headers": {...}, "body": "<exact text>"}, or
 * "body_base64" when the body is not valid UTF-8 or contains NUL.
 */
package org.idempotency;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.IntPredicate;

public final class Idempotency {
	private Idempotency() {}

	/** This library's version; it goes with the extension of the same version. */
	public static final String VERSION = "0.6.0";
	/**
	 * The oldest idempotency extension this library works with (its own
	 * major.minor, .0): run(), Phases.run() and the servlet filter ask the
	 * database once per JDBC URL and user (one query, on the first guarded
	 * request) and refuse an older extension with ExtensionVersionException;
	 * a refusal is not remembered, so after ALTER EXTENSION idempotency
	 * UPDATE the next request asks again and goes through.
	 */
	public static final String EXTENSION_MIN = "0.6.0";

	/** The database's idempotency extension is older than EXTENSION_MIN, or not installed (found null). */
	public static final class ExtensionVersionException extends SQLException {
		private static final long serialVersionUID = 1L;
		public final String found;
		public final String needed = EXTENSION_MIN;

		ExtensionVersionException(String found) {
			super("idempotency-jdbc " + VERSION + " needs the idempotency extension " + EXTENSION_MIN + " or newer; "
				+ (found == null ? "it is not installed in this database (CREATE EXTENSION idempotency, or psql -f of the portable edition)"
					: "this database has " + found + " (ALTER EXTENSION idempotency UPDATE; a plain install: the portable upgrade script)"));
			this.found = found;
		}
	}

	private static final ConcurrentHashMap<String, String> EXTENSION = new ConcurrentHashMap<>();
	private static final java.util.concurrent.atomic.AtomicLong VERSION_QUERIES = new java.util.concurrent.atomic.AtomicLong();

	/** How many version queries this JVM has sent (one per JDBC URL and user; the tests count them). */
	public static long versionQueries() {
		return VERSION_QUERIES.get();
	}

	static boolean older(String a, String b) {
		String[] x = a.split("\\."), y = b.split("\\.");
		for (int i = 0; i < Math.max(x.length, y.length); i++) {
			int p = i < x.length ? parse(x[i]) : 0, q = i < y.length ? parse(y[i]) : 0;
			if (p != q) return p < q;
		}
		return false;
	}

	private static int parse(String s) {
		try { return Integer.parseInt(s); } catch (NumberFormatException e) { return 0; }
	}

	/** the extension's version; a plain install of the portable edition (psql -f, no extension)
	 *  records it in the schema's comment instead */
	static final String VERSION_SQL = "SELECT COALESCE((SELECT e.extversion FROM pg_catalog.pg_extension AS e WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency'),"
		+ " (SELECT pg_catalog.substring(pg_catalog.obj_description(n.oid, 'pg_namespace'), '^idempotency ([0-9.]+) \\(portable edition\\)$')"
		+ " FROM pg_catalog.pg_namespace AS n WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency')) AS extversion";

	/** the extension's version on conn's database, asked the first time per URL and user only */
	static String checkExtension(Connection conn) throws SQLException {
		java.sql.DatabaseMetaData md = conn.getMetaData();
		String where = md.getURL() + " " + md.getUserName();
		String found = EXTENSION.get(where);
		if (found != null) return found;
		VERSION_QUERIES.incrementAndGet();
		try (java.sql.Statement st = conn.createStatement(); ResultSet rs = st.executeQuery(VERSION_SQL)) {
			found = rs.next() ? rs.getString(1) : null;
		}
		if (found == null || older(found, EXTENSION_MIN)) throw new ExtensionVersionException(found);
		EXTENSION.put(where, found);
		return found;
	}

	/** What to send: status, headers, exact body bytes; replayed when it was stored earlier. */
	public static final class Response {
		public final int status;
		public final Map<String, String> headers = new TreeMap<>(String.CASE_INSENSITIVE_ORDER);
		public final byte[] body;
		public boolean replayed;

		public Response(int status, byte[] body) {
			this.status = status;
			this.body = body == null ? new byte[0] : body;
		}

		public static Response of(int status, String contentType, String body) {
			return new Response(status, body.getBytes(StandardCharsets.UTF_8)).header("Content-Type", contentType);
		}

		public Response header(String name, String value) {
			headers.put(name, value);
			return this;
		}
	}

	/** The request's work, run on the guarded transaction's connection. */
	@FunctionalInterface
	public interface Work {
		Response run(Connection conn) throws Exception;
	}

	/** The default of Options.store: everything but 408, 409, 425, 429 and 5xx is stored
	 *  (Stripe's practice: those are not final, a resend runs again). */
	public static boolean defaultStore(int status) {
		return status < 500 && status != 408 && status != 409 && status != 425 && status != 429;
	}

	/** Settings; the defaults suit a pool (lock_wait 200 ms: see the README). */
	public static final class Options {
		public String scope = "";
		public int lockWaitMillis = 200;
		public int retries = 3;
		public String ttl = null;
		public List<String> headers = new ArrayList<>(List.of("Content-Type", "Location"));
		/** Whether a response with this status is stored (and replayed); else rolled back. */
		public IntPredicate store = Idempotency::defaultStore;

		public Options scope(String s) { scope = s; return this; }
		public Options lockWaitMillis(int ms) { lockWaitMillis = ms; return this; }
		/** How long begin() waits for a duplicate in flight (as Phases takes its durations). */
		public Options lockWait(java.time.Duration d) { lockWaitMillis = millis(d, "lockWait"); return this; }
		public Options retries(int n) { retries = n; return this; }
		/** The key's lifetime; null: the server's idempotency.default_ttl. */
		public Options ttl(java.time.Duration d) { ttl = d == null ? null : interval(d, "ttl"); return this; }
		/** The key's lifetime as interval text ("7 days"), as Phases.Options.ttlInterval. */
		public Options ttlInterval(String interval) { ttl = interval; return this; }
		/** @deprecated interval text: use ttl(Duration) or ttlInterval(String). */
		@Deprecated
		public Options ttl(String interval) { ttl = interval; return this; }
		public Options header(String name) { headers.add(name); return this; }
		public Options store(IntPredicate p) { store = p; return this; }
	}

	/** A Duration as a whole number of milliseconds for an int setting; negative or too long: refused. */
	static int millis(java.time.Duration d, String what) {
		if (d == null || d.isNegative() || d.toMillis() > Integer.MAX_VALUE)
			throw new IllegalArgumentException(what + ": a Duration from 0 to " + Integer.MAX_VALUE + " ms");
		return (int) d.toMillis();
	}

	/** A Duration as interval text ("N milliseconds"); negative: refused. */
	static String interval(java.time.Duration d, String what) {
		if (d.isNegative()) throw new IllegalArgumentException(what + ": a Duration >= 0");
		return d.toMillis() + " milliseconds";
	}

	private static final String BEGIN_SQL =
		"SELECT b.outcome, b.status, b.response::text,"
		+ " CASE WHEN jsonb_typeof(b.response->'status') = 'number' THEN (b.response->>'status')::int END,"
		+ " b.response->>'body', b.response->>'body_base64',"
		+ " (SELECT array_agg(h.key ORDER BY h.key) FROM jsonb_each_text(CASE WHEN"
		+ "   jsonb_typeof(b.response->'headers') = 'object' THEN b.response->'headers' END) h),"
		+ " (SELECT array_agg(h.value ORDER BY h.key) FROM jsonb_each_text(CASE WHEN"
		+ "   jsonb_typeof(b.response->'headers') = 'object' THEN b.response->'headers' END) h)"
		+ " FROM idempotency.begin(?, ?::jsonb, ?, ?::interval) b";
	private static final String COMPLETE_SQL =
		"SELECT idempotency.complete(?, jsonb_build_object('status', ?::int,"
		+ " 'headers', jsonb_object(?::text[], ?::text[]), ?::text, ?::text), ?)";
	private static final ConcurrentHashMap<String, Boolean> HAS_LOOKUP = new ConcurrentHashMap<>();

	public static Response run(Connection conn, String key, String requestJson, Work work) throws Exception {
		return run(conn, key, requestJson, new Options(), work);
	}

	public static Response run(Connection conn, String key, String requestJson, Options o, Work work)
			throws Exception {
		if (!conn.getAutoCommit())
			throw new IllegalStateException("Idempotency.run needs a connection in autocommit mode:"
				+ " it runs its own transaction and would commit the caller's uncommitted work;"
				+ " commit or roll back first, or call setAutoCommit(true)");
		conn.setAutoCommit(false);
		try {
			for (int attempt = 0; ; attempt++) {
				try {
					return once(conn, key, requestJson, o, work);
				} catch (SQLException e) {
					conn.rollback();
					String state = e.getSQLState();
					if ("40001".equals(state) || "40P01".equals(state)) {
						if (attempt < o.retries) {
							Thread.sleep(5L * (attempt + 1) + ThreadLocalRandom.current().nextInt(20));
							continue;
						}
						return problem(503, "Try again", e.getMessage()).header("Retry-After", "1");
					}
					if ("IK001".equals(state))
						return problem(422, "Idempotency-Key reused",
							"This Idempotency-Key was used with a different request.");
					if ("IK002".equals(state))
						return problem(409, "Idempotency-Key in use",
							"A request with this Idempotency-Key is being processed; retry later.")
							.header("Retry-After", retryAfter(conn, key, o.scope));
					if ("IK003".equals(state))
						return problem(400, "Invalid Idempotency-Key", e.getMessage());
					throw e;
				} catch (Exception e) {
					conn.rollback();
					throw e;
				}
			}
		} finally {
			conn.setAutoCommit(true);
		}
	}

	private static Response once(Connection conn, String key, String requestJson, Options o, Work work)
			throws Exception {
		checkExtension(conn);
		try (PreparedStatement ps = conn.prepareStatement("SELECT set_config('idempotency.lock_wait', ?, true)")) {
			ps.setString(1, Math.max(0, o.lockWaitMillis) + "ms");
			ps.executeQuery().close();
		}
		try (PreparedStatement ps = conn.prepareStatement(BEGIN_SQL)) {
			ps.setString(1, key);
			ps.setString(2, requestJson);
			ps.setString(3, o.scope);
			ps.setString(4, o.ttl);
			try (ResultSet rs = ps.executeQuery()) {
				rs.next();
				if ("replay".equals(rs.getString(1))) {
					Response r = decode(rs);
					conn.rollback();
					return r;
				}
			}
		}
		Response r = work.run(conn);
		if (!o.store.test(r.status)) {
			conn.rollback();
			return r;
		}
		List<String> names = new ArrayList<>(), values = new ArrayList<>();
		for (String n : o.headers) {
			String v = r.headers.get(n);
			if (v != null) { names.add(n); values.add(v); }
		}
		String text = utf8(r.body);
		try (PreparedStatement ps = conn.prepareStatement(COMPLETE_SQL)) {
			ps.setString(1, key);
			ps.setInt(2, r.status);
			ps.setArray(3, conn.createArrayOf("text", names.toArray()));
			ps.setArray(4, conn.createArrayOf("text", values.toArray()));
			ps.setString(5, text != null ? "body" : "body_base64");
			ps.setString(6, text != null ? text : Base64.getEncoder().encodeToString(r.body));
			ps.setString(7, o.scope);
			ps.executeQuery().close();
		}
		conn.commit();
		return r;
	}

	private static Response decode(ResultSet rs) throws SQLException {
		int status = rs.getInt(4);
		Response r;
		if (rs.wasNull()) {	// stored by other code, not in this shape: send it as JSON
			String json = rs.getString(3);
			r = Response.of("failed".equals(rs.getString(2)) ? 500 : 200, "application/json",
				json == null ? "null" : json);
		} else {
			String body = rs.getString(5), b64 = rs.getString(6);
			r = new Response(status, body != null ? body.getBytes(StandardCharsets.UTF_8)
				: Base64.getDecoder().decode(b64 == null ? "" : b64));
			java.sql.Array names = rs.getArray(7), values = rs.getArray(8);
			if (names != null) {
				String[] n = (String[]) names.getArray(), v = (String[]) values.getArray();
				for (int i = 0; i < n.length; i++) r.headers.put(n[i], v[i]);
			}
		}
		r.replayed = true;
		return r;
	}

	/** The body as text when it is valid UTF-8 without NUL, else null. */
	static String utf8(byte[] body) {
		try {
			String s = StandardCharsets.UTF_8.newDecoder()
				.onMalformedInput(CodingErrorAction.REPORT).onUnmappableCharacter(CodingErrorAction.REPORT)
				.decode(ByteBuffer.wrap(body)).toString();
			return s.indexOf('\0') >= 0 ? null : s;
		} catch (CharacterCodingException e) {
			return null;
		}
	}

	static String retryAfter(Connection conn, String key, String scope) {
		try {
			String url = conn.getMetaData().getURL();
			Boolean has = HAS_LOOKUP.get(url);
			if (has == null) {
				try (java.sql.Statement st = conn.createStatement(); ResultSet rs = st.executeQuery(
						"SELECT to_regprocedure('idempotency.lookup(text,text)') IS NOT NULL")) {
					rs.next();
					has = rs.getBoolean(1);
				}
				HAS_LOOKUP.put(url, has);
			}
			if (has) {
				try (PreparedStatement ps = conn.prepareStatement(
						"SELECT retry_after FROM idempotency.lookup(?, ?)")) {
					ps.setString(1, key);
					ps.setString(2, scope);
					try (ResultSet rs = ps.executeQuery()) {
						if (rs.next() && rs.getInt(1) > 0) return Integer.toString(rs.getInt(1));
					}
				}
			}
			conn.rollback();
		} catch (SQLException e) {
			try { conn.rollback(); } catch (SQLException ignored) { /* the caller sees the next error */ }
		}
		return "1";
	}

	/** Parses an Idempotency-Key header: a structured-field string ("abc") or bare (abc).
	 *  Returns null when there is none; IllegalArgumentException when malformed. */
	public static String parseKey(List<String> values) {
		if (values == null || values.isEmpty()) return null;
		if (values.size() > 1) throw new IllegalArgumentException("more than one Idempotency-Key header");
		String v = values.get(0).strip();
		if (v.isEmpty()) return null;
		if (v.charAt(0) != '"') return v;
		StringBuilder out = new StringBuilder();
		for (int i = 1; i < v.length(); i++) {
			char c = v.charAt(i);
			if (c == '\\') {
				if (++i >= v.length() || (v.charAt(i) != '"' && v.charAt(i) != '\\'))
					throw new IllegalArgumentException("bad escape in Idempotency-Key string");
				out.append(v.charAt(i));
			} else if (c == '"') {
				if (i != v.length() - 1) throw new IllegalArgumentException("text after the Idempotency-Key string");
				return out.toString();
			} else if (c < 0x20 || c > 0x7e) {
				throw new IllegalArgumentException("Idempotency-Key string must be printable ASCII");
			} else {
				out.append(c);
			}
		}
		throw new IllegalArgumentException("unterminated Idempotency-Key string");
	}

	/** The request fingerprinted by the web integrations (the servlet filter), the format of
	 *  the Node and Python clients, so a key is compatible across them:
	 *  {"method": M, "path": path and query, "body": the body's JSON value, null when empty,
	 *  else {"base64": its bytes}}.  Passed to begin() as jsonb, so spacing and key order
	 *  do not matter. */
	public static String requestJson(String method, String path, byte[] body) {
		String b;
		if (body == null || body.length == 0) {
			b = "null";
		} else {
			String text = utf8(body);
			b = text != null && isJson(text) ? text
				: "{\"base64\":\"" + Base64.getEncoder().encodeToString(body) + "\"}";
		}
		return "{\"method\":" + json(method) + ",\"path\":" + json(path) + ",\"body\":" + b + "}";
	}

	/** Whether text is one JSON value (RFC 8259) that PostgreSQL's jsonb accepts: no \\u0000,
	 *  no lone surrogate escape. */
	public static boolean isJson(String text) {
		JsonScan p = new JsonScan(text);
		try {
			p.value(0);
			p.space();
			return p.i == text.length();
		} catch (IllegalArgumentException | StringIndexOutOfBoundsException e) {
			return false;
		}
	}

	private static final class JsonScan {
		final String s;
		int i;

		JsonScan(String s) { this.s = s; }

		void space() {
			while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) i++;
		}

		void expect(String word) {
			if (!s.startsWith(word, i)) throw new IllegalArgumentException();
			i += word.length();
		}

		void value(int depth) {
			if (depth > 1000) throw new IllegalArgumentException();
			space();
			char c = s.charAt(i);
			if (c == '{' || c == '[') {
				char close = c == '{' ? '}' : ']';
				i++;
				space();
				if (s.charAt(i) == close) { i++; return; }
				for (;;) {
					if (c == '{') {
						space();
						if (s.charAt(i) != '"') throw new IllegalArgumentException();
						string();
						space();
						expect(":");
					}
					value(depth + 1);
					space();
					if (s.charAt(i) == close) { i++; return; }
					expect(",");
				}
			} else if (c == '"') {
				string();
			} else if (c == 't') {
				expect("true");
			} else if (c == 'f') {
				expect("false");
			} else if (c == 'n') {
				expect("null");
			} else {
				number();
			}
		}

		void string() {
			boolean high = false;	// the previous escape was a high surrogate
			for (i++; ; i++) {
				char c = s.charAt(i);
				if (c == '"' && !high) { i++; return; }
				if (c < 0x20) throw new IllegalArgumentException();
				if (c != '\\') {
					if (high) throw new IllegalArgumentException();
					continue;
				}
				char e = s.charAt(++i);
				if (e == 'u') {
					int u = Integer.parseInt(s.substring(i + 1, i + 5), 16);
					if (s.charAt(i + 1) == '+' || s.charAt(i + 1) == '-') throw new IllegalArgumentException();
					i += 4;
					boolean isHigh = u >= 0xd800 && u < 0xdc00, isLow = u >= 0xdc00 && u < 0xe000;
					if (u == 0 || isLow != high) throw new IllegalArgumentException();
					high = isHigh;
				} else if (high || "\"\\/bfnrt".indexOf(e) < 0) {
					throw new IllegalArgumentException();
				}
			}
		}

		void number() {
			int start = i;
			if (s.charAt(i) == '-') i++;
			if (s.charAt(i) == '0') i++;
			else digits();
			if (i < s.length() && s.charAt(i) == '.') { i++; digits(); }
			if (i < s.length() && (s.charAt(i) == 'e' || s.charAt(i) == 'E')) {
				i++;
				if (s.charAt(i) == '+' || s.charAt(i) == '-') i++;
				digits();
			}
			if (i == start) throw new IllegalArgumentException();
		}

		void digits() {
			int start = i;
			while (i < s.length() && s.charAt(i) >= '0' && s.charAt(i) <= '9') i++;
			if (i == start) throw new IllegalArgumentException();
		}
	}

	/** An RFC 9457 problem+json response. */
	public static Response problem(int status, String title, String detail) {
		return Response.of(status, "application/problem+json",
			"{\"title\":" + json(title) + ",\"status\":" + status + ",\"detail\":" + json(detail) + "}");
	}

	/** A JSON string literal. */
	public static String json(String s) {
		if (s == null) return "null";
		StringBuilder b = new StringBuilder("\"");
		for (char c : s.toCharArray()) {
			if (c == '"' || c == '\\') b.append('\\').append(c);
			else if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
			else b.append(c);
		}
		return b.append('"').toString();
	}
}
