/*
 * Example (and conformance app): POST /transfers, a phased route behind
 * IdempotencyFilter (Options.phased(lease)): three phases under the
 * request's Idempotency-Key in lease mode (test/conformance's phased-endpoint
 * contract).  The handler only declares the phases on
 * IdempotencyFilter.phases(req); the filter runs them on its DataSource and
 * answers (replay, 409, 422 as for /payments):
 *   debit   a database phase: a transfer_step row in the phase's transaction;
 *           {"sleep": s} holds it; {"decline": true} -> a permanent
 *           PhaseError: 402 {"error":"card_declined"}, stored
 *   charge  an external phase (no transaction open): POST $DOWNSTREAM_URL/charge
 *           with Idempotency-Key: derive_key('charge'); X-Crash: charge halts
 *           the process after the answer, before the checkpoint
 *   finish  a database phase: X-Crash: finish halts at its start; else a row
 * Answer: 201 {"status":"done","charge_id":"...","amount":"..."}.
 * Written for javax.servlet; servlet-jakarta.sh's build turns it into the
 * jakarta.servlet one by a sed over the package names.
 */
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.util.Collections;
import java.util.Map;
import javax.servlet.http.HttpServlet;
import javax.servlet.http.HttpServletRequest;
import javax.servlet.http.HttpServletResponse;
import org.idempotency.Idempotency;
import org.idempotency.Json;
import org.idempotency.Phases;
import org.idempotency.servlet.javax.IdempotencyFilter;

public class TransferServlet extends HttpServlet {
	private static final long serialVersionUID = 1L;
	private static final HttpClient http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();

	@Override
	protected void doPost(HttpServletRequest req, HttpServletResponse res) throws IOException {
		Map<?, ?> body = (Map<?, ?>) Json.parse(new String(req.getInputStream().readAllBytes(), StandardCharsets.UTF_8));
		String amount = (String) body.get("amount");
		String crash = req.getHeader("X-Crash");
		IdempotencyFilter.phases(req).phase("debit", ctx -> {	// the route's phases, run by the filter
			if (Boolean.TRUE.equals(body.get("decline"))) throw Phases.PhaseError.permanent("card_declined", 402);
			step(ctx, "debit");
			if (body.get("sleep") instanceof Number)
				try (PreparedStatement ps = ctx.connection().prepareStatement("SELECT pg_sleep(?)")) {
					ps.setDouble(1, ((Number) body.get("sleep")).doubleValue());
					ps.executeQuery().close();
				}
			return Collections.singletonMap("debited", amount);
		}).external("charge", ctx -> {
			HttpResponse<String> r = http.send(HttpRequest.newBuilder(URI.create(System.getenv("DOWNSTREAM_URL") + "/charge"))
				.header("Content-Type", "application/json").header("Idempotency-Key", ctx.deriveKey("charge"))
				.POST(HttpRequest.BodyPublishers.ofString("{\"amount\":" + Idempotency.json(amount) + "}")).build(),
				HttpResponse.BodyHandlers.ofString());
			if (r.statusCode() != 200) throw new IOException("downstream answered " + r.statusCode());
			if ("charge".equals(crash)) Runtime.getRuntime().halt(1);
			return Json.parse(r.body());
		}).phase("finish", ctx -> {
			if ("finish".equals(crash)) Runtime.getRuntime().halt(1);
			step(ctx, "finish");
			return true;
		}).respond(state -> Idempotency.Response.of(201, "application/json", "{\"status\":\"done\",\"charge_id\":"
			+ Idempotency.json((String) ((Map<?, ?>) state.get("charge")).get("charge_id")) + ",\"amount\":"
			+ Idempotency.json(amount) + "}"));
	}

	private static void step(Phases.Context ctx, String step) throws SQLException {
		try (PreparedStatement ps = ctx.connection().prepareStatement(
				"INSERT INTO transfer_step (idem_key, step) VALUES (?, ?)")) {
			ps.setString(1, ctx.key());
			ps.setString(2, step);
			ps.executeUpdate();
		}
	}
}
