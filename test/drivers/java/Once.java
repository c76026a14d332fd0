// JDBC: once() as one statement in autocommit with ordinary bind parameters:
// setString (sent as varchar), setBigDecimal/setInt (typed), setObject with
// Types.OTHER for the jsonb request.  Run: java -cp postgresql.jar Once.java
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.sql.*;
import java.util.Arrays;

public class Once {
    static int failures = 0;
    static final String INSERT = "INSERT INTO drv_payment (amount, note) VALUES ($1, $2) RETURNING amount, note";
    static final String ONCE = "SELECT outcome, response->>'note' AS note, response->>'body' AS body,"
        + " response->>'status' AS status FROM idempotency.once(?, ?, ?, ?, ?)";
    static final String BODY = "{\"zeta\": 1,  \"alpha\": [1.10, 2e3],\n\t\"t\": \"caf\\u00e9 é 😀 \\\"q\\\"\"}\r\n";

    static void check(String desc, boolean cond, Object got) {
        if (!cond) failures++;
        System.out.println((cond ? "ok" : "not ok") + " - JDBC: " + desc + (cond ? "" : " (got " + got + ")"));
    }

    static ResultSet once(Connection c, String key, String request, String sql, Object a, Object b) throws SQLException {
        PreparedStatement ps = c.prepareStatement(ONCE);
        ps.setString(1, key);
        ps.setObject(2, request, Types.OTHER);
        ps.setString(3, sql);
        ps.setObject(4, a);
        ps.setObject(5, b);
        ResultSet rs = ps.executeQuery();
        rs.next();
        return rs;
    }

    static String sqlstate(Connection c, String key, String request, String sql, Object a, Object b) {
        try { once(c, key, request, sql, a, b); return "no error"; }
        catch (SQLException e) { return e.getSQLState(); }
    }

    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://localhost:" + System.getenv("PGPORT") + "/" + System.getenv("PGDATABASE");
        try (Connection c = DriverManager.getConnection(url, System.getenv("PGUSER"), "")) {
            check("autocommit is on", c.getAutoCommit(), false);
            String req = "{\"amount\": \"49.90\"}";
            ResultSet rs = once(c, "jdbc-1", req, INSERT, "49.90", "jdbc-1");
            check("new: the work ran once, its row is the response",
                  rs.getString("outcome").equals("new") && "jdbc-1".equals(rs.getString("note")), rs.getString("outcome"));
            rs = once(c, "jdbc-1", req, INSERT, "49.90", "jdbc-1");
            check("replay: the stored response comes back",
                  rs.getString("outcome").equals("replay") && "jdbc-1".equals(rs.getString("note")), rs.getString("outcome"));
            ResultSet n = c.createStatement().executeQuery("SELECT count(*) FROM drv_payment WHERE note = 'jdbc-1'");
            n.next();
            check("replay: the work did not run again", n.getInt(1) == 1, n.getInt(1));
            rs = once(c, "jdbc-4", null, "INSERT INTO drv_payment (amount, note) VALUES ($1, 'jdbc-typed-' || $2) RETURNING amount, note",
                      new BigDecimal("12.34"), Integer.valueOf(7));
            check("typed BigDecimal and int arguments",
                  rs.getString("outcome").equals("new") && "jdbc-typed-7".equals(rs.getString("note")), rs.getString("note"));

            check("another request under the same key: IK001",
                  sqlstate(c, "jdbc-1", "{\"amount\": \"1\"}", INSERT, "1", "jdbc-1").equals("IK001"), null);
            String st = sqlstate(c, "jdbc-2", null, INSERT, "lots", "jdbc-2");
            check("an error in the work: its SQLSTATE (22P02)", st.equals("22P02"), st);
            PreparedStatement lk = c.prepareStatement("SELECT status, retry_after FROM idempotency.lookup(?)");
            lk.setString(1, "jdbc-2");
            check("an error in the work: nothing stored", !lk.executeQuery().next(), null);

            String http = "SELECT idempotency.http_response(201, $1, $2::jsonb) AS r";
            String headers = "{\"Content-Type\": \"application/json\", \"Location\": \"/p/1\"}";
            once(c, "jdbc-3", null, http, BODY, headers);
            rs = once(c, "jdbc-3", null, http, BODY, headers);
            check("HTTP replay: status", rs.getString("outcome").equals("replay") && "201".equals(rs.getString("status")),
                  rs.getString("status"));
            byte[] got = rs.getString("body").getBytes(StandardCharsets.UTF_8);
            check("HTTP replay: the body byte for byte", Arrays.equals(got, BODY.getBytes(StandardCharsets.UTF_8)),
                  rs.getString("body"));

            lk.setString(1, "jdbc-1");
            ResultSet l = lk.executeQuery();
            boolean row = l.next();
            check("lookup(): completed, no retry needed",
                  row && l.getString("status").equals("completed") && l.getObject("retry_after") == null, row);
        } catch (SQLException e) {
            System.out.println("not ok - JDBC: " + e.getSQLState() + " " + e.getMessage());
            System.exit(1);
        }
        System.exit(failures == 0 ? 0 : 1);
    }
}
