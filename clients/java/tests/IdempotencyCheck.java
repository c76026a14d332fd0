/*
 * Checks of org.idempotency.Idempotency on JDBC, against the database
 * (DATABASE_HOST/PORT/NAME/USER, the `payment` table of test/clients/run).
 * Prints "ok - ..." / "not ok - ..." lines; exits 1 when one failed.
 * One static method per check; IdempotencyCheckTest runs the same methods
 * as JUnit tests (mvn package, test/packages/run).
 */
import java.lang.reflect.InvocationHandler;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Proxy;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.idempotency.Idempotency;
import org.idempotency.Idempotency.Response;

public class IdempotencyCheck {
	static int failed = 0;
	/** the descriptions (and diagnostics) of the checks that failed */
	static final List<String> failures = new ArrayList<>();

	static void check(String desc, boolean ok, Object diag) {
		if (!ok) {
			failed++;
			failures.add(desc + (diag != null ? ": " + diag : ""));
		}
		System.out.println((ok ? "ok" : "not ok") + " - [java units] " + desc);
		if (!ok && diag != null) System.out.println("# " + diag);
	}

	static long count(Connection c, String sql, String key) throws Exception {
		try (PreparedStatement ps = c.prepareStatement(sql)) {
			ps.setString(1, key);
			try (ResultSet rs = ps.executeQuery()) { rs.next(); return rs.getLong(1); }
		}
	}

	/** conn, its Statements and PreparedStatements recording whether each was closed. */
	static Connection tracking(Connection real, Set<Object> open) {
		InvocationHandler h = (proxy, m, args) -> {
			Object r;
			try { r = m.invoke(real, args); } catch (InvocationTargetException e) { throw e.getCause(); }
			if (r instanceof Statement) {
				Statement st = (Statement) r;
				Class<?> iface = r instanceof PreparedStatement ? PreparedStatement.class : Statement.class;
				Object[] self = new Object[1];
				self[0] = Proxy.newProxyInstance(IdempotencyCheck.class.getClassLoader(), new Class<?>[] { iface },
					(p2, m2, a2) -> {
						if (m2.getName().equals("close")) open.remove(self[0]);
						try { return m2.invoke(st, a2); } catch (InvocationTargetException e) { throw e.getCause(); }
					});
				open.add(self[0]);
				return self[0];
			}
			return r;
		};
		return (Connection) Proxy.newProxyInstance(IdempotencyCheck.class.getClassLoader(),
			new Class<?>[] { Connection.class }, h);
	}

	static String url() {
		Map<String, String> env = System.getenv();
		return "jdbc:postgresql://" + env.get("DATABASE_HOST") + ":" + env.get("DATABASE_PORT") + "/"
			+ env.get("DATABASE_NAME") + "?user=" + env.get("DATABASE_USER");
	}

	static String prefix() {
		return "java-" + ProcessHandle.current().pid() + "-" + System.nanoTime() % 100000 + "-";
	}

	public static void main(String[] args) throws Exception {
		String p = prefix();
		try (Connection conn = DriverManager.getConnection(url()); Connection other = DriverManager.getConnection(url())) {
			notAutocommit(conn, other, p);
			busyClosesStatements(conn, other, p);
			storeRule(conn, p);
			// (an extension's version: the portable edition installed by psql -f has none to update)
			if (!"portable".equals(System.getenv("IDEMPOTENCY_EDITION")))
				extensionVersion(conn);
		}
		System.exit(failed == 0 ? 0 : 1);
	}

	/** not in autocommit on entry: refused, the caller's work not committed */
	static void notAutocommit(Connection conn, Connection other, String p) throws Exception {
		String k = p + "notauto";
		conn.setAutoCommit(false);
		try (PreparedStatement ps = conn.prepareStatement("INSERT INTO payment (idem_key, amount) VALUES (?, 1)")) {
			ps.setString(1, k);
			ps.executeUpdate();
		}
		Object got;
		try {
			got = Idempotency.run(conn, k, "{}", c -> Response.of(201, "application/json", "{}"));
		} catch (IllegalStateException e) {
			got = e;
		}
		conn.rollback();
		conn.setAutoCommit(true);
		long rows = count(other, "SELECT count(*) FROM payment WHERE idem_key = ?", k);
		long keys = count(other, "SELECT count(*) FROM idempotency.idempotency_key WHERE key = ?", k);
		check("run() on a connection not in autocommit: IllegalStateException, the caller's earlier insert "
			+ "not committed", got instanceof IllegalStateException && rows == 0 && keys == 0,
			got + " rows=" + rows + " keys=" + keys);
	}

	/** 409 while in flight: every Statement it opened (retryAfter's too) closed */
	static void busyClosesStatements(Connection conn, Connection other, String p) throws Exception {
		String kb = p + "busy";
		other.setAutoCommit(false);
		try (PreparedStatement ps = other.prepareStatement("SELECT outcome FROM idempotency.begin(?, '{}'::jsonb, '')")) {
			ps.setString(1, kb);
			ps.executeQuery().close();
		}
		Set<Object> open = ConcurrentHashMap.newKeySet();
		Connection tracked = tracking(conn, open);
		Response r = Idempotency.run(tracked, kb, "{}", new Idempotency.Options().lockWaitMillis(0),
			c -> Response.of(201, "application/json", "{}"));
		other.rollback();
		other.setAutoCommit(true);
		check("409 while in flight (retryAfter ran): every Statement it opened is closed; autocommit on again",
			r.status == 409 && r.headers.get("Retry-After") != null && open.isEmpty() && conn.getAutoCommit(),
			"status=" + r.status + " open=" + open.size());
	}

	/** the stored-status rule and Options.store */
	static void storeRule(Connection conn, String p) throws Exception {
		String kt = p + "429";
		Response a = Idempotency.run(conn, kt, "{}", c -> Response.of(429, "application/json", "{}"));
		Response b = Idempotency.run(conn, kt, "{}", c -> Response.of(201, "application/json", "{}"));
		check("429 not stored: the resend runs and gets 201", a.status == 429 && b.status == 201 && !b.replayed,
			a.status + " " + b.status + " " + b.replayed);
		String ks = p + "store";
		Idempotency.Options all = new Idempotency.Options().store(s -> true);
		a = Idempotency.run(conn, ks, "{}", all, c -> Response.of(503, "application/json", "{}"));
		b = Idempotency.run(conn, ks, "{}", all, c -> Response.of(201, "application/json", "{}"));
		check("Options.store(s -> true) stores a 503, and it is replayed",
			a.status == 503 && b.status == 503 && b.replayed, a.status + " " + b.status + " " + b.replayed);
		// durations as Phases takes them: ttl(Duration), lockWait(Duration)
		String kd = p + "ttl-duration";
		Idempotency.Options hour = new Idempotency.Options().ttl(java.time.Duration.ofHours(1))
			.lockWait(java.time.Duration.ofMillis(150));
		Idempotency.run(conn, kd, "{}", hour, c -> Response.of(201, "application/json", "{}"));
		long secs = -1;
		try (java.sql.PreparedStatement ps = conn.prepareStatement(
				"SELECT extract(epoch FROM expires_at - created_at)::bigint FROM idempotency.idempotency_key WHERE key = ?")) {
			ps.setString(1, kd);
			try (java.sql.ResultSet rs = ps.executeQuery()) { if (rs.next()) secs = rs.getLong(1); }
		}
		check("Options.ttl(Duration.ofHours(1)): the key lives 3600 s; lockWait(Duration.ofMillis(150)): 150 ms",
			secs == 3600 && hour.lockWaitMillis == 150, secs + " " + hour.lockWaitMillis);
		boolean refused = false;
		try { new Idempotency.Options().ttl(java.time.Duration.ofSeconds(-1)); } catch (IllegalArgumentException e) { refused = true; }
		check("Options.ttl(a negative Duration): IllegalArgumentException", refused, refused);
	}

	/**
	 * The compatibility rule (docs/clients.md, "Versions") on a database of
	 * its own whose extension is 0.5.0, then updated: run() and Phases.run()
	 * refuse it with both versions in the message, nothing written; after
	 * ALTER EXTENSION UPDATE the next request goes through; the version is
	 * asked once per URL and user.
	 */
	static void extensionVersion(Connection admin) throws Exception {
		String db = "compat_java_" + ProcessHandle.current().pid();
		try (Statement st = admin.createStatement()) {
			st.execute("DROP DATABASE IF EXISTS " + db);
			st.execute("CREATE DATABASE " + db);
		}
		String url = url().replace("/" + System.getenv("DATABASE_NAME") + "?", "/" + db + "?");
		try (Connection c = DriverManager.getConnection(url)) {
			try (Statement st = c.createStatement()) {
				st.execute("CREATE EXTENSION idempotency VERSION '0.5.0'");
				st.execute("CREATE TABLE written (n int)");
			}
			String want = "idempotency-jdbc 0.6.0 needs the idempotency extension 0.6.0 or newer; "
				+ "this database has 0.5.0 (ALTER EXTENSION idempotency UPDATE; a plain install: the portable upgrade script)";
			Idempotency.Work work = w -> {
				try (Statement st = w.createStatement()) { st.execute("INSERT INTO written VALUES (1)"); }
				return Response.of(201, "application/json", "{}");
			};
			List<Object> got = new ArrayList<>();
			try { got.add(Idempotency.run(c, "k1", "{}", work)); } catch (Exception e) { got.add(e); }
			javax.sql.DataSource ds = dataSource(url);
			try {
				got.add(org.idempotency.Phases.run(ds, new org.idempotency.Phases.Options().key("k2"),
					new org.idempotency.Phases.Plan().phase("a", ctx -> 1).respond(s -> "{}")));
			} catch (Exception e) { got.add(e); }
			boolean refused = true;
			for (Object g : got) {
				refused &= g instanceof Idempotency.ExtensionVersionException && want.equals(((Exception) g).getMessage())
					&& "0.5.0".equals(((Idempotency.ExtensionVersionException) g).found)
					&& Idempotency.EXTENSION_MIN.equals(((Idempotency.ExtensionVersionException) g).needed);
			}
			long rows = count(c, "SELECT count(*) FROM written WHERE ? IS NOT NULL", "x");
			long keys = count(c, "SELECT count(*) FROM idempotency.idempotency_key WHERE ? IS NOT NULL", "x");
			check("an extension older than the client: run() and Phases.run() refuse it, nothing written: \"" + want + "\"",
				refused && rows == 0 && keys == 0 && Idempotency.VERSION.equals("0.6.0") && c.getAutoCommit(),
				got + " rows=" + rows + " keys=" + keys);
			try (Statement st = c.createStatement()) { st.execute("ALTER EXTENSION idempotency UPDATE"); }
			long before = Idempotency.versionQueries();
			List<Integer> statuses = new ArrayList<>();
			for (int i = 0; i < 11; i++) statuses.add(Idempotency.run(c, "after-" + i, "{}", work).status);
			long asked = Idempotency.versionQueries() - before;
			check("after ALTER EXTENSION UPDATE the next request goes through; 11 requests asked the version "
				+ asked + " time(s)", asked == 1 && statuses.stream().allMatch(s -> s == 201), statuses + " asked=" + asked);
		} finally {
			try (Statement st = admin.createStatement()) { st.execute("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)"); }
		}
	}

	/** a DataSource of DriverManager connections (no pool) */
	static javax.sql.DataSource dataSource(String url) {
		return (javax.sql.DataSource) Proxy.newProxyInstance(IdempotencyCheck.class.getClassLoader(),
			new Class<?>[] { javax.sql.DataSource.class }, (p, m, a) -> {
				if (m.getName().equals("getConnection")) return DriverManager.getConnection(url);
				throw new UnsupportedOperationException(m.getName());
			});
	}
}
