# frozen_string_literal: true

# PgIdempotency::Rack and the Sinatra extension against the database, called
# through Rack (Rack::MockRequest): begin, replay, mismatch, busy, invalid
# key, what is stored and what is not, streamed and oversized bodies.
require_relative "helper"
require "json"
require "rack/mock"
require "sinatra/base"
require "pg_idempotency/sinatra"

POOL = PgIdempotency::ConnectionPool.new(size: 4) { TestDB.connect }

class GuardedApp < Sinatra::Base
  set :environment, :production
  set :show_exceptions, false
  set :raise_errors, false
  register PgIdempotency::Sinatra
  set :idempotency_pool, POOL
  idempotent "/payments", scope: "rack-payments", user: ->(req) { req.get_header("HTTP_X_USER") }
  idempotent "/lenient", scope: "rack-lenient", required: false, ttl_seconds: 60
  idempotent %r{\A/small}, scope: "rack-small", max_body_bytes: 10

  post "/payments" do
    p = JSON.parse(request.body.read)
    db = idempotency.connection
    db.exec_params("INSERT INTO payment (idem_key, amount) VALUES ($1, $2)", [idempotency.key, p["amount"]])
    raise "boom" if p["boom"]
    halt Integer(p["status"]), { "Content-Type" => "text/plain" }, "status #{p['status']}" if p["status"]
    if p["stream"]
      content_type "text/plain"
      return stream { |out| out << "streamed" }
    end
    [201, { "Content-Type" => "application/json", "Location" => "/payments/1" },
     %({"ok":true,"outcome":"#{idempotency.outcome}","note":"caf\u00e9"})]
  end

  get "/payments" do
    "unguarded GET: #{idempotency.inspect}"
  end

  patch "/payments" do
    "patched"
  end

  post "/lenient" do
    idempotency ? "guarded" : "unguarded"
  end

  post "/small" do
    "x" * Integer(request.body.read)
  end
end

class RackTest < Minitest::Test
  def app
    @app ||= Rack::MockRequest.new(GuardedApp)
  end

  def post(key, body, path: "/payments", user: nil, method: :post)
    env = { input: body.is_a?(String) ? body : JSON.generate(body), "CONTENT_TYPE" => "application/json" }
    env["HTTP_IDEMPOTENCY_KEY"] = key if key
    env["HTTP_X_USER"] = user if user
    app.request(method.to_s.upcase, path, env)
  end

  def test_new_then_replay_byte_identical
    k = TestDB.fresh_key("replay")
    r1 = post(k, { amount: "1.00" })
    assert_equal 201, r1.status
    assert_nil r1["Idempotent-Replayed"]
    assert_equal '{"ok":true,"outcome":"new","note":"café"}', r1.body.force_encoding("UTF-8")
    r2 = post(%("#{k}"), { amount: "1.00" })
    assert_equal [201, r1.body.b, r1["Content-Type"], "/payments/1", "true"],
                 [r2.status, r2.body.b, r2["Content-Type"], r2["Location"], r2["Idempotent-Replayed"]]
    assert_equal [1, 1], [TestDB.payments(k), TestDB.keys(k)]
  end

  def test_mismatch_422_nothing_written
    k = TestDB.fresh_key("mismatch")
    post(k, { amount: "1.00" })
    # (test/ruby/run then checks that this card number is nowhere in the server log)
    r = post(k, { amount: "2.00", card: "4000-0000-0000-0002-never-logged" })
    assert_equal 422, r.status
    assert_equal "application/problem+json", r["Content-Type"]
    assert_equal "Idempotency-Key reused", JSON.parse(r.body)["title"]
    assert_equal 1, TestDB.payments(k)
  end

  def test_busy_409_with_retry_after_nothing_written
    k = TestDB.fresh_key("busy")
    holder = TestDB.connect
    holder.exec("BEGIN")
    holder.exec_params("SELECT outcome FROM idempotency.begin($1, $2::jsonb, $3)",
                       [k, JSON.generate(PgIdempotency.request_json("POST", "/payments", '{"amount":"1.00"}')),
                        "rack-payments"])
    r = post(k, { amount: "1.00" })
    assert_equal 409, r.status
    assert_match(/\A[1-9][0-9]*\z/, r["Retry-After"])
    assert_equal 0, TestDB.payments(k)
    holder.exec("ROLLBACK")
    assert_equal 201, post(k, { amount: "1.00" }).status
  ensure
    holder&.close
  end

  def test_invalid_and_missing_keys_400
    r = post('"unterminated', { amount: "1.00" })
    assert_equal [400, "Invalid Idempotency-Key"], [r.status, JSON.parse(r.body)["title"]]
    long = "x" * 300
    r = post(long, { amount: "1.00" })
    assert_equal 400, r.status # IK003 from the extension
    assert_match(/255|long/i, JSON.parse(r.body)["detail"])
    assert_equal 0, TestDB.payments(long)
    r = post(nil, { amount: "1.00" })
    assert_equal [400, "Idempotency-Key missing"], [r.status, JSON.parse(r.body)["title"]]
  end

  def test_handler_error_500_rolled_back_not_stored
    k = TestDB.fresh_key("boom")
    assert_equal 500, post(k, { amount: "1.00", boom: true }).status
    assert_equal [0, 0], [TestDB.payments(k), TestDB.keys(k)]
    assert_equal 201, post(k, { amount: "1.00" }).status
  end

  def test_status_rules_5xx_429_409_not_stored_4xx_stored
    [503, 429, 409].each do |status|
      k = TestDB.fresh_key("s#{status}")
      assert_equal status, post(k, { amount: "1.00", status: status }).status
      assert_equal [0, 0], [TestDB.payments(k), TestDB.keys(k)], "status #{status}"
    end
    k = TestDB.fresh_key("s404")
    assert_equal 404, post(k, { amount: "1.00", status: 404 }).status
    r = post(k, { amount: "1.00", status: 404 })
    assert_equal [404, "true", "status 404"], [r.status, r["Idempotent-Replayed"], r.body]
    assert_equal 1, TestDB.payments(k)
  end

  def test_streamed_body_refused_rolled_back
    k = TestDB.fresh_key("stream")
    r = post(k, { amount: "1.00", stream: true })
    assert_equal 500, r.status
    assert_match(/streamed response body .* cannot be stored/, JSON.parse(r.body)["detail"])
    assert_equal [0, 0], [TestDB.payments(k), TestDB.keys(k)]
  end

  def test_body_over_max_body_bytes_refused
    k = TestDB.fresh_key("big")
    assert_equal 200, post(k, "10", path: "/small").status
    k = TestDB.fresh_key("big")
    r = post(k, "11", path: "/small")
    assert_equal 500, r.status
    assert_match(/11 bytes, more than max_body_bytes \(10\)/, JSON.parse(r.body)["detail"])
    assert_equal 0, TestDB.keys(k)
  end

  def test_scope_per_user
    k = TestDB.fresh_key("user")
    a = post(k, { amount: "1.00" }, user: "alice")
    b = post(k, { amount: "1.00" }, user: "bob")
    assert_equal [201, 201, nil], [a.status, b.status, b["Idempotent-Replayed"]]
    scopes = TestDB.value("SELECT string_agg(scope, ',' ORDER BY scope) FROM idempotency.idempotency_key WHERE key = $1", [k])
    assert_equal "rack-payments|user:alice,rack-payments|user:bob", scopes
  end

  def test_methods_get_unguarded_patch_guarded
    r = post(nil, "", method: :get)
    assert_equal [200, "unguarded GET: nil"], [r.status, r.body]
    assert_equal 400, post(nil, {}, method: :patch).status
    k = TestDB.fresh_key("patch")
    assert_equal 200, post(k, {}, method: :patch).status
    assert_equal "true", post(k, {}, method: :patch)["Idempotent-Replayed"]
  end

  def test_required_false_and_ttl_seconds
    assert_equal [200, "unguarded"], [post(nil, {}, path: "/lenient").status, post(nil, {}, path: "/lenient").body]
    k = TestDB.fresh_key("ttl")
    assert_equal "guarded", post(k, {}, path: "/lenient").body
    ttl = TestDB.value("SELECT extract(epoch FROM expires_at - created_at)::int FROM idempotency.idempotency_key " \
                       "WHERE key = $1", [k])
    assert_equal 60, ttl.to_i
  end

  def test_key_of_another_client_replayed
    # begun and completed as the Node client does (its request and response
    # shapes; key order differs): the Ruby middleware replays it
    k = TestDB.fresh_key("node")
    request = '{"path":"/payments","body":{"amount":"7.00"},"method":"POST"}'
    response = '{"status":201,"headers":{"Content-Type":"application/json","Location":"/payments/9"},' \
               '"body":"{\"id\":9,\"note\":\"café ✓\"}"}'
    conn = TestDB.connect
    conn.transaction do |c|
      c.exec_params("SELECT idempotency.begin($1, $2::jsonb, $3)", [k, request, "rack-payments"])
      c.exec_params("SELECT idempotency.complete($1, $2::jsonb, $3)", [k, response, "rack-payments"])
    end
    r = post(k, '{"amount": "7.00"}')
    assert_equal [201, '{"id":9,"note":"café ✓"}', "/payments/9", "true"],
                 [r.status, r.body.force_encoding("UTF-8"), r["Location"], r["Idempotent-Replayed"]]
    assert_equal 0, TestDB.payments(k)
  ensure
    conn&.close
  end

  def test_headers_store_and_request_options
    calls = 0
    inner = lambda do |env|
      calls += 1
      [Integer(env["QUERY_STRING"][/s=(\d+)/, 1]), { "Content-Type" => "text/plain", "ETag" => "\"v#{calls}\"", "X-Other" => "x" },
       ["call #{calls}"]]
    end
    guarded = Rack::MockRequest.new(PgIdempotency::Rack.new(
      inner, pool: POOL, scope: "rack-options", headers: ["ETag"],
      store: ->(status) { status != 202 }, request: ->(req) { { "only" => req.path } }
    ))
    k = TestDB.fresh_key("options")
    r1 = guarded.post("/o?s=200", "HTTP_IDEMPOTENCY_KEY" => k, input: "a")
    # another body and query, one fingerprint (request: the path only): a replay
    r2 = guarded.post("/o?s=200&x=1", "HTTP_IDEMPOTENCY_KEY" => k, input: "b")
    assert_equal ["call 1", "\"v1\"", "true", nil], [r2.body, r2["ETag"], r2["Idempotent-Replayed"], r2["X-Other"]]
    assert_equal 1, calls
    # store: refuses 202 -> not stored, the resend runs again
    k2 = TestDB.fresh_key("options")
    2.times { guarded.post("/o?s=202", "HTTP_IDEMPOTENCY_KEY" => k2) }
    assert_equal [3, 0], [calls, TestDB.keys(k2)]
    assert_equal 200, r1.status
  end

  def test_plain_rack_app_and_one_pg_connection
    conn = TestDB.connect
    inner = lambda do |env|
      env["idempotency"].connection.exec_params("INSERT INTO payment (idem_key) VALUES ($1)", [env["idempotency"].key])
      [201, { "Content-Type" => "text/plain" }, ["made"]]
    end
    guarded = Rack::MockRequest.new(PgIdempotency::Rack.new(inner, pool: conn, scope: "rack-plain"))
    k = TestDB.fresh_key("plain")
    r1 = guarded.post("/anything", "HTTP_IDEMPOTENCY_KEY" => k, input: "x")
    r2 = guarded.post("/anything", "HTTP_IDEMPOTENCY_KEY" => k, input: "x")
    assert_equal [201, nil, 201, "true", 1], [r1.status, r1["Idempotent-Replayed"], r2.status, r2["Idempotent-Replayed"],
                                               TestDB.payments(k)]
    assert_raises(ArgumentError) { PgIdempotency::Rack.new(inner, scope: "s") }
  ensure
    conn&.close
  end
end
