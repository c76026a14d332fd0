/*
 * The checks of FilterCheck as JUnit 5 tests (mvn package): the javax
 * IdempotencyFilter in Jetty 9.4 over real HTTP, against the database of
 * IdempotencyCheckTest (skipped without DATABASE_HOST).
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

class FilterCheckTest {
	static Connection db;
	static Connection other;
	static String p;

	@BeforeAll
	static void start() throws Exception {
		assumeTrue(System.getenv("DATABASE_HOST") != null, "DATABASE_HOST is not set: no database to test against");
		db = DriverManager.getConnection(FilterCheck.url());
		other = DriverManager.getConnection(FilterCheck.url());
		p = "junit-" + FilterCheck.prefix();
		FilterCheck.start();
	}

	@AfterAll
	static void stop() throws Exception {
		FilterCheck.stop();
		if (db != null) db.close();
		if (other != null) other.close();
	}

	@BeforeEach
	void reset() {
		FilterCheck.failures.clear();
	}

	static void passed() {
		assertEquals(new ArrayList<String>(), new ArrayList<>(FilterCheck.failures), "failed checks");
	}

	@Test
	void beginReplayMismatch() throws Exception {
		FilterCheck.beginReplayMismatch(db, p);
		passed();
	}

	@Test
	void busyKeyAnswers409WithRetryAfter() throws Exception {
		FilterCheck.busy(db, other, p);
		passed();
	}

	@Test
	void invalidKeysAnswer400() throws Exception {
		FilterCheck.invalidKeys(db, p);
		passed();
	}

	@Test
	void formBodyParameters() throws Exception {
		FilterCheck.form(db, p);
		passed();
	}

	@Test
	void handlerWritesRollBackWith5xxAnd429AndCommitWith201() throws Exception {
		FilterCheck.rollbackRules(db, p);
		passed();
	}

	@Test
	void streamedAnswersAreRefused() throws Exception {
		FilterCheck.streaming(db, p);
		passed();
	}

	@Test
	void phasedRoute() throws Exception {
		FilterCheck.phased(db, p);
		passed();
	}

	@Test
	void phasedRouteErrors() throws Exception {
		FilterCheck.phasedErrors(db, p);
		passed();
	}
}
