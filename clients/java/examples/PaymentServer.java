/*
 * Example (and test server): POST /payments with Idempotency.run on
 * com.sun.net.httpserver, the contract of clients/node/examples/express.js.
 * Database from DATABASE_HOST/PORT/NAME/USER; IDEMPOTENCY_BOUNCER=1: behind
 * PgBouncer in transaction mode (prepareThreshold=0).  A small fixed pool of
 * connections; prints "listening <port>".
 */
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.util.Map;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.Executors;
import org.idempotency.Idempotency;
import org.idempotency.Idempotency.Response;

public class PaymentServer {
	static final BlockingQueue<Connection> pool = new ArrayBlockingQueue<>(10);
	static String url;
	static final java.util.Set<String> throttled = java.util.concurrent.ConcurrentHashMap.newKeySet();

	public static void main(String[] args) throws Exception {
		Map<String, String> env = System.getenv();
		url = "jdbc:postgresql://" + env.get("DATABASE_HOST") + ":" + env.get("DATABASE_PORT") + "/"
			+ env.get("DATABASE_NAME") + "?user=" + env.get("DATABASE_USER")
			+ ("1".equals(env.get("IDEMPOTENCY_BOUNCER")) ? "&prepareThreshold=0" : "");
		for (int i = 0; i < 10; i++) pool.add(DriverManager.getConnection(url));
		HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1",
			Integer.parseInt(env.getOrDefault("PORT", "0"))), 128);
		server.setExecutor(Executors.newFixedThreadPool(64));
		server.createContext("/payments", PaymentServer::payments);
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
			for (Map.Entry<String, String> h : r.headers.entrySet()) ex.getResponseHeaders().set(h.getKey(), h.getValue());
			if (r.replayed) ex.getResponseHeaders().set("Idempotent-Replayed", "true");
			ex.sendResponseHeaders(r.status, r.body.length == 0 ? -1 : r.body.length);
			try (OutputStream out = ex.getResponseBody()) { out.write(r.body); }
		} catch (Exception e) {
			e.printStackTrace();
		} finally {
			ex.close();
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
