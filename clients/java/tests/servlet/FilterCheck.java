/*
 * Checks of the javax IdempotencyFilter in Debian's Jetty 9.4, over real
 * HTTP, against the database (DATABASE_HOST/PORT/NAME/USER, the `payment`
 * table of test/clients/run).  A test servlet at /t/<mode> inserts a payment
 * row on IdempotencyFilter.connection(request) and answers per mode; each
 * check looks at the HTTP answer and at what the database holds.  Prints
 * "ok - ..." / "not ok - ..." lines, exits 1 when one failed;
 * FilterCheckTest runs the same methods as JUnit tests (mvn package).
 */
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import javax.servlet.DispatcherType;
import javax.servlet.http.HttpServlet;
import javax.servlet.http.HttpServletRequest;
import javax.servlet.http.HttpServletResponse;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.servlet.FilterHolder;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;
import org.idempotency.Idempotency;
import org.idempotency.Json;
import org.idempotency.Phases;
import org.idempotency.servlet.javax.IdempotencyFilter;
import org.postgresql.ds.PGSimpleDataSource;

public class FilterCheck {
	static final List<String> failures = new ArrayList<>();
	static Server server;
	static int port;
	static final HttpClient http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();

	static void check(String desc, boolean ok, Object diag) {
		if (!ok) failures.add(desc + (diag != null ? ": " + diag : ""));
		System.out.println((ok ? "ok" : "not ok") + " - [servlet filter] " + desc);
		if (!ok && diag != null) System.out.println("# " + diag);
	}

	static String url() {
		Map<String, String> env = System.getenv();
		return "jdbc:postgresql://" + env.get("DATABASE_HOST") + ":" + env.get("DATABASE_PORT") + "/"
			+ env.get("DATABASE_NAME") + "?user=" + env.get("DATABASE_USER");
	}

	static String prefix() {
		return "servlet-" + ProcessHandle.current().pid() + "-" + System.nanoTime() % 100000 + "-";
	}

	/** The test servlet: a payment row on the guarded connection, then the mode's answer. */
	public static class Modes extends HttpServlet {
		private static final long serialVersionUID = 1L;

		@Override
		protected void doGet(HttpServletRequest req, HttpServletResponse res) throws IOException {
			String s;
			try {
				IdempotencyFilter.connection(req);
				s = "guarded";
			} catch (IllegalStateException e) {
				s = "unguarded";
			}
			res.getOutputStream().write(s.getBytes(StandardCharsets.UTF_8));
		}

		@Override
		protected void doPost(HttpServletRequest req, HttpServletResponse res) throws IOException {
			Connection c = IdempotencyFilter.connection(req);
			String mode = req.getPathInfo().substring(1);
			long id;
			try {
				if (mode.equals("commit")) {
					String state;
					try { c.commit(); state = "committed"; } catch (SQLException e) { state = e.getSQLState(); }
					res.getOutputStream().write(state.getBytes(StandardCharsets.UTF_8));
					return;
				}
				try (PreparedStatement ps = c.prepareStatement(
						"INSERT INTO payment (idem_key, amount) VALUES (?, 1) RETURNING id")) {
					ps.setString(1, IdempotencyFilter.key(req));
					try (ResultSet rs = ps.executeQuery()) { rs.next(); id = rs.getLong(1); }
				}
			} catch (SQLException e) {
				throw new IOException(e);
			}
			byte[] body = req.getInputStream().readAllBytes();	// the body, read again after the filter
			switch (mode) {
			case "boom": throw new IllegalStateException("boom");
			case "503": res.setStatus(503); res.getOutputStream().write("busy".getBytes(StandardCharsets.UTF_8)); return;
			case "429": res.setStatus(429); res.setHeader("Retry-After", "1"); return;
			case "flush": res.getOutputStream().write("part".getBytes(StandardCharsets.UTF_8)); res.flushBuffer(); return;
			case "big": res.getOutputStream().write(new byte[2 << 20]); return;
			case "async": req.startAsync(); return;
			case "form":
				res.setStatus(201);
				res.getOutputStream().write((req.getParameter("amount") + " " + String.join(",", req.getParameterValues("tag"))
					+ " " + req.getParameter("q")).getBytes(StandardCharsets.UTF_8));
				return;
			case "writer":
				res.setStatus(201);
				res.setContentType("text/plain;charset=UTF-8");
				res.getWriter().print("caf\u00e9 \u2713 " + id);
				return;
			default:
				res.setStatus(201);
				res.setContentType("application/json");
				res.setHeader("Location", "/payments/" + id);
				res.setHeader("X-Not-Stored", "1");
				res.getOutputStream().write(("{\"id\":" + id + ",\"echo\":" + new String(body, StandardCharsets.UTF_8) + "}")
					.getBytes(StandardCharsets.UTF_8));
			}
		}
	}

	/** A phased route (/ph/transfers): debit (a row), charge (external: the derived key),
	 *  finish (a row); body {"decline": true}, {"boom": true}, {"status": n}, {"sleep": s}. */
	public static class Transfers extends HttpServlet {
		private static final long serialVersionUID = 1L;

		@Override
		protected void doPost(HttpServletRequest req, HttpServletResponse res) throws IOException {
			Map<?, ?> p = (Map<?, ?>) Json.parse(new String(req.getInputStream().readAllBytes(), StandardCharsets.UTF_8));
			if (p.containsKey("bad")) {	// answered by the handler, no phases: sent, not stored
				res.setStatus(400);
				res.getOutputStream().write("bad".getBytes(StandardCharsets.UTF_8));
				return;
			}
			IdempotencyFilter.phases(req).phase("debit", ctx -> {
				if (Boolean.TRUE.equals(p.get("decline"))) throw Phases.PhaseError.permanent("card_declined", 402);
				if (Boolean.TRUE.equals(p.get("refuse"))) throw Phases.PhaseError.permanent("refused");
				step(ctx, "debit");
				if (p.get("sleep") != null) try (PreparedStatement ps = ctx.connection().prepareStatement("SELECT pg_sleep(?)")) {
					ps.setDouble(1, ((Number) p.get("sleep")).doubleValue());
					ps.executeQuery().close();
				}
				return Map.of("debited", p.get("amount"));
			}).external("charge", ctx -> Map.of("charge_id", ctx.deriveKey("charge"), "outside", ctx.connection() == null))
			.phase("finish", ctx -> {
				step(ctx, "finish");
				if (Boolean.TRUE.equals(p.get("boom"))) throw new IllegalStateException("boom");
				return ctx.outcome();
			}).respond(state -> p.get("status") != null
				? Idempotency.Response.of(((Number) p.get("status")).intValue(), "text/plain", "status " + p.get("status"))
				: Idempotency.Response.of(201, "application/json", Json.write(state)).header("Location", "/transfers/1"));
		}

		static void step(Phases.Context ctx, String step) throws SQLException {
			try (PreparedStatement ps = ctx.connection().prepareStatement(
					"INSERT INTO transfer_step (idem_key, step) VALUES (?, ?)")) {
				ps.setString(1, ctx.key());
				ps.setString(2, step);
				ps.executeUpdate();
			}
		}
	}

	static void start() throws Exception {
		PGSimpleDataSource ds = new PGSimpleDataSource();
		ds.setURL(url());
		server = new Server(new InetSocketAddress("127.0.0.1", 0));
		ServletContextHandler ctx = new ServletContextHandler();
		ctx.addServlet(new ServletHolder(new Modes()), "/t/*");
		ctx.addServlet(new ServletHolder(new Transfers()), "/ph/transfers");
		ctx.addFilter(new FilterHolder(new IdempotencyFilter(ds, new IdempotencyFilter.Options().scope("check-ph")
			.phased(java.time.Duration.ofSeconds(1)))), "/ph/transfers", EnumSet.of(DispatcherType.REQUEST));
		try (Connection c = ds.getConnection(); java.sql.Statement st = c.createStatement()) {
			st.execute("CREATE TABLE IF NOT EXISTS transfer_step (id bigserial PRIMARY KEY, idem_key text NOT NULL,"
				+ " step text NOT NULL)");
		}
		ctx.addFilter(new FilterHolder(new IdempotencyFilter(ds, new IdempotencyFilter.Options().scope("check")
			.lockWaitMillis(0))), "/t/*", EnumSet.of(DispatcherType.REQUEST));
		server.setHandler(ctx);
		server.start();
		port = ((ServerConnector) server.getConnectors()[0]).getLocalPort();
	}

	static void stop() throws Exception {
		if (server != null) server.stop();
	}

	static HttpResponse<byte[]> post(String mode, String body, String... keys) throws Exception {
		HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/t/" + mode))
			.POST(HttpRequest.BodyPublishers.ofString(body)).header("Content-Type", "application/json");
		for (String k : keys) b.header("Idempotency-Key", k);
		return http.send(b.build(), HttpResponse.BodyHandlers.ofByteArray());
	}

	static long count(Connection c, String sql, String key) throws Exception {
		try (PreparedStatement ps = c.prepareStatement(sql)) {
			ps.setString(1, key);
			try (ResultSet rs = ps.executeQuery()) { rs.next(); return rs.getLong(1); }
		}
	}

	static long rows(Connection c, String key) throws Exception {
		return count(c, "SELECT count(*) FROM payment WHERE idem_key = ?", key);
	}

	static long keys(Connection c, String key) throws Exception {
		return count(c, "SELECT count(*) FROM idempotency.idempotency_key WHERE key = ?", key);
	}

	static String show(HttpResponse<byte[]> r) {
		return r.statusCode() + " " + r.headers().map() + " " + new String(r.body(), StandardCharsets.UTF_8);
	}

	static String h(HttpResponse<byte[]> r, String name) {
		return r.headers().firstValue(name).orElse(null);
	}

	static boolean same(HttpResponse<byte[]> a, HttpResponse<byte[]> b) {
		return a.statusCode() == b.statusCode() && Arrays.equals(a.body(), b.body())
			&& java.util.Objects.equals(h(a, "Content-Type"), h(b, "Content-Type"))
			&& java.util.Objects.equals(h(a, "Location"), h(b, "Location"));
	}

	/** begin, replay, mismatch; the fingerprint is the Node/Python clients' */
	static void beginReplayMismatch(Connection db, String p) throws Exception {
		String k = p + "ok";
		HttpResponse<byte[]> a = post("ok", "{\"amount\": \"1.00\"}", k);
		HttpResponse<byte[]> b = post("ok", "{\"amount\":\"1.00\"}", "\"" + k + "\"");
		check("first request: 201 from the handler, its insert on the guarded connection committed with the key",
			a.statusCode() == 201 && h(a, "Idempotent-Replayed") == null && rows(db, k) == 1
			&& count(db, "SELECT count(*) FROM idempotency.idempotency_key WHERE key = ? AND status = 'completed'", k) == 1,
			show(a));
		check("replay (sf-string key, same JSON differently spaced): byte-identical status, body, Content-Type,"
			+ " Location, Idempotent-Replayed: true, a header not in `headers` not replayed, no second row",
			same(a, b) && "true".equals(h(b, "Idempotent-Replayed")) && "1".equals(h(a, "X-Not-Stored"))
			&& h(b, "X-Not-Stored") == null && rows(db, k) == 1, show(b));
		long fp = count(db, "SELECT count(*) FROM idempotency.idempotency_key WHERE key = ? AND request_hash ="
			+ " idempotency.fingerprint('{\"method\":\"POST\",\"path\":\"/t/ok\",\"body\":{\"amount\":\"1.00\"}}')", k);
		check("fingerprint: {method, path, body} as the Node and Python clients compute it", fp == 1, fp);
		HttpResponse<byte[]> c = post("ok", "{\"amount\":\"2.00\"}", k);
		check("same key, different body: 422 problem+json, nothing written",
			c.statusCode() == 422 && h(c, "Content-Type").startsWith("application/problem+json") && rows(db, k) == 1,
			show(c));
		String kb = p + "bin";
		HttpResponse<byte[]> d = post("writer", "not json \u00ff", kb);
		HttpResponse<byte[]> e = post("writer", "not json \u00ff", kb);
		long fb = count(db, "SELECT count(*) FROM idempotency.idempotency_key WHERE key = ? AND request_hash ="
			+ " idempotency.fingerprint(jsonb_build_object('method', 'POST', 'path', '/t/writer', 'body',"
			+ " jsonb_build_object('base64', encode(convert_to('not json \u00ff', 'UTF8'), 'base64'))))", kb);
		check("a body that is not JSON is fingerprinted as {\"base64\": ...}; a getWriter() answer (UTF-8) replayed"
			+ " byte for byte", fb == 1 && d.statusCode() == 201 && same(d, e) && "true".equals(h(e, "Idempotent-Replayed"))
			&& new String(d.body(), StandardCharsets.UTF_8).startsWith("caf\u00e9 \u2713"), show(d) + " | " + show(e));
	}

	/** a form body: getParameter() still works after the filter read the body */
	static void form(Connection db, String p) throws Exception {
		String k = p + "form";
		HttpResponse<byte[]> r = http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/t/form?q=caf%C3%A9"))
			.POST(HttpRequest.BodyPublishers.ofString("amount=1.50&tag=a&tag=b%20c"))
			.header("Content-Type", "application/x-www-form-urlencoded").header("Idempotency-Key", k).build(),
			HttpResponse.BodyHandlers.ofByteArray());
		check("a form body: getParameter()/getParameterValues() see the body's and the query's parameters",
			r.statusCode() == 201 && "1.50 a,b c caf\u00e9".equals(new String(r.body(), StandardCharsets.UTF_8))
			&& rows(db, k) == 1, show(r));
	}

	/** 409 + Retry-After while another transaction holds the key */
	static void busy(Connection db, Connection other, String p) throws Exception {
		String k = p + "busy";
		other.setAutoCommit(false);
		try (PreparedStatement ps = other.prepareStatement("SELECT outcome FROM idempotency.begin(?, '{}'::jsonb, 'check')")) {
			ps.setString(1, k);
			ps.executeQuery().close();
		}
		HttpResponse<byte[]> r = post("ok", "{}", k);
		other.rollback();
		other.setAutoCommit(true);
		String ra = h(r, "Retry-After");
		check("duplicate while the key is held: 409 with Retry-After, nothing written",
			r.statusCode() == 409 && ra != null && ra.matches("[1-9][0-9]*") && rows(db, k) == 0 && keys(db, k) == 0,
			show(r));
	}

	/** missing, malformed, too long, repeated keys: 400, nothing written */
	static void invalidKeys(Connection db, String p) throws Exception {
		String longKey = p + "x".repeat(300);
		HttpResponse<byte[]> missing = post("ok", "{}");
		HttpResponse<byte[]> bad = post("ok", "{}", "\"" + p + "unterminated");
		HttpResponse<byte[]> tooLong = post("ok", "{}", longKey);
		HttpResponse<byte[]> two = post("ok", "{}", p + "a", p + "b");
		check("missing key, malformed sf-string, longer than 255 (IK003), two Idempotency-Key headers: 400 each,"
			+ " nothing written", missing.statusCode() == 400 && bad.statusCode() == 400 && tooLong.statusCode() == 400
			&& two.statusCode() == 400 && rows(db, longKey) == 0 && rows(db, p + "a") == 0 && keys(db, longKey) == 0,
			show(missing) + " | " + show(bad) + " | " + show(tooLong) + " | " + show(two));
		HttpResponse<byte[]> get = http.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/t/get"))
			.GET().build(), HttpResponse.BodyHandlers.ofByteArray());
		check("GET (not a guarded method) passes without a key, unguarded (connection() throws)",
			get.statusCode() == 200 && "unguarded".equals(new String(get.body(), StandardCharsets.UTF_8)), show(get));
	}

	/** a handler's write rolled back with its 500 / 503 / 429, committed with its 201 */
	static void rollbackRules(Connection db, String p) throws Exception {
		String k = p + "boom";
		HttpResponse<byte[]> a = post("boom", "{}", k);
		check("handler throws after its insert: 500, the insert rolled back, no key stored",
			a.statusCode() == 500 && rows(db, k) == 0 && keys(db, k) == 0, show(a));
		HttpResponse<byte[]> b = post("boom", "{}", k);
		check("the resend runs again (500 again, still nothing written)",
			b.statusCode() == 500 && rows(db, k) == 0 && keys(db, k) == 0, show(b));
		String k5 = p + "503";
		HttpResponse<byte[]> c = post("503", "{}", k5);
		check("handler answers 503 after its insert: sent as is, rolled back, not stored",
			c.statusCode() == 503 && "busy".equals(new String(c.body(), StandardCharsets.UTF_8))
			&& rows(db, k5) == 0 && keys(db, k5) == 0, show(c));
		String k4 = p + "429";
		HttpResponse<byte[]> d = post("429", "{}", k4);
		HttpResponse<byte[]> e = post("ok", "{}", k4);
		check("429 after its insert: rolled back, not stored; the resend runs and commits its 201",
			d.statusCode() == 429 && "1".equals(h(d, "Retry-After")) && e.statusCode() == 201
			&& h(e, "Idempotent-Replayed") == null && rows(db, k4) == 1, show(d) + " | " + show(e));
		String kc = p + "commit";
		HttpResponse<byte[]> f = post("commit", "{}", kc);
		check("the handler's commit() on the guarded connection is refused (SQLSTATE 25000)",
			f.statusCode() == 200 && "25000".equals(new String(f.body(), StandardCharsets.UTF_8)), show(f));
	}

	/** streamed answers refused clearly: 500, rolled back, not stored */
	static void streaming(Connection db, String p) throws Exception {
		for (String mode : List.of("flush", "big", "async")) {
			String k = p + mode;
			HttpResponse<byte[]> r = post(mode, "{}", k);
			String body = new String(r.body(), StandardCharsets.UTF_8);
			check("streamed answer (" + mode + "): 500 \"Response not storable\", nothing sent of it, insert rolled back,"
				+ " no key", r.statusCode() == 500 && body.contains("Response not storable") && !body.contains("part")
				&& rows(db, k) == 0 && keys(db, k) == 0, show(r));
		}
	}

	static String steps(Connection c, String key) throws Exception {
		try (PreparedStatement ps = c.prepareStatement(
				"SELECT coalesce(string_agg(step, ',' ORDER BY id), '') FROM transfer_step WHERE idem_key = ?")) {
			ps.setString(1, key);
			try (ResultSet rs = ps.executeQuery()) { rs.next(); return rs.getString(1); }
		}
	}

	static String keyStatus(Connection c, String key) throws Exception {
		try (PreparedStatement ps = c.prepareStatement("SELECT status FROM idempotency.idempotency_key WHERE key = ?")) {
			ps.setString(1, key);
			try (ResultSet rs = ps.executeQuery()) { return rs.next() ? rs.getString(1) : null; }
		}
	}

	static HttpResponse<byte[]> transfer(String body, String... keys) throws Exception {
		HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/ph/transfers"))
			.POST(HttpRequest.BodyPublishers.ofString(body)).header("Content-Type", "application/json");
		for (String k : keys) b.header("Idempotency-Key", k);
		return http.send(b.build(), HttpResponse.BodyHandlers.ofByteArray());
	}

	/** a phased route: phases committed one by one, the answer stored and replayed, 422, 400 */
	static void phased(Connection db, String p) throws Exception {
		String k = p + "ph";
		HttpResponse<byte[]> a = transfer("{\"amount\": \"12.50\"}", k);
		String derived;
		try (PreparedStatement ps = db.prepareStatement("SELECT idempotency.derive_key(?, 'charge', 'check-ph')")) {
			ps.setString(1, k);
			try (ResultSet rs = ps.executeQuery()) { rs.next(); derived = rs.getString(1); }
		}
		String want = "{\"debit\":{\"debited\":\"12.50\"},\"charge\":{\"charge_id\":\"" + derived
			+ "\",\"outside\":true},\"finish\":\"new\"}";
		check("phased: 201 with the phases' state (an external phase has no connection), a row per database phase,"
			+ " the key completed", a.statusCode() == 201 && h(a, "Idempotent-Replayed") == null
			&& Json.parse(want).equals(Json.parse(new String(a.body(), StandardCharsets.UTF_8)))
			&& "debit,finish".equals(steps(db, k))
			&& "completed".equals(keyStatus(db, k)), show(a) + " want " + want);
		HttpResponse<byte[]> b = transfer("{\"amount\":\"12.50\"}", "\"" + k + "\"");
		check("phased replay: byte-identical status, body, Content-Type, Location, Idempotent-Replayed: true, no phase ran",
			same(a, b) && "true".equals(h(b, "Idempotent-Replayed")) && "debit,finish".equals(steps(db, k)), show(b));
		HttpResponse<byte[]> c = transfer("{\"amount\":\"13.00\"}", k);
		check("phased, same key with another body: 422 problem+json", c.statusCode() == 422
			&& h(c, "Content-Type").startsWith("application/problem+json"), show(c));
		HttpResponse<byte[]> d = transfer("{\"amount\":\"1.00\"}");
		HttpResponse<byte[]> e = transfer("{\"amount\":\"1.00\"}", "\"" + p + "open");
		HttpResponse<byte[]> f = transfer("{\"amount\":\"1.00\"}", p + "y".repeat(300));
		check("phased: missing, malformed and too long keys: 400, nothing written", d.statusCode() == 400
			&& e.statusCode() == 400 && f.statusCode() == 400 && "".equals(steps(db, p + "y".repeat(300))),
			show(d) + " | " + show(e) + " | " + show(f));
		String kb = p + "ph-bad";
		HttpResponse<byte[]> g = transfer("{\"bad\":true}", kb);
		check("phased: a handler that answers without declaring phases is sent, not stored",
			g.statusCode() == 400 && "bad".equals(new String(g.body(), StandardCharsets.UTF_8)) && keys(db, kb) == 0,
			show(g));
	}

	/** a phased route's errors: permanent (stored), others (not stored, resumed), 5xx/429, busy */
	static void phasedErrors(Connection db, String p) throws Exception {
		String k = p + "ph-decline";
		HttpResponse<byte[]> a = transfer("{\"amount\":\"1.00\",\"decline\":true}", k);
		HttpResponse<byte[]> b = transfer("{\"amount\":\"1.00\",\"decline\":true}", k);
		check("phased: a permanent PhaseError is answered 402 {\"error\":\"card_declined\"}, stored (failed) and replayed,"
			+ " nothing of its phase written", a.statusCode() == 402
			&& "{\"error\":\"card_declined\"}".equals(new String(a.body(), StandardCharsets.UTF_8))
			&& "application/json".equals(h(a, "Content-Type")) && same(a, b) && "true".equals(h(b, "Idempotent-Replayed"))
			&& "".equals(steps(db, k)) && "failed".equals(keyStatus(db, k)), show(a) + " | " + show(b));
		String kr = p + "ph-refuse";
		HttpResponse<byte[]> ra1 = transfer("{\"amount\":\"1.00\",\"refuse\":true}", kr);
		HttpResponse<byte[]> ra2 = transfer("{\"amount\":\"1.00\",\"refuse\":true}", kr);
		check("phased: PhaseError.permanent(message) is answered 400 {\"error\":message} by default, stored and replayed",
			ra1.statusCode() == 400 && "{\"error\":\"refused\"}".equals(new String(ra1.body(), StandardCharsets.UTF_8))
			&& same(ra1, ra2) && "true".equals(h(ra2, "Idempotent-Replayed")), show(ra1) + " | " + show(ra2));
		String kx = p + "ph-boom";
		HttpResponse<byte[]> c = transfer("{\"amount\":\"1.00\",\"boom\":true}", kx);
		HttpResponse<byte[]> d = transfer("{\"amount\":\"1.00\",\"boom\":true}", kx);
		check("phased: an exception in the last phase: 500, its phase rolled back, not stored; the resend resumes"
			+ " after the last checkpoint (debit not run again)", c.statusCode() == 500 && d.statusCode() == 500
			&& "debit".equals(steps(db, kx)) && "failed".equals(keyStatus(db, kx)), show(c) + " | " + show(d));
		for (int status : new int[] { 503, 429 }) {
			String ks = p + "ph-" + status;
			HttpResponse<byte[]> r = transfer("{\"amount\":\"1.00\",\"status\":" + status + "}", ks);
			check("phased: respond answers " + status + ": sent, not stored (the last phase rolled back, the key failed"
				+ " retryably)", r.statusCode() == status && h(r, "Idempotent-Replayed") == null
				&& "debit".equals(steps(db, ks)) && "failed".equals(keyStatus(db, ks)), show(r));
		}
		String k4 = p + "ph-404";
		HttpResponse<byte[]> e = transfer("{\"amount\":\"1.00\",\"status\":404}", k4);
		HttpResponse<byte[]> f = transfer("{\"amount\":\"1.00\",\"status\":404}", k4);
		check("phased: respond answers 404: stored and replayed", e.statusCode() == 404 && same(e, f)
			&& "true".equals(h(f, "Idempotent-Replayed")), show(e) + " | " + show(f));
		String kb = p + "ph-busy";
		java.util.concurrent.CompletableFuture<HttpResponse<byte[]>> first = java.util.concurrent.CompletableFuture
			.supplyAsync(() -> {
				try { return transfer("{\"amount\":\"1.00\",\"sleep\":2}", kb); } catch (Exception x) { throw new RuntimeException(x); }
			});
		Thread.sleep(1300);	// past the first lease (1 s): only its renewals keep the key
		HttpResponse<byte[]> g = transfer("{\"amount\":\"1.00\",\"sleep\":2}", kb);
		HttpResponse<byte[]> h1 = first.get();
		String ra = h(g, "Retry-After");
		check("phased: a duplicate while a phase runs (the lease renewed past its 1 s): 409 with Retry-After;"
			+ " the first 201", g.statusCode() == 409 && ra != null && ra.matches("[1-9][0-9]*") && h1.statusCode() == 201
			&& "debit,finish".equals(steps(db, kb)), show(g) + " | " + show(h1));
	}

	public static void main(String[] args) throws Exception {
		String p = prefix();
		start();
		try (Connection db = DriverManager.getConnection(url()); Connection other = DriverManager.getConnection(url())) {
			beginReplayMismatch(db, p);
			busy(db, other, p);
			invalidKeys(db, p);
			form(db, p);
			rollbackRules(db, p);
			streaming(db, p);
			phased(db, p);
			phasedErrors(db, p);
		} finally {
			stop();
		}
		System.exit(failures.isEmpty() ? 0 : 1);
	}
}
