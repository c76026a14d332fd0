/*
 * Example (and test server): POST /payments with Idempotency.run on
 * com.sun.net.httpserver, the contract of clients/node/examples/express.js.
 * Database from DATABASE_HOST/PORT/NAME/USER; IDEMPOTENCY_BOUNCER=1: behind
 * PgBouncer in transaction mode (prepareThreshold=0).  A small fixed pool of
 * connections; prints "listening <port>".
 *
 * POST /transfers: the phased-endpoint contract (test/conformance/README.md)
 * with Phases.serve on a DataSource (pgjdbc's PGSimpleDataSource): debit (a
 * row), charge (DOWNSTREAM_URL, a derived key, no transaction open), finish
 * (a row); X-Crash: charge / finish halts the process there.
 */
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.util.Collections;
import java.util.Map;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.Executors;
import org.idempotency.Idempotency;
import org.idempotency.Idempotency.Response;
import org.idempotency.Json;
import org.idempotency.Phases;
import org.postgresql.ds.PGSimpleDataSource;

public class PaymentServer {
	static final BlockingQueue<Connection> pool = new ArrayBlockingQueue<>(10);
	static String url;
	static final PGSimpleDataSource dataSource = new PGSimpleDataSource();
	static final java.net.http.HttpClient http = java.net.http.HttpClient.newBuilder()
		.version(java.net.http.HttpClient.Version.HTTP_1_1).build();
	static final java.util.Set<String> throttled = java.util.concurrent.ConcurrentHashMap.newKeySet();

	public static void main(String[] args) throws Exception {
		Map<String, String> env = System.getenv();
		url = "jdbc:postgresql://" + env.get("DATABASE_HOST") + ":" + env.get("DATABASE_PORT") + "/"
			+ env.get("DATABASE_NAME") + "?user=" + env.get("DATABASE_USER")
			+ ("1".equals(env.get("IDEMPOTENCY_BOUNCER")) ? "&prepareThreshold=0" : "");
		for (int i = 0; i < 10; i++) pool.add(DriverManager.getConnection(url));
		dataSource.setURL(url);
		HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1",
			Integer.parseInt(env.getOrDefault("PORT", "0"))), 128);
		server.setExecutor(Executors.newFixedThreadPool(64));
		server.createContext("/payments", PaymentServer::payments);
		server.createContext("/transfers", PaymentServer::transfers);
		server.start();
		System.out.println("listening " + server.getAddress().getPort());
		System.out.flush();
	}

	static void payments(HttpExchange ex) {
		try {
			Response r;
			String body = new String(ex.getRequestBody().readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
			String key = null;
			try {
				key = Idempotency.parseKey(ex.getRequestHeaders().get("Idempotency-Key"));
				r = key == null ? Idempotency.problem(400, "Idempotency-Key missing",
					"This request requires an Idempotency-Key header.") : null;
			} catch (IllegalArgumentException e) {
				r = Idempotency.problem(400, "Invalid Idempotency-Key", e.getMessage());
			}
			if (r == null) {
				String user = ex.getRequestHeaders().getFirst("X-User");	// stands in for the authenticated user
				Idempotency.Options o = new Idempotency.Options().scope(user == null ? "payments" : "payments|user:" + user);
				Connection conn = pool.take();
				try {
					r = pay(conn, key, body, o);
				} catch (Exception e) {
					r = Idempotency.problem(500, "Internal error", String.valueOf(e.getMessage()));
				} finally {
					if (!conn.isValid(1)) { conn.close(); conn = DriverManager.getConnection(url); }
					pool.add(conn);
				}
			}
			send(ex, r);
		} catch (Exception e) {
			e.printStackTrace();
		} finally {
			ex.close();
		}
	}

	static void send(HttpExchange ex, Response r) throws java.io.IOException {
		for (Map.Entry<String, String> h : r.headers.entrySet()) ex.getResponseHeaders().set(h.getKey(), h.getValue());
		if (r.replayed) ex.getResponseHeaders().set("Idempotent-Replayed", "true");
		ex.sendResponseHeaders(r.status, r.body.length == 0 ? -1 : r.body.length);
		try (OutputStream out = ex.getResponseBody()) { out.write(r.body); }
	}

	static void transfers(HttpExchange ex) {
		try {
			byte[] raw = ex.getRequestBody().readAllBytes();
			Response r;
			String key = null;
			try {
				key = Idempotency.parseKey(ex.getRequestHeaders().get("Idempotency-Key"));
				r = key == null ? Idempotency.problem(400, "Idempotency-Key missing",
					"This request requires an Idempotency-Key header.") : null;
			} catch (IllegalArgumentException e) {
				r = Idempotency.problem(400, "Invalid Idempotency-Key", e.getMessage());
			}
			if (r == null) {
				String user = ex.getRequestHeaders().getFirst("X-User");
				Phases.Options o = new Phases.Options().key(key).scope(user == null ? "transfers" : "transfers|user:" + user)
					.request(Idempotency.requestJson("POST", ex.getRequestURI().toString(), raw))
					.lease(Duration.ofSeconds(2)).renewEvery(Duration.ofMillis(600));
				try {
					r = Phases.serve(dataSource, o, new Phases.Http(), transfer(ex, raw));
				} catch (Exception e) {
					r = Idempotency.problem(500, "Internal error", String.valueOf(e.getMessage()));
				}
			}
			send(ex, r);
		} catch (Exception e) {
			e.printStackTrace();
		} finally {
			ex.close();
		}
	}

	// the phased endpoint's phases
	static Phases.Plan transfer(HttpExchange ex, byte[] raw) {
		Map<?, ?> body = (Map<?, ?>) Json.parse(new String(raw, java.nio.charset.StandardCharsets.UTF_8));
		String amount = (String) body.get("amount");
		String crash = ex.getRequestHeaders().getFirst("X-Crash");
		return new Phases.Plan().phase("debit", ctx -> {
			if (Boolean.TRUE.equals(body.get("decline"))) throw Phases.PhaseError.permanent("card_declined", 402);
			step(ctx, "debit");
			if (body.get("sleep") instanceof Number)
				try (PreparedStatement ps = ctx.connection().prepareStatement("SELECT pg_sleep(?)")) {
					ps.setDouble(1, ((Number) body.get("sleep")).doubleValue());
					ps.executeQuery().close();
				}
			return Collections.singletonMap("debited", amount);
		}).external("charge", ctx -> {
			java.net.http.HttpResponse<String> d = http.send(java.net.http.HttpRequest.newBuilder(
				java.net.URI.create(System.getenv("DOWNSTREAM_URL") + "/charge"))
				.header("Content-Type", "application/json").header("Idempotency-Key", ctx.deriveKey("charge"))
				.POST(java.net.http.HttpRequest.BodyPublishers.ofString("{\"amount\":" + Idempotency.json(amount) + "}"))
				.build(), java.net.http.HttpResponse.BodyHandlers.ofString());
			if (d.statusCode() != 200) throw new java.io.IOException("downstream answered " + d.statusCode());
			if ("charge".equals(crash)) Runtime.getRuntime().halt(1);
			return Json.parse(d.body());
		}).phase("finish", ctx -> {
			if ("finish".equals(crash)) Runtime.getRuntime().halt(1);
			step(ctx, "finish");
			return true;
		}).respond(state -> Response.of(201, "application/json", "{\"status\":\"done\",\"charge_id\":"
			+ Idempotency.json((String) ((Map<?, ?>) state.get("charge")).get("charge_id")) + ",\"amount\":"
			+ Idempotency.json(amount) + "}"));
	}

	static void step(Phases.Context ctx, String step) throws SQLException {
		try (PreparedStatement ps = ctx.connection().prepareStatement(
				"INSERT INTO transfer_step (idem_key, step) VALUES (?, ?)")) {
			ps.setString(1, ctx.key());
			ps.setString(2, step);
			ps.executeUpdate();
		}
	}

	// the endpoint: one call
	static Response pay(Connection conn, String key, String body, Idempotency.Options o) throws Exception {
		return Idempotency.run(conn, key, body, o, c -> {
			try (PreparedStatement ps = c.prepareStatement("SELECT j->>'amount', coalesce((j->>'sleep')::float8, 0),"
					+ " coalesce((j->>'decline')::bool, false), coalesce((j->>'boom')::bool, false),"
					+ " coalesce((j->>'binary')::bool, false), coalesce((j->>'throttle')::bool, false)"
					+ " FROM (SELECT ?::jsonb j) s")) {
				ps.setString(1, body);
				try (ResultSet rs = ps.executeQuery()) {
					rs.next();
					String amount = rs.getString(1);
					double sleep = rs.getDouble(2);
					if (rs.getBoolean(3)) return Response.of(402, "application/json", "{\"error\":\"card_declined\"}");
					long id;
					try (PreparedStatement ins = c.prepareStatement(
							"INSERT INTO payment (idem_key, amount) VALUES (?, ?::numeric) RETURNING id")) {
						ins.setString(1, key);
						ins.setString(2, amount);
						try (ResultSet ir = ins.executeQuery()) { ir.next(); id = ir.getLong(1); }
					}
					if (sleep > 0) try (PreparedStatement s = c.prepareStatement("SELECT pg_sleep(?)")) {
						s.setDouble(1, sleep);
						s.executeQuery().close();
					}
					if (rs.getBoolean(4)) throw new IllegalStateException("boom");
					if (rs.getBoolean(6) && throttled.add(key))	// 429: rolled back, not stored
						return Response.of(429, "application/json", "{\"error\":\"rate_limited\"}").header("Retry-After", "1");
					if (rs.getBoolean(5))
						return new Response(200, ("\u00ff\u0000\u00fe" + id).getBytes(java.nio.charset.StandardCharsets.ISO_8859_1))
							.header("Content-Type", "application/octet-stream");
					return Response.of(201, "application/json", "{\"status\":\"paid\",\"id\":" + id + ",\"amount\":"
						+ Idempotency.json(amount) + ",\"note\":\"caf\u00e9 \u2713\"}").header("Location", "/payments/" + id);
				}
			}
		});
	}
}
