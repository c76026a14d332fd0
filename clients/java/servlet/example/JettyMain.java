/*
 * The example app in Debian's Jetty 9.4 (javax.servlet 4): PaymentServlet at
 * /payments behind IdempotencyFilter, TransferServlet at /transfers behind a
 * phased IdempotencyFilter (lease 2 s, renewed every 600 ms), a HikariCP
 * pool of 20 connections.
 * Database from DATABASE_HOST/PORT/NAME/USER; IDEMPOTENCY_BOUNCER=1: behind
 * PgBouncer in transaction mode (prepareThreshold=0).  Listens on
 * 127.0.0.1:$PORT (0: any) and prints "listening <port>".
 */
import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import java.net.InetSocketAddress;
import java.time.Duration;
import java.util.EnumSet;
import java.util.Map;
import javax.servlet.DispatcherType;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.servlet.FilterHolder;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;
import org.idempotency.servlet.javax.IdempotencyFilter;

public class JettyMain {
	static HikariDataSource dataSource() {
		Map<String, String> env = System.getenv();
		HikariConfig c = new HikariConfig();
		c.setJdbcUrl("jdbc:postgresql://" + env.get("DATABASE_HOST") + ":" + env.get("DATABASE_PORT") + "/"
			+ env.get("DATABASE_NAME") + "?user=" + env.get("DATABASE_USER")
			+ ("1".equals(env.get("IDEMPOTENCY_BOUNCER")) ? "&prepareThreshold=0" : ""));
		c.setMaximumPoolSize(20);
		return new HikariDataSource(c);
	}

	public static void main(String[] args) throws Exception {
		HikariDataSource ds = dataSource();
		Server server = new Server(new InetSocketAddress("127.0.0.1",
			Integer.parseInt(System.getenv().getOrDefault("PORT", "0"))));
		ServletContextHandler ctx = new ServletContextHandler();
		ctx.addServlet(new ServletHolder(new PaymentServlet()), "/payments");
		// the one idempotency-specific line of the endpoint:
		ctx.addFilter(new FilterHolder(new IdempotencyFilter(ds, new IdempotencyFilter.Options().scope("payments").user(r -> r.getHeader("X-User")))), "/payments", EnumSet.of(DispatcherType.REQUEST));
		ctx.addServlet(new ServletHolder(new TransferServlet()), "/transfers");
		// the phased route's idempotency-specific line (and IdempotencyFilter.phases(req) in the servlet):
		ctx.addFilter(new FilterHolder(new IdempotencyFilter(ds, new IdempotencyFilter.Options().scope("transfers").user(r -> r.getHeader("X-User")).phased(Duration.ofSeconds(2)).renewEvery(Duration.ofMillis(600)))), "/transfers", EnumSet.of(DispatcherType.REQUEST));
		server.setHandler(ctx);
		server.start();
		System.out.println("listening " + ((ServerConnector) server.getConnectors()[0]).getLocalPort());
		System.out.flush();
		server.join();
	}
}
