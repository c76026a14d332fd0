/*
 * The example app in Debian's embedded Tomcat 10.1 (jakarta.servlet):
 * PaymentServlet (its jakarta copy, made by test/conformance/apps/
 * servlet-jakarta.sh) at /payments behind the jakarta IdempotencyFilter, a
 * HikariCP pool of 10 connections.  Environment and output as JettyMain.
 */
import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import java.nio.file.Files;
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
		hc.setMaximumPoolSize(10);
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
		tomcat.start();
		System.out.println("listening " + connector.getLocalPort());
		System.out.flush();
		tomcat.getServer().await();
	}
}
