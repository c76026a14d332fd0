/*
 * Example (and conformance app): POST /payments behind IdempotencyFilter, the
 * contract of test/clients/driver.js.  The handler works on the guarded
 * transaction's connection, IdempotencyFilter.connection(req): its insert
 * commits with the key, or rolls back with it (an exception, a 5xx, a 429).
 * Written for javax.servlet (Jetty 9.4: JettyMain); test/conformance/apps/
 * servlet-jakarta.sh turns it into the jakarta.servlet one by a sed over the
 * package names (Tomcat 10: TomcatMain).
 *
 * Body {"amount": x} -> 201; {"decline": true} -> 402 (stored);
 * {"sleep": s} holds the transaction; {"boom": true} -> 500 after its insert;
 * {"binary": true} -> 200 octet-stream; {"throttle": true} -> 429 the first
 * time a key is seen; {"stream": true} -> flushBuffer(): refused by the
 * filter (500 "Response not storable", rolled back).
 */
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import javax.servlet.ServletException;
import javax.servlet.http.HttpServlet;
import javax.servlet.http.HttpServletRequest;
import javax.servlet.http.HttpServletResponse;
import org.idempotency.Idempotency;
import org.idempotency.servlet.javax.IdempotencyFilter;

public class PaymentServlet extends HttpServlet {
	private static final long serialVersionUID = 1L;
	private static final Set<String> throttled = ConcurrentHashMap.newKeySet();

	@Override
	protected void doPost(HttpServletRequest req, HttpServletResponse res) throws IOException, ServletException {
		Connection c = IdempotencyFilter.connection(req);	// the key's transaction
		String key = IdempotencyFilter.key(req);
		String body = new String(req.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
		try (PreparedStatement ps = c.prepareStatement("SELECT j->>'amount', coalesce((j->>'sleep')::float8, 0),"
				+ " coalesce((j->>'decline')::bool, false), coalesce((j->>'boom')::bool, false),"
				+ " coalesce((j->>'binary')::bool, false), coalesce((j->>'throttle')::bool, false),"
				+ " coalesce((j->>'stream')::bool, false) FROM (SELECT ?::jsonb j) s")) {
			ps.setString(1, body);
			try (ResultSet rs = ps.executeQuery()) {
				rs.next();
				String amount = rs.getString(1);
				if (rs.getBoolean(3)) {
					write(res, 402, "application/json", "{\"error\":\"card_declined\"}".getBytes(StandardCharsets.UTF_8));
					return;
				}
				long id;
				try (PreparedStatement ins = c.prepareStatement(
						"INSERT INTO payment (idem_key, amount) VALUES (?, ?::numeric) RETURNING id")) {
					ins.setString(1, key);
					ins.setString(2, amount);
					try (ResultSet ir = ins.executeQuery()) { ir.next(); id = ir.getLong(1); }
				}
				if (rs.getDouble(2) > 0) try (PreparedStatement s = c.prepareStatement("SELECT pg_sleep(?)")) {
					s.setDouble(1, rs.getDouble(2));
					s.executeQuery().close();
				}
				if (rs.getBoolean(4)) throw new ServletException("boom");
				if (rs.getBoolean(6) && throttled.add(key)) {	// 429: rolled back, not stored
					res.setHeader("Retry-After", "1");
					write(res, 429, "application/json", "{\"error\":\"rate_limited\"}".getBytes(StandardCharsets.UTF_8));
					return;
				}
				if (rs.getBoolean(7)) {	// a streamed answer: refused by the filter
					res.setContentType("text/plain");
					res.getOutputStream().write("partial".getBytes(StandardCharsets.UTF_8));
					res.flushBuffer();
					return;
				}
				if (rs.getBoolean(5)) {
					write(res, 200, "application/octet-stream",
						("\u00ff\u0000\u00fe" + id).getBytes(StandardCharsets.ISO_8859_1));
					return;
				}
				res.setHeader("Location", "/payments/" + id);
				write(res, 201, "application/json", ("{\"status\":\"paid\",\"id\":" + id + ",\"amount\":"
					+ Idempotency.json(amount) + ",\"note\":\"caf\u00e9 \u2713\"}").getBytes(StandardCharsets.UTF_8));
			}
		} catch (SQLException e) {
			throw new ServletException(e);
		}
	}

	private static void write(HttpServletResponse res, int status, String type, byte[] body) throws IOException {
		res.setStatus(status);
		res.setContentType(type);
		res.getOutputStream().write(body);
	}
}
