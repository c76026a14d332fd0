/*
 * Phases (org.idempotency.Phases) on a DataSource against the database of
 * IdempotencyCheckTest (skipped without DATABASE_HOST): lease-mode begin, a
 * transaction per database phase with its checkpoint, an external phase
 * checkpointed in autocommit, the last phase completing the key, a crash
 * resumed after the last checkpoint once the lease lapsed, a permanent error
 * stored, a taken-over attempt refused (IK004), the lease renewed while a
 * phase runs, Json's round trip.
 */
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import org.idempotency.Json;
import org.idempotency.Phases;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.postgresql.ds.PGSimpleDataSource;

class PhasesCheckTest {
	static PGSimpleDataSource ds;
	static String p;

	/** A crash: an Error, so no failure is recorded (as when the process dies). */
	static final class Crash extends Error {
		private static final long serialVersionUID = 1L;
	}

	@BeforeAll
	static void setUp() throws Exception {
		assumeTrue(System.getenv("DATABASE_HOST") != null, "DATABASE_HOST is not set: no database to test against");
		ds = new PGSimpleDataSource();
		ds.setURL(IdempotencyCheck.url());
		p = "junit-phases-" + IdempotencyCheck.prefix();
		try (Connection c = ds.getConnection(); java.sql.Statement st = c.createStatement()) {
			st.execute("CREATE TABLE IF NOT EXISTS transfer_step (id bigserial PRIMARY KEY, idem_key text NOT NULL,"
				+ " step text NOT NULL)");
		}
	}

	static String value(String sql, String key) throws SQLException {
		try (Connection c = ds.getConnection(); PreparedStatement ps = c.prepareStatement(sql)) {
			ps.setString(1, key);
			try (ResultSet rs = ps.executeQuery()) { return rs.next() ? rs.getString(1) : null; }
		}
	}

	static String steps(String key) throws SQLException {
		return value("SELECT coalesce(string_agg(step, ',' ORDER BY id), '') FROM transfer_step WHERE idem_key = ?", key);
	}

	static String status(String key) throws SQLException {
		return value("SELECT status FROM idempotency.idempotency_key WHERE key = ?", key);
	}

	static void step(Phases.Context ctx, String step) throws SQLException {
		try (PreparedStatement ps = ctx.connection().prepareStatement(
				"INSERT INTO transfer_step (idem_key, step) VALUES (?, ?)")) {
			ps.setString(1, ctx.key());
			ps.setString(2, step);
			ps.executeUpdate();
		}
	}

	static Phases.Plan plan(List<String> calls, String failIn) {
		return new Phases.Plan().phase("debit", ctx -> {
			calls.add("debit");
			step(ctx, "debit");
			if ("debit".equals(failIn)) throw new IllegalStateException("debit failed");
			return Map.of("debited", "1.00");
		}).external("charge", ctx -> {
			calls.add("charge");
			if (ctx.connection() != null) throw new IllegalStateException("an external phase has a connection");
			return Map.of("charge_id", ctx.deriveKey("charge"),
				"debited", ((Map<?, ?>) ctx.state().get("debit")).get("debited"));
		}).phase("finish", ctx -> {
			calls.add("finish");
			step(ctx, "finish");
			if ("finish".equals(failIn)) throw new IllegalStateException("finish failed");
			return null;
		}).respond(state -> Map.of("charge", ((Map<?, ?>) state.get("charge")).get("charge_id")));
	}

	static Phases.Options opts(String key) {
		return new Phases.Options().key(key).scope("java-phases").request("{\"amount\":\"1.00\"}");
	}

	static String derived(String key) throws SQLException {
		return value("SELECT idempotency.derive_key(?, 'charge', 'java-phases')", key);
	}

	@Test
	void newThenReplay() throws Exception {
		String k = p + "new";
		List<String> calls = new ArrayList<>();
		Phases.Result r = Phases.run(ds, opts(k), plan(calls, null));
		assertEquals(List.of("debit", "charge", "finish"), calls);
		assertEquals("new", r.outcome);
		assertEquals(Map.of("charge", derived(k)), r.response);
		assertEquals("debit,finish", steps(k));
		assertEquals("completed", status(k));
		Phases.Result again = Phases.run(ds, opts(k), plan(calls, null));
		assertEquals("replay", again.outcome);
		assertEquals(Map.of("charge", derived(k)), again.response);
		assertEquals(3, calls.size());
	}

	@Test
	void errorFailsRetryablyAndTheResendResumes() throws Exception {
		String k = p + "retry";
		List<String> calls = new ArrayList<>();
		Exception e = assertThrows(IllegalStateException.class, () -> Phases.run(ds, opts(k), plan(calls, "finish")));
		assertEquals("finish failed", e.getMessage());
		assertEquals("debit", steps(k));	// finish's insert rolled back with its phase
		assertEquals("failed", status(k));
		calls.clear();
		Phases.Result r = Phases.run(ds, opts(k), plan(calls, null));
		assertEquals(List.of("retry", "charge", "2"), List.of(r.outcome, r.resumedFrom, String.valueOf(r.attempts)));
		assertEquals(List.of("finish"), calls);
		assertEquals("debit,finish", steps(k));
	}

	@Test
	void crashResumedAfterTheLeaseLapsesWithTheStateRestored() throws Exception {
		String k = p + "crash";
		List<String> calls = new ArrayList<>();
		assertThrows(Crash.class, () -> Phases.run(ds, opts(k).lease(Duration.ofMillis(400))
			.afterCommit(n -> { if (n.equals("charge")) throw new Crash(); }), plan(calls, null)));
		assertEquals("in_progress", status(k));
		SQLException busy = assertThrows(SQLException.class, () -> Phases.run(ds, opts(k), plan(new ArrayList<>(), null)));
		assertEquals("IK002", busy.getSQLState());
		Thread.sleep(500);
		calls.clear();
		Phases.Result r = Phases.run(ds, opts(k), plan(calls, null));
		assertEquals("retry", r.outcome);
		assertEquals("charge", r.resumedFrom);
		assertEquals(List.of("finish"), calls);
		assertEquals(Map.of("charge", derived(k)), r.response);	// the charge's result came back with the state
		assertEquals("debit,finish", steps(k));
	}

	@Test
	void permanentErrorStoredAndReplayed() throws Exception {
		String k = p + "perm";
		Phases.Plan declined = new Phases.Plan().phase("debit", ctx -> {
			step(ctx, "debit");
			throw Phases.PhaseError.permanent("card_declined");
		}).respond(state -> Map.of());
		assertThrows(Phases.PhaseError.class, () -> Phases.run(ds, opts(k), declined));
		assertEquals("", steps(k));
		assertEquals("failed", status(k));
		Phases.Result r = Phases.run(ds, opts(k), declined);
		assertEquals(List.of("replay", "failed"), List.of(r.outcome, r.status));
		assertEquals(Map.of("error", "card_declined"), r.response);
	}

	@Test
	void leaseRenewedWhileAPhaseRuns() throws Exception {
		String k = p + "renew";
		Phases.Plan slow = new Phases.Plan().phase("slow", ctx -> {
			try (PreparedStatement ps = ctx.connection().prepareStatement("SELECT pg_sleep(1.2)")) {
				ps.executeQuery().close();
			}
			return ctx.takenOver();
		}).respond(state -> state);
		CompletableFuture<Phases.Result> first = CompletableFuture.supplyAsync(() -> {
			try {
				return Phases.run(ds, opts(k).lease(Duration.ofMillis(400)).renewEvery(Duration.ofMillis(100)), slow);
			} catch (Exception e) {
				throw new RuntimeException(e);
			}
		});
		Thread.sleep(800);	// past the first lease: without renewals a begin() would take the key over
		SQLException busy = assertThrows(SQLException.class, () -> Phases.run(ds, opts(k), slow));
		assertEquals("IK002", busy.getSQLState());
		assertEquals(Map.of("slow", false), first.get().response);
	}

	@Test
	void takenOverAttemptIsRefusedIk004AndStoresNothing() throws Exception {
		String k = p + "zombie";
		boolean[] seen = new boolean[1];
		Phases.Plan zombie = new Phases.Plan().external("one", ctx -> {
			Thread.sleep(900);
			seen[0] = ctx.takenOver();
			return "zombie";
		}).phase("two", ctx -> "zombie").respond(state -> "zombie");
		CompletableFuture<Throwable> z = CompletableFuture.supplyAsync(() -> {
			try {
				Phases.run(ds, opts(k).lease(Duration.ofMillis(300)).renewEvery(Duration.ofMillis(600)), zombie);
				return null;
			} catch (Throwable t) {
				return t;
			}
		});
		Thread.sleep(450);	// the lease (300 ms) lapsed, no renewal yet (600 ms): taken over
		Phases.Result w = Phases.run(ds, opts(k), new Phases.Plan().phase("one", ctx -> 1).respond(state -> "winner"));
		assertEquals(List.of("retry", "2", "winner"), List.of(w.outcome, String.valueOf(w.attempts), w.response));
		Throwable t = z.get();
		assertTrue(t instanceof Phases.TakenOverException || (t instanceof SQLException
			&& "IK004".equals(((SQLException) t).getSQLState())), String.valueOf(t));
		assertTrue(seen[0], "the phase was told (ctx.takenOver()) after the renewal's IK004");
		assertEquals("\"winner\"", value("SELECT response::text FROM idempotency.idempotency_key WHERE key = ?", k));
	}

	@Test
	void badArguments() {
		assertThrows(IllegalArgumentException.class, () -> Phases.run(ds, opts("k"), new Phases.Plan().respond(s -> s)));
		assertThrows(IllegalArgumentException.class, () -> new Phases.Plan().phase("a", c -> 1).phase("a", c -> 2));
		assertThrows(IllegalArgumentException.class, () -> Phases.run(ds, opts("k").lease(Duration.ZERO),
			new Phases.Plan().phase("a", c -> 1).respond(s -> s)));
		assertThrows(IllegalArgumentException.class, () -> Phases.run(ds, opts(null),
			new Phases.Plan().phase("a", c -> 1).respond(s -> s)));
	}

	@Test
	void jsonRoundTrip() {
		String text = "{\"a\":[1,2.5,\"x\\\"\\u00e9\",true,false,null],\"b\":{\"c\":12345678901234567890},\"d\":-0.1}";
		assertEquals(text.replace("\\u00e9", "\u00e9"), Json.write(Json.parse(text)));
		assertThrows(IllegalArgumentException.class, () -> Json.parse("{\"a\":}"));
		assertThrows(IllegalArgumentException.class, () -> Json.parse("[1] x"));
		assertFalse(Json.parse("{}") == null);
	}
}
