/*
 * Phases: a request that calls other systems, run as named phases under one
 * idempotency key in lease mode, resumable after a crash (recovery points,
 * idempotency.checkpoint()), on a JDBC DataSource.  The semantics of the
 * Node client's runPhases (clients/node/lib/phases.js):
 *
 *   begin(key, request, scope, ttl, lease)     autocommit: commits the lease
 *     replay -> the stored response; nothing runs
 *     new    -> every phase runs
 *     retry  -> the phases up to recovery_point are skipped; state comes back
 *   for each phase still to run (a connection from the DataSource each):
 *     BEGIN; result = phase.run(ctx); checkpoint(key, name, state, attempt)
 *     COMMIT                                    (the phase's writes and its
 *                                                point commit together)
 *     an external phase runs with no connection (no transaction held open
 *     during a slow call) and checkpoints in autocommit after it
 *   the last phase completes the key instead of checkpointing:
 *     complete(key, respond(state), scope, attempt)
 *
 * State: an insertion-ordered Map; each phase's result (JSON-able: Map,
 * List, String, Number, Boolean, null; see Json) is stored under its name and
 * comes back on a retry exactly as it reads after a JSON round trip.
 * ctx.deriveKey(step) is idempotency.derive_key(key, step, scope): the same
 * on every attempt.  While phases run, a daemon thread renews the lease
 * every renewEvery (idempotency.renew) on a connection of its own; when the
 * key was taken over (IK004) ctx.takenOver() turns true, no further phase
 * starts (TakenOverException) and the next checkpoint is refused (IK004).
 * A phase that throws rolls its transaction back and the key is failed
 * retryably (fail(retryable => true)): a resend resumes after the last
 * checkpoint.  PhaseError.permanent(...) ends the request for good
 * (fail(retryable => false)): stored and replayed.
 *
 * serve(...) is the same behind an HTTP endpoint, with the guard's HTTP
 * rules (the servlet filter's phased routes use it).
 *
 * Every value is a bind parameter; no SQL is built from values.
 */
package org.idempotency;

import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.Consumer;
import java.util.function.Function;
import java.util.function.IntPredicate;
import javax.sql.DataSource;

public final class Phases {
	private Phases() {}

	private static final String BEGIN_SQL = "SELECT outcome, status, response::text, attempts, recovery_point,"
		+ " recovery_state::text FROM idempotency.begin(?, ?::jsonb, ?, ?::interval, ?::interval)";
	private static final String CHECKPOINT_SQL = "SELECT idempotency.checkpoint(?, ?, ?::jsonb, ?, ?)";
	private static final String COMPLETE_SQL = "SELECT idempotency.complete(?, ?::jsonb, ?, ?)";
	private static final String FAIL_SQL = "SELECT idempotency.fail(?, ?::jsonb, ?, ?, ?)";
	private static final String RENEW_SQL = "SELECT idempotency.renew(?, ?::interval, ?, ?)";
	private static final String DERIVE_SQL = "SELECT idempotency.derive_key(?, ?, ?)";

	/** A phase's failure.  A permanent one ends the request for good: the key is failed with
	 *  retryable => false and its answer (under serve: `answer`, by default 400
	 *  {"error": message}) is stored and replayed. */
	public static class PhaseError extends RuntimeException {
		private static final long serialVersionUID = 1L;
		public final boolean permanent;
		/** The HTTP answer of a permanent error under serve (and the servlet filter). */
		public final transient Idempotency.Response answer;

		/** A retryable failure: a resend resumes after the last checkpoint. */
		public PhaseError(String message) { this(message, null, false, null); }

		public PhaseError(String message, Throwable cause) { this(message, cause, false, null); }

		public PhaseError(String message, Throwable cause, boolean permanent, Idempotency.Response answer) {
			super(message, cause);
			this.permanent = permanent;
			this.answer = answer != null ? answer : errorAnswer(400, message);
		}

		/** A permanent failure answered 400 {"error": message} (the Node and Python clients' default). */
		public static PhaseError permanent(String message) { return permanent(message, 400); }

		/** A permanent failure answered `status` {"error": message} (application/json). */
		public static PhaseError permanent(String message, int status) {
			return new PhaseError(message, null, true, errorAnswer(status, message));
		}

		/** A permanent failure answered `answer`. */
		public static PhaseError permanent(String message, Idempotency.Response answer) {
			return new PhaseError(message, null, true, answer);
		}

		private static Idempotency.Response errorAnswer(int status, String message) {
			return Idempotency.Response.of(status, "application/json", "{\"error\":" + Idempotency.json(message) + "}");
		}
	}

	/** The lease was found taken over by another attempt (IK004 from renew()) before a phase
	 *  started: this attempt stops; the new one owns the key. */
	public static class TakenOverException extends RuntimeException {
		private static final long serialVersionUID = 1L;

		public TakenOverException() { super("the key was taken over by another attempt (IK004)"); }
	}

	/** A phase's work. */
	@FunctionalInterface
	public interface Step {
		/** Returns the phase's result (JSON-able), kept in state under the phase's name. */
		Object run(Context ctx) throws Exception;
	}

	/** The answer built from the phases' results, in the last phase's transaction. */
	@FunctionalInterface
	public interface Responder {
		/** Phases.run: anything JSON-able, stored by complete(); serve: an Idempotency.Response. */
		Object respond(Map<String, Object> state) throws Exception;
	}

	/** One phase: a name (unique), whether it is external, its work. */
	public static final class Phase {
		public final String name;
		public final boolean external;
		public final Step step;

		public Phase(String name, boolean external, Step step) {
			if (name == null || name.isEmpty()) throw new IllegalArgumentException("phase names must be non-empty");
			if (step == null) throw new IllegalArgumentException("phase " + name + ": no work");
			this.name = name;
			this.external = external;
			this.step = step;
		}
	}

	/** The phases in order and the answer: plan.phase(...).external(...).phase(...).respond(...). */
	public static final class Plan {
		final List<Phase> phases = new ArrayList<>();
		Responder responder;

		/** A database phase: its own transaction on a connection of the DataSource
		 *  (ctx.connection()); its writes commit with its checkpoint. */
		public Plan phase(String name, Step step) { return add(new Phase(name, false, step)); }

		/** An external phase: no connection, no transaction open while it runs (a call to
		 *  another system); checkpointed in autocommit after it. */
		public Plan external(String name, Step step) { return add(new Phase(name, true, step)); }

		/** The answer from the state (see Responder). */
		public Plan respond(Responder r) {
			if (r == null) throw new IllegalArgumentException("respond: null");
			responder = r;
			return this;
		}

		public List<Phase> phases() { return Collections.unmodifiableList(phases); }

		public boolean isEmpty() { return phases.isEmpty() && responder == null; }

		private Plan add(Phase p) {
			for (Phase q : phases)
				if (q.name.equals(p.name)) throw new IllegalArgumentException("phase names must be unique: " + p.name);
			phases.add(p);
			return this;
		}
	}

	/** Settings of one run. */
	public static final class Options {
		/** The idempotency key (required). */
		public String key;
		public String scope = "";
		/** The request, JSON text, fingerprinted by begin() (IK001 if the key is reused with another). */
		public String request = null;
		/** How long an attempt holds the key between renewals; a crashed attempt is taken over after it. */
		public Duration lease = Duration.ofSeconds(30);
		/** How often the lease is renewed while phases run; null: lease / 3. */
		public Duration renewEvery = null;
		/** The key's lifetime; null: the server's idempotency.default_ttl. */
		public Duration ttl = null;
		/** The key's lifetime as interval text ("7 days"), used when ttl is null. */
		public String ttlInterval = null;
		/** What fail() stores for an error (default {"error": message}). */
		public Function<Throwable, Object> errorResponse = e -> Map.of("error", String.valueOf(e.getMessage()));
		/** Called after each commit: "(begin)", each phase's name, "(complete)" (tests). */
		public Consumer<String> afterCommit = name -> {};

		public Options key(String k) { key = k; return this; }
		public Options scope(String s) { scope = s == null ? "" : s; return this; }
		public Options request(String json) { request = json; return this; }
		public Options lease(Duration d) { lease = d; return this; }
		public Options renewEvery(Duration d) { renewEvery = d; return this; }
		public Options ttl(Duration d) { ttl = d; return this; }
		public Options ttlInterval(String interval) { ttlInterval = interval; return this; }
		public Options afterCommit(Consumer<String> c) { afterCommit = c; return this; }
	}

	/** What run returns: outcome ("new", "retry" or "replay"); response: what the Responder
	 *  gave, or on a replay the stored one (parsed JSON); status: begin()'s on a replay
	 *  ("completed" or "failed"); attempts; resumedFrom: the recovery point a retry began after. */
	public static final class Result {
		public final String outcome;
		public final Object response;
		public final String status;
		public final int attempts;
		public final String resumedFrom;

		Result(String outcome, Object response, String status, int attempts, String resumedFrom) {
			this.outcome = outcome;
			this.response = response;
			this.status = status;
			this.attempts = attempts;
			this.resumedFrom = resumedFrom;
		}
	}

	/** What a phase's work gets. */
	public static final class Context {
		private final Runner run;
		private final Connection conn;

		Context(Runner run, Connection conn) {
			this.run = run;
			this.conn = conn;
		}

		/** The phase's transaction (do not commit, roll back or close it); null for an external phase. */
		public Connection connection() { return conn; }

		/** The results of the phases before this one. */
		public Map<String, Object> state() { return Collections.unmodifiableMap(run.state); }

		/** The request JSON text given to begin(). */
		public String request() { return run.o.request; }

		public String key() { return run.o.key; }

		public String scope() { return run.o.scope; }

		/** begin()'s attempt number. */
		public int attempt() { return run.attempt; }

		/** "new" or "retry". */
		public String outcome() { return run.outcome; }

		/** idempotency.derive_key(key, step, scope): the Idempotency-Key to send another
		 *  system for `step`, the same on every attempt. */
		public String deriveKey(String step) throws SQLException { return run.deriveKey(step); }

		/** Whether the lease renewal found the key taken over (IK004): stop early. */
		public boolean takenOver() { return run.renewer != null && run.renewer.takenOver; }
	}

	/** Runs plan under o.key (see the class comment). */
	public static Result run(DataSource ds, Options o, Plan plan) throws Exception {
		return new Runner(ds, o, plan).run();
	}

	static String interval(Duration d) {
		return Math.max(1, d.toMillis()) + " milliseconds";
	}

	static String sqlState(Throwable e) {
		for (int i = 0; e != null && i < 8; i++, e = e.getCause())
			if (e instanceof SQLException && ((SQLException) e).getSQLState() != null)
				return ((SQLException) e).getSQLState();
		return null;
	}

	private static final class Runner {
		final DataSource ds;
		final Options o;
		final Plan plan;
		final Map<String, String> derived = new HashMap<>();
		Map<String, Object> state = new LinkedHashMap<>();
		int attempt;
		String outcome;
		Renewer renewer;

		Runner(DataSource ds, Options o, Plan plan) {
			if (ds == null) throw new IllegalArgumentException("Phases.run: a DataSource is required");
			if (o == null || o.key == null || o.key.isEmpty()) throw new IllegalArgumentException("Phases.run: a key is required");
			if (o.lease == null || o.lease.isNegative() || o.lease.isZero())
				throw new IllegalArgumentException("Phases.run: lease must be a positive Duration");
			if (o.renewEvery != null && (o.renewEvery.isNegative() || o.renewEvery.isZero()))
				throw new IllegalArgumentException("Phases.run: renewEvery must be a positive Duration or null");
			if (o.ttl != null && (o.ttl.isNegative() || o.ttl.isZero()))
				throw new IllegalArgumentException("Phases.run: ttl must be a positive Duration or null");
			if (plan == null || plan.phases.isEmpty()) throw new IllegalArgumentException("Phases.run: no phases");
			if (plan.responder == null) throw new IllegalArgumentException("Phases.run: no respond(...)");
			this.ds = ds;
			this.o = o;
			this.plan = plan;
		}

		Result run() throws Exception {
			String lease = interval(o.lease);
			String point, saved;
			try (Connection c = checked(autocommit()); PreparedStatement ps = c.prepareStatement(BEGIN_SQL)) {
				ps.setString(1, o.key);
				ps.setString(2, o.request);
				ps.setString(3, o.scope);
				ps.setString(4, o.ttl != null ? interval(o.ttl) : o.ttlInterval);
				ps.setString(5, lease);
				try (ResultSet rs = ps.executeQuery()) {
					rs.next();
					outcome = rs.getString(1);
					attempt = rs.getInt(4);
					point = rs.getString(5);
					saved = rs.getString(6);
					if ("replay".equals(outcome)) {
						String stored = rs.getString(3);
						return new Result("replay", stored == null ? null : Json.parse(stored), rs.getString(2), attempt, point);
					}
				}
			}
			o.afterCommit.accept("(begin)");
			int start = 0;
			if ("retry".equals(outcome) && point != null) {
				int i = 0;
				while (i < plan.phases.size() && !plan.phases.get(i).name.equals(point)) i++;
				if (i == plan.phases.size())
					throw new PhaseError("recovery point \"" + point + "\" is not one of the phases");
				start = i + 1;
				Object s = saved == null ? null : Json.parse(saved);
				if (s instanceof Map) {
					for (Map.Entry<?, ?> e : ((Map<?, ?>) s).entrySet()) state.put(String.valueOf(e.getKey()), e.getValue());
				}
			}
			long every = o.renewEvery != null ? o.renewEvery.toMillis() : Math.max(50, o.lease.toMillis() / 3);
			renewer = new Renewer(this, lease, Math.max(1, every));
			renewer.start();
			try {
				Object out = start == plan.phases.size() ? finishResumed() : runFrom(start);
				return new Result(outcome, out, null, attempt, point);
			} catch (Exception e) {
				recordFailure(e);
				throw e;
			} finally {
				renewer.finish();
			}
		}

		private Object runFrom(int start) throws Exception {
			Object out = null;
			int n = plan.phases.size();
			for (int i = start; i < n; i++) {
				Phase p = plan.phases.get(i);
				boolean last = i == n - 1;
				if (renewer.takenOver) throw new TakenOverException();
				if (p.external) {
					keep(p, p.step.run(new Context(this, null)));
					try (Connection c = autocommit()) {
						if (last) {
							out = plan.responder.respond(Collections.unmodifiableMap(state));
							complete(c, out);
						} else {
							checkpoint(c, p.name);
						}
					}
				} else {
					try (Connection c = ds.getConnection()) {
						c.setAutoCommit(false);
						try {
							keep(p, p.step.run(new Context(this, c)));
							if (last) {
								out = plan.responder.respond(Collections.unmodifiableMap(state));
								complete(c, out);
							} else {
								checkpoint(c, p.name);
							}
							c.commit();
						} catch (Throwable t) {
							try { c.rollback(); } catch (SQLException ignored) { /* the phase's error is the one to see */ }
							throw t;
						} finally {
							try { c.setAutoCommit(true); } catch (SQLException ignored) { /* the pool closes it */ }
						}
					}
				}
				o.afterCommit.accept(last ? "(complete)" : p.name);
			}
			return out;
		}

		/** resumed after the last phase committed but before complete() */
		private Object finishResumed() throws Exception {
			Object out = plan.responder.respond(Collections.unmodifiableMap(state));
			try (Connection c = autocommit()) {
				complete(c, out);
			}
			o.afterCommit.accept("(complete)");
			return out;
		}

		/** the result as it comes back on a retry: through JSON */
		private void keep(Phase p, Object result) {
			Map<String, Object> s = new LinkedHashMap<>(state);
			s.put(p.name, Json.parse(Json.write(result)));
			state = s;
		}

		private void checkpoint(Connection c, String name) throws SQLException {
			try (PreparedStatement ps = c.prepareStatement(CHECKPOINT_SQL)) {
				ps.setString(1, o.key);
				ps.setString(2, name);
				ps.setString(3, Json.write(state));
				ps.setInt(4, attempt);
				ps.setString(5, o.scope);
				ps.executeQuery().close();
			}
		}

		private void complete(Connection c, Object out) throws SQLException {
			try (PreparedStatement ps = c.prepareStatement(COMPLETE_SQL)) {
				ps.setString(1, o.key);
				ps.setString(2, Json.write(out));
				ps.setString(3, o.scope);
				ps.setInt(4, attempt);
				ps.executeQuery().close();
			}
		}

		/** fail() the key, unless it was taken over (the new attempt owns it) */
		private void recordFailure(Exception e) {
			if (renewer.takenOver || e instanceof TakenOverException || "IK004".equals(sqlState(e))) return;
			boolean permanent = e instanceof PhaseError && ((PhaseError) e).permanent;
			try (Connection c = autocommit(); PreparedStatement ps = c.prepareStatement(FAIL_SQL)) {
				ps.setString(1, o.key);
				ps.setString(2, Json.write(o.errorResponse.apply(e)));
				ps.setString(3, o.scope);
				ps.setBoolean(4, !permanent);
				ps.setInt(5, attempt);
				ps.executeQuery().close();
			} catch (Exception ignored) {
				// the lease lapses and a resend retries: the original error is the one to report
			}
		}

		String deriveKey(String step) throws SQLException {
			String k = derived.get(step);
			if (k != null) return k;
			try (Connection c = autocommit(); PreparedStatement ps = c.prepareStatement(DERIVE_SQL)) {
				ps.setString(1, o.key);
				ps.setString(2, step);
				ps.setString(3, o.scope);
				try (ResultSet rs = ps.executeQuery()) {
					rs.next();
					k = rs.getString(1);
				}
			}
			derived.put(step, k);
			return k;
		}

		/** c, once the extension's version was checked on it (closed when refused) */
		Connection checked(Connection c) throws SQLException {
			try {
				Idempotency.checkExtension(c);
			} catch (SQLException e) {
				c.close();
				throw e;
			}
			return c;
		}

		Connection autocommit() throws SQLException {
			Connection c = ds.getConnection();
			try {
				if (!c.getAutoCommit()) c.setAutoCommit(true);
			} catch (SQLException e) {
				c.close();
				throw e;
			}
			return c;
		}
	}

	/** Renews the lease every `every` ms on a daemon thread until finished. */
	private static final class Renewer extends Thread {
		private final Runner run;
		private final String lease;
		private final long every;
		private boolean stopped;
		volatile boolean takenOver;

		Renewer(Runner run, String lease, long every) {
			super("idempotency-lease-renewal");
			setDaemon(true);
			this.run = run;
			this.lease = lease;
			this.every = every;
		}

		@Override
		public void run() {
			for (;;) {
				synchronized (this) {
					long deadline = System.nanoTime() + every * 1_000_000L;
					while (!stopped) {
						long left = (deadline - System.nanoTime()) / 1_000_000L;
						if (left <= 0) break;
						try { wait(left); } catch (InterruptedException e) { return; }
					}
					if (stopped) return;
				}
				try (Connection c = run.autocommit(); PreparedStatement ps = c.prepareStatement(RENEW_SQL)) {
					ps.setString(1, run.o.key);
					ps.setString(2, lease);
					ps.setInt(3, run.attempt);
					ps.setString(4, run.o.scope);
					ps.executeQuery().close();
				} catch (SQLException e) {
					if ("IK004".equals(e.getSQLState())) {
						takenOver = true;
						return;
					}
				}
			}
		}

		void finish() throws InterruptedException {
			synchronized (this) {
				stopped = true;
				notifyAll();
			}
			join();
		}
	}

	// ---- HTTP: serve ---------------------------------------------------------------------

	/** The HTTP settings of serve (the servlet filter passes its own). */
	public static final class Http {
		/** Whether an answer with this status is stored (Idempotency.defaultStore). */
		public IntPredicate store = Idempotency::defaultStore;
		/** Response headers stored and replayed besides the status and the body. */
		public List<String> headers = new ArrayList<>(List.of("Content-Type", "Location"));
		/** How often a 40001/40P01 starts the run again; then 503. */
		public int retries = 3;
		/** A larger answer is not stored: 500 "Response not storable". */
		public int maxResponseBytes = 1 << 20;
	}

	private static final class NotStored extends RuntimeException {
		private static final long serialVersionUID = 1L;
		final transient Idempotency.Response answer;

		NotStored(Idempotency.Response answer) {
			super("status " + answer.status + " is not stored", null, false, false);
			this.answer = answer;
		}
	}

	private static final class Unstorable extends RuntimeException {
		private static final long serialVersionUID = 1L;

		Unstorable(String message) { super(message); }
	}

	/**
	 * Runs plan behind an HTTP endpoint with the guard's rules and returns the answer to send
	 * (o.key, o.scope and o.request set by the caller: the parsed Idempotency-Key, the route's
	 * scope, Idempotency.requestJson(...)).  The Responder returns an Idempotency.Response.
	 * A replay comes back with replayed = true; IK001 422, IK002 409 + Retry-After, IK003 400;
	 * a status `store` refuses is answered and not stored (the key failed retryably); a
	 * permanent PhaseError is its answer, stored; taken over (IK004) 409 + Retry-After; any
	 * other exception propagates (the container's 500), the key failed retryably.
	 */
	public static Idempotency.Response serve(DataSource ds, Options o, Http h, Plan plan) throws Exception {
		if (plan == null || plan.phases.isEmpty() || plan.responder == null)
			throw new IllegalStateException("a phased route must declare its phases and respond(...)");
		Responder app = plan.responder;
		Idempotency.Response[] sent = new Idempotency.Response[1];
		Plan wrapped = new Plan();
		wrapped.phases.addAll(plan.phases);
		wrapped.responder = state -> {
			Object r = app.respond(state);
			if (!(r instanceof Idempotency.Response))
				throw new IllegalStateException("a phased route's respond(...) must return an Idempotency.Response");
			Idempotency.Response a = (Idempotency.Response) r;
			sent[0] = a;
			if (!h.store.test(a.status)) throw new NotStored(a);
			if (a.body.length > h.maxResponseBytes)
				throw new Unstorable("the response body has " + a.body.length + " bytes, more than maxResponseBytes ("
					+ h.maxResponseBytes + "): it cannot be stored for replay");
			return encode(a, h.headers);
		};
		Function<Throwable, Object> stored = e -> e instanceof PhaseError && ((PhaseError) e).permanent
			? encode(((PhaseError) e).answer, h.headers) : Map.of("error", String.valueOf(e.getMessage()));
		Options run = copy(o);
		run.errorResponse = stored;
		for (int tries = 0; ; tries++) {
			try {
				Result r = Phases.run(ds, run, wrapped);
				if ("replay".equals(r.outcome)) return decode(r.response, r.status);
				return sent[0];
			} catch (NotStored e) {
				return e.answer;
			} catch (PhaseError e) {
				if (!e.permanent) throw e;
				return e.answer;
			} catch (Unstorable e) {
				return Idempotency.problem(500, "Response not storable", e.getMessage());
			} catch (TakenOverException e) {
				return takenOver(ds, o);
			} catch (Exception e) {
				String state = sqlState(e);
				if (state == null) throw e;
				switch (state) {
				case "IK004":
					return takenOver(ds, o);
				case "40001":
				case "40P01":
					if (tries < h.retries) {
						Thread.sleep(5L * (tries + 1) + ThreadLocalRandom.current().nextInt(20));
						continue;
					}
					return Idempotency.problem(503, "Try again", e.getMessage()).header("Retry-After", "1");
				case "IK001":
					return Idempotency.problem(422, "Idempotency-Key reused",
						"This Idempotency-Key was used with a different request.");
				case "IK002":
					return Idempotency.problem(409, "Idempotency-Key in use",
						"A request with this Idempotency-Key is being processed; retry later.")
						.header("Retry-After", retryAfter(ds, o));
				case "IK003":
					return Idempotency.problem(400, "Invalid Idempotency-Key", e.getMessage());
				default:
					throw e;
				}
			}
		}
	}

	private static Options copy(Options o) {
		Options c = new Options().key(o.key).scope(o.scope).request(o.request).lease(o.lease)
			.renewEvery(o.renewEvery).ttl(o.ttl).ttlInterval(o.ttlInterval).afterCommit(o.afterCommit);
		c.errorResponse = o.errorResponse;
		return c;
	}

	private static Idempotency.Response takenOver(DataSource ds, Options o) {
		return Idempotency.problem(409, "Idempotency-Key in use",
			"Another attempt took this Idempotency-Key over; retry later.").header("Retry-After", retryAfter(ds, o));
	}

	private static String retryAfter(DataSource ds, Options o) {
		try (Connection c = ds.getConnection()) {
			return Idempotency.retryAfter(c, o.key, o.scope);
		} catch (SQLException e) {
			return "1";
		}
	}

	/** The stored form of an answer: {"status", "headers", "body" or "body_base64"}. */
	static Map<String, Object> encode(Idempotency.Response a, List<String> names) {
		Map<String, Object> m = new LinkedHashMap<>();
		m.put("status", a.status);
		Map<String, Object> hs = new LinkedHashMap<>();
		Set<String> seen = new HashSet<>();
		for (String n : names) {
			String v = a.headers.get(n);
			if (v != null && seen.add(n.toLowerCase(java.util.Locale.ROOT))) hs.put(n, v);
		}
		m.put("headers", hs);
		String text = Idempotency.utf8(a.body);
		if (text != null) m.put("body", text);
		else m.put("body_base64", Base64.getEncoder().encodeToString(a.body));
		return m;
	}

	/** A stored answer as the Response to replay (replayed = true). */
	static Idempotency.Response decode(Object stored, String status) {
		Idempotency.Response r;
		if (stored instanceof Map && ((Map<?, ?>) stored).get("status") instanceof Long) {
			Map<?, ?> m = (Map<?, ?>) stored;
			Object body = m.get("body"), b64 = m.get("body_base64");
			r = new Idempotency.Response(((Long) m.get("status")).intValue(), body instanceof String
				? ((String) body).getBytes(StandardCharsets.UTF_8)
				: Base64.getDecoder().decode(b64 instanceof String ? (String) b64 : ""));
			if (m.get("headers") instanceof Map)
				for (Map.Entry<?, ?> e : ((Map<?, ?>) m.get("headers")).entrySet())
					r.header(String.valueOf(e.getKey()), String.valueOf(e.getValue()));
		} else {
			r = Idempotency.Response.of("failed".equals(status) ? 500 : 200, "application/json", Json.write(stored));
		}
		r.replayed = true;
		return r;
	}
}
