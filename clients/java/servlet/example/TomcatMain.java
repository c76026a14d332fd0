/*
 * The example app in Debian's embedded Tomcat 10.1 (jakarta.servlet):
 * PaymentServlet (its jakarta copy, made by test/conformance/apps/
 * servlet-jakarta.sh) at /payments behind the jakarta IdempotencyFilter,
 * TransferServlet (its jakarta copy) at /transfers behind a phased one (lease
 * 2 s, renewed every 600 ms), a HikariCP pool of 20 connections.  Environment and output as JettyMain.
 */
import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import java.nio.file.Files;
import java.time.Duration;
import java.util.Map;
import org.apache.catalina.Context;
import org.apache.catalina.connector.Connector;
import org.apache.catalina.startup.Tomcat;
import org.apache.tomcat.util.descriptor.web.FilterDef;
import org.apache.tomcat.util.descriptor.web.FilterMap;
import org.idempotency.servlet.jakarta.IdempotencyFilter;

public class TomcatMain {
	public static void main(String[] args) throws Exception {
		Map<String, String> env = System.getenv();
		HikariConfig hc = new HikariConfig();
		hc.setJdbcUrl("jdbc:postgresql://" + env.get("DATABASE_HOST") + ":" + env.get("DATABASE_PORT") + "/"
			+ env.get("DATABASE_NAME") + "?user=" + env.get("DATABASE_USER")
			+ ("1".equals(env.get("IDEMPOTENCY_BOUNCER")) ? "&prepareThreshold=0" : ""));
		hc.setMaximumPoolSize(20);
		HikariDataSource ds = new HikariDataSource(hc);

		Tomcat tomcat = new Tomcat();
		tomcat.setBaseDir(Files.createTempDirectory("tomcat").toString());
		Connector connector = new Connector();
		connector.setPort(Integer.parseInt(env.getOrDefault("PORT", "0")));
		connector.setProperty("address", "127.0.0.1");
		tomcat.setConnector(connector);
		Context ctx = tomcat.addContext("", null);
		Tomcat.addServlet(ctx, "payments", new PaymentServlet()).addMapping("/payments");
		FilterDef def = new FilterDef();
		def.setFilterName("idempotency");
		// the one idempotency-specific line of the endpoint:
		def.setFilter(new IdempotencyFilter(ds, new IdempotencyFilter.Options().scope("payments").user(r -> r.getHeader("X-User"))));
		ctx.addFilterDef(def);
		FilterMap map = new FilterMap();
		map.setFilterName("idempotency");
		map.addURLPattern("/payments");
		ctx.addFilterMap(map);
		Tomcat.addServlet(ctx, "transfers", new TransferServlet()).addMapping("/transfers");
		FilterDef phased = new FilterDef();
		phased.setFilterName("idempotency-phased");
		// the phased route's idempotency-specific line (and IdempotencyFilter.phases(req) in the servlet):
		phased.setFilter(new IdempotencyFilter(ds, new IdempotencyFilter.Options().scope("transfers").user(r -> r.getHeader("X-User")).phased(Duration.ofSeconds(2)).renewEvery(Duration.ofMillis(600))));
		ctx.addFilterDef(phased);
		FilterMap phasedMap = new FilterMap();
		phasedMap.setFilterName("idempotency-phased");
		phasedMap.addURLPattern("/transfers");
		ctx.addFilterMap(phasedMap);
		tomcat.start();
		System.out.println("listening " + connector.getLocalPort());
		System.out.flush();
		tomcat.getServer().await();
	}
}
