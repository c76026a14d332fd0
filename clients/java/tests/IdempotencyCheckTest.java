/*
 * The checks of IdempotencyCheck as JUnit 5 tests (mvn package): one test
 * per check method, each failing with the descriptions of its failed checks.
 * Needs the database of IdempotencyCheck (DATABASE_HOST/PORT/NAME/USER, a
 * `payment` table); skipped when DATABASE_HOST is unset, and test/packages/run
 * fails when any was skipped.
 */
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.sql.Connection;
import java.sql.DriverManager;
import java.util.ArrayList;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

class IdempotencyCheckTest {
	static Connection conn;
	static Connection other;
	static String p;

	@BeforeAll
	static void connect() throws Exception {
		assumeTrue(System.getenv("DATABASE_HOST") != null, "DATABASE_HOST is not set: no database to test against");
		conn = DriverManager.getConnection(IdempotencyCheck.url());
		other = DriverManager.getConnection(IdempotencyCheck.url());
		p = "junit-" + IdempotencyCheck.prefix();
	}

	@AfterAll
	static void close() throws Exception {
		if (conn != null) conn.close();
		if (other != null) other.close();
	}

	@BeforeEach
	void reset() {
		IdempotencyCheck.failures.clear();
	}

	static void passed() {
		assertEquals(new ArrayList<String>(), new ArrayList<>(IdempotencyCheck.failures), "failed checks");
	}

	@Test
	void notAutocommitIsRefusedAndNothingCommitted() throws Exception {
		IdempotencyCheck.notAutocommit(conn, other, p);
		passed();
	}

	@Test
	void busyKeyAnswers409AndClosesEveryStatement() throws Exception {
		IdempotencyCheck.busyClosesStatements(conn, other, p);
		passed();
	}

	@Test
	void storedStatusRuleAndOptionsStore() throws Exception {
		IdempotencyCheck.storeRule(conn, p);
		passed();
	}

	@Test
	void anOlderExtensionIsRefusedOncePerDatabase() throws Exception {
		IdempotencyCheck.extensionVersion(conn);
		passed();
	}
}
