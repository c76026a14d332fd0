# frozen_string_literal: true

# The compatibility rule (docs/clients.md, "Versions") on a database of its
# own whose extension is 0.5.0, then updated: the Rack middleware and
# run_phases refuse it with ExtensionVersionError, both versions in the
# message, nothing written; after ALTER EXTENSION UPDATE the next request
# goes through; the version is asked once per pool.
require_relative "helper"
require "rack/mock"

class VersionsTest < Minitest::Test
  WANT = "pg_idempotency 0.6.0 needs the idempotency extension 0.6.0 or newer; " \
         "this database has 0.5.0 (ALTER EXTENSION idempotency UPDATE; a plain install: the portable upgrade script)"

  def setup
    @db = "compat_rb_#{Process.pid}"
    admin { |c| c.exec("DROP DATABASE IF EXISTS #{@db}"); c.exec("CREATE DATABASE #{@db}") }
    @pool = PgIdempotency::ConnectionPool.new(size: 2) { PG.connect(**TestDB.params.merge(dbname: @db)) }
    @pool.with do |c|
      c.exec("CREATE EXTENSION idempotency VERSION '0.5.0'")
      c.exec("CREATE TABLE written (n int)")
    end
  end

  def teardown
    @pool&.shutdown if @pool.respond_to?(:shutdown)
    admin { |c| c.exec("DROP DATABASE IF EXISTS #{@db} WITH (FORCE)") }
  end

  def admin
    c = TestDB.connect
    yield c
  ensure
    c&.close
  end

  def app
    inner = lambda do |env|
      env["idempotency"].connection.exec("INSERT INTO written VALUES (1)")
      [201, { "Content-Type" => "text/plain" }, ["ok"]]
    end
    PgIdempotency::Rack.new(inner, pool: @pool, path: "/p", scope: "compat")
  end

  def post(app, key)
    Rack::MockRequest.new(app).post("/p", "HTTP_IDEMPOTENCY_KEY" => key, input: "{}")
  end

  def test_an_older_extension_is_refused_with_both_versions_then_asked_once_per_pool
    a = app
    e1 = assert_raises(PgIdempotency::ExtensionVersionError) { post(a, "k1") }
    e2 = assert_raises(PgIdempotency::ExtensionVersionError) do
      PgIdempotency.run_phases(@pool, key: "k2", scope: "compat",
                                      phases: [PgIdempotency::Phase.new("a") { 1 }], response: ->(_s) { {} })
    end
    [e1, e2].each do |e|
      assert_equal WANT, e.message
      assert_equal "0.5.0", e.found
      assert_equal PgIdempotency::EXTENSION_MIN, e.needed
    end
    assert_equal "0.6.0", PgIdempotency::VERSION
    @pool.with do |c|
      assert_equal "0", c.exec("SELECT count(*) FROM written").getvalue(0, 0)
      assert_equal "0", c.exec("SELECT count(*) FROM idempotency.idempotency_key").getvalue(0, 0)
      c.exec("ALTER EXTENSION idempotency UPDATE")
    end
    before = PgIdempotency.version_queries
    statuses = (0...11).map { |i| post(a, "after-#{i}").status }
    assert_equal [201] * 11, statuses
    assert_equal 1, PgIdempotency.version_queries - before, "11 requests on one pool: one version query"
  end
end
