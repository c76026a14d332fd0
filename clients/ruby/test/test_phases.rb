# frozen_string_literal: true

# Phases: PgIdempotency.run_phases on a pool of PG::Connection (lease-mode
# begin, a transaction per database phase with its checkpoint, an external
# phase checkpointed in autocommit, the last phase completing the key, a
# crash resumed after the last checkpoint, a permanent error stored, a
# takeover refused with IK004, the lease renewed while a phase runs), and
# Sinatra's `phased` helper through Rack (the guard's HTTP rules).
require_relative "helper"
require "json"
require "rack/mock"
require "sinatra/base"
require "pg_idempotency/sinatra"

PHASE_POOL = PgIdempotency::ConnectionPool.new(size: 6) { TestDB.connect }
TestDB.connect.tap do |c|
  c.exec("CREATE TABLE IF NOT EXISTS transfer_step (id bigserial PRIMARY KEY, idem_key text NOT NULL, step text NOT NULL)")
  c.close
end

# A crash: not a StandardError, so run_phases records no failure (as when
# the process dies); the lease has to lapse before a resend goes on.
class Crash < Exception; end # rubocop:disable Lint/InheritException

module Steps
  module_function

  def steps(key)
    TestDB.value("SELECT string_agg(step, ',' ORDER BY id) FROM transfer_step WHERE idem_key = $1", [key]).to_s
  end

  def status(key)
    TestDB.value("SELECT status FROM idempotency.idempotency_key WHERE key = $1", [key])
  end
end

class PhasesTest < Minitest::Test
  def phases(calls, fail_in: nil)
    [
      PgIdempotency::Phase.new("debit") do |ctx|
        calls << "debit"
        ctx.connection.exec_params("INSERT INTO transfer_step (idem_key, step) VALUES ($1, 'debit')", [ctx.key])
        raise "debit failed" if fail_in == "debit"

        { debited: "1.00" }
      end,
      PgIdempotency::Phase.new("charge", external: true) do |ctx|
        calls << "charge"
        raise "no connection for an external phase" unless ctx.connection.nil?

        { "charge_id" => "ch_#{ctx.derive_key('charge')}", "debited" => ctx.state["debit"]["debited"] }
      end,
      PgIdempotency::Phase.new("finish") do |ctx|
        calls << "finish"
        ctx.connection.exec_params("INSERT INTO transfer_step (idem_key, step) VALUES ($1, 'finish')", [ctx.key])
        raise "finish failed" if fail_in == "finish"

        nil
      end
    ]
  end

  def run_them(key, calls, **opts)
    PgIdempotency.run_phases(PHASE_POOL, key: key, scope: "ruby-phases", request: { "amount" => "1.00" },
                                         phases: phases(calls, fail_in: opts.delete(:fail_in)),
                                         response: ->(state) { { "charge" => state["charge"]["charge_id"] } }, **opts)
  end

  def test_new_then_replay
    k = TestDB.fresh_key("ph-new")
    calls = []
    r = run_them(k, calls)
    assert_equal %w[new debit charge finish], [r.outcome] + calls
    derived = TestDB.value("SELECT idempotency.derive_key($1, 'charge', 'ruby-phases')", [k])
    assert_equal({ "charge" => "ch_#{derived}" }, r.response)
    assert_equal ["debit,finish", "completed"], [Steps.steps(k), Steps.status(k)]
    r2 = run_them(k, calls)
    assert_equal ["replay", { "charge" => "ch_#{derived}" }, 3], [r2.outcome, r2.response, calls.length]
  end

  def test_error_fails_retryably_and_the_resend_resumes_after_the_last_checkpoint
    k = TestDB.fresh_key("ph-retry")
    calls = []
    e = assert_raises(RuntimeError) { run_them(k, calls, fail_in: "finish") }
    assert_equal "finish failed", e.message
    assert_equal ["debit", "failed"], [Steps.steps(k), Steps.status(k)] # finish's insert rolled back
    calls.clear
    r = run_them(k, calls)
    assert_equal ["retry", "charge", %w[finish], 2], [r.outcome, r.resumed_from, calls, r.attempts]
    assert_equal "debit,finish", Steps.steps(k)
  end

  def test_crash_resumed_after_the_lease_lapses_with_the_state_restored
    k = TestDB.fresh_key("ph-crash")
    calls = []
    assert_raises(Crash) do
      run_them(k, calls, lease_seconds: 0.4, after_commit: ->(name) { raise Crash if name == "charge" })
    end
    assert_equal "in_progress", Steps.status(k)
    e = assert_raises(PG::Error) { run_them(k, []) } # the lease still holds
    assert_equal "IK002", PgIdempotency.sqlstate(e)
    sleep 0.5
    calls.clear
    r = run_them(k, calls)
    derived = TestDB.value("SELECT idempotency.derive_key($1, 'charge', 'ruby-phases')", [k])
    assert_equal ["retry", "charge", %w[finish], { "charge" => "ch_#{derived}" }],
                 [r.outcome, r.resumed_from, calls, r.response]
    assert_equal "debit,finish", Steps.steps(k)
  end

  def test_permanent_error_stored_and_replayed
    k = TestDB.fresh_key("ph-perm")
    declined = [PgIdempotency::Phase.new("debit") do |ctx|
      ctx.connection.exec_params("INSERT INTO transfer_step (idem_key, step) VALUES ($1, 'debit')", [ctx.key])
      raise PgIdempotency::PhaseError.new("card_declined", permanent: true)
    end]
    run = -> { PgIdempotency.run_phases(PHASE_POOL, key: k, phases: declined, response: ->(_s) { {} }) }
    assert_raises(PgIdempotency::PhaseError) { run.call }
    assert_equal ["", "failed"], [Steps.steps(k), Steps.status(k)]
    r = run.call
    assert_equal ["replay", "failed", { "error" => "card_declined" }], [r.outcome, r.status, r.response]
  end

  def test_lease_renewed_while_a_phase_runs
    k = TestDB.fresh_key("ph-renew")
    slow = [PgIdempotency::Phase.new("slow") do |ctx|
      ctx.connection.exec("SELECT pg_sleep(1.2)")
      ctx.taken_over?
    end]
    t = Thread.new do
      PgIdempotency.run_phases(PHASE_POOL, key: k, phases: slow, response: lambda(&:itself),
                                           lease_seconds: 0.4, renew_every_seconds: 0.1)
    end
    sleep 0.8 # past the first lease: without renewals a begin() would take the key over
    e = assert_raises(PG::Error) { PgIdempotency.run_phases(PHASE_POOL, key: k, phases: slow, response: ->(s) { s }) }
    assert_equal "IK002", PgIdempotency.sqlstate(e)
    assert_equal({ "slow" => false }, t.value.response)
  end

  def test_taken_over_attempt_is_refused_ik004_and_stores_nothing
    k = TestDB.fresh_key("ph-zombie")
    seen = Queue.new
    zombie = [PgIdempotency::Phase.new("one") do |ctx|
      sleep 0.8 # the lease (0.3 s) lapses, no renewal (every 5 s)
      seen << ctx.taken_over?
      "zombie"
    end, PgIdempotency::Phase.new("two") { "zombie" }]
    t = Thread.new do
      PgIdempotency.run_phases(PHASE_POOL, key: k, phases: zombie, response: ->(_s) { "zombie" },
                                           lease_seconds: 0.3, renew_every_seconds: 5)
    rescue StandardError => e
      e
    end
    sleep 0.5
    winner = PgIdempotency.run_phases(PHASE_POOL, key: k, phases: [PgIdempotency::Phase.new("one") { 1 }],
                                                  response: ->(_s) { "winner" })
    assert_equal ["retry", 2, "winner"], [winner.outcome, winner.attempts, winner.response]
    err = t.value
    assert_equal "IK004", PgIdempotency.sqlstate(err)
    assert_equal false, seen.pop
    assert_equal "\"winner\"", TestDB.value("SELECT response::text FROM idempotency.idempotency_key WHERE key = $1", [k])
  end

  def test_taken_over_seen_by_the_renewal
    k = TestDB.fresh_key("ph-seen")
    seen = Queue.new
    slow = [PgIdempotency::Phase.new("one", external: true) do |ctx|
      sleep 0.9
      seen << ctx.taken_over?
      1
    end, PgIdempotency::Phase.new("two") { 2 }]
    t = Thread.new do
      PgIdempotency.run_phases(PHASE_POOL, key: k, phases: slow, response: ->(_s) { "zombie" },
                                           lease_seconds: 0.3, renew_every_seconds: 0.6)
    rescue StandardError => e
      e
    end
    # taken over at 0.4 s: the renewal at 0.6 s gets IK004
    sleep 0.4
    PgIdempotency.run_phases(PHASE_POOL, key: k, phases: [PgIdempotency::Phase.new("one") { 1 }],
                                         response: ->(_s) { "winner" })
    err = t.value
    assert_equal [true, "IK004"], [seen.pop, PgIdempotency.sqlstate(err)]
  end

  def test_bad_arguments
    assert_raises(ArgumentError) { PgIdempotency.run_phases(PHASE_POOL, key: "k", phases: [], response: ->(s) { s }) }
    dup = [PgIdempotency::Phase.new("a") { 1 }, PgIdempotency::Phase.new("a") { 2 }]
    assert_raises(ArgumentError) { PgIdempotency.run_phases(PHASE_POOL, key: "k", phases: dup, response: ->(s) { s }) }
    assert_raises(ArgumentError) do
      PgIdempotency.run_phases(TestDB.connect, key: "k", phases: dup.take(1), response: ->(s) { s })
    end
    assert_raises(ArgumentError) do
      PgIdempotency.run_phases(PHASE_POOL, key: "k", phases: dup.take(1), response: ->(s) { s }, lease_seconds: 0)
    end
  end
end

class PhasedApp < Sinatra::Base
  set :environment, :production
  set :show_exceptions, false
  set :raise_errors, false
  register PgIdempotency::Sinatra
  set :idempotency_pool, PHASE_POOL

  post "/transfers" do
    p = JSON.parse(request.body.read)
    phased scope: "rack-transfers", user: ->(req) { req.get_header("HTTP_X_USER") }, lease_seconds: 1 do |ph|
      ph.phase("debit") do |ctx|
        raise PgIdempotency::PhaseError.new("card_declined", permanent: true, status: 402) if p["decline"]
        raise PgIdempotency::PhaseError.new("refused", permanent: true) if p["refuse"]

        ctx.connection.exec_params("INSERT INTO transfer_step (idem_key, step) VALUES ($1, 'debit')", [ctx.key])
        ctx.connection.exec_params("SELECT pg_sleep($1)", [p["sleep"]]) if p["sleep"]
        { "debited" => p["amount"] }
      end
      ph.external("charge") { |ctx| { "charge_id" => ctx.derive_key("charge") } }
      ph.phase("finish") do |ctx|
        ctx.connection.exec_params("INSERT INTO transfer_step (idem_key, step) VALUES ($1, 'finish')", [ctx.key])
        raise "boom" if p["boom"]

        true
      end
      ph.respond do |state|
        next [Integer(p["status"]), { "Content-Type" => "text/plain" }, "status #{p['status']}"] if p["status"]

        [201, { "Content-Type" => "application/json", "Location" => "/transfers/1" },
         JSON.generate({ "status" => "done", "charge_id" => state["charge"]["charge_id"], "amount" => p["amount"] })]
      end
    end
  end
end

class PhasedTest < Minitest::Test
  def app
    @app ||= Rack::MockRequest.new(PhasedApp)
  end

  def post(key, body, user: nil)
    env = { input: JSON.generate(body), "CONTENT_TYPE" => "application/json" }
    env["HTTP_IDEMPOTENCY_KEY"] = key if key
    env["HTTP_X_USER"] = user if user
    app.post("/transfers", env)
  end

  def test_first_then_replay_byte_identical
    k = TestDB.fresh_key("phased")
    r1 = post(k, { amount: "12.50" })
    assert_equal [201, nil], [r1.status, r1["Idempotent-Replayed"]]
    derived = TestDB.value("SELECT idempotency.derive_key($1, 'charge', 'rack-transfers')", [k])
    assert_equal %({"status":"done","charge_id":"#{derived}","amount":"12.50"}), r1.body
    r2 = post(%("#{k}"), { amount: "12.50" })
    assert_equal [201, r1.body.b, "application/json", "/transfers/1", "true"],
                 [r2.status, r2.body.b, r2["Content-Type"], r2["Location"], r2["Idempotent-Replayed"]]
    assert_equal "debit,finish", Steps.steps(k)
  end

  def test_mismatch_422_missing_400_malformed_400
    k = TestDB.fresh_key("phased-mm")
    post(k, { amount: "1.00" })
    r = post(k, { amount: "2.00" })
    assert_equal [422, "application/problem+json"], [r.status, r["Content-Type"]]
    assert_equal 400, post(nil, { amount: "1.00" }).status
    assert_equal 400, post('"open', { amount: "1.00" }).status
    long = "x" * 300
    assert_equal 400, post(long, { amount: "1.00" }).status
    assert_equal ["debit,finish", ""], [Steps.steps(k), Steps.steps(long)]
  end

  def test_busy_409_with_retry_after
    k = TestDB.fresh_key("phased-busy")
    t = Thread.new { post(k, { amount: "1.00", sleep: 2 }) }
    sleep 1.3 # past the first lease (1 s): only its renewals hold the key
    r = post(k, { amount: "1.00", sleep: 2 })
    assert_equal 409, r.status
    assert_match(/\A[1-9][0-9]*\z/, r["Retry-After"])
    assert_equal 201, t.value.status
    assert_equal "debit,finish", Steps.steps(k)
  end

  def test_decline_402_stored_and_replayed_nothing_written
    k = TestDB.fresh_key("phased-decline")
    r1 = post(k, { amount: "1.00", decline: true })
    assert_equal [402, '{"error":"card_declined"}', "application/json"], [r1.status, r1.body, r1["Content-Type"]]
    r2 = post(k, { amount: "1.00", decline: true })
    assert_equal [402, r1.body, "true"], [r2.status, r2.body, r2["Idempotent-Replayed"]]
    assert_equal ["", "failed"], [Steps.steps(k), Steps.status(k)]
  end

  def test_permanent_error_default_400
    k = TestDB.fresh_key("phased-refuse")
    r1 = post(k, { amount: "1.00", refuse: true })
    assert_equal [400, '{"error":"refused"}', "application/json"], [r1.status, r1.body, r1["Content-Type"]]
    r2 = post(k, { amount: "1.00", refuse: true })
    assert_equal [400, r1.body, "true"], [r2.status, r2.body, r2["Idempotent-Replayed"]]
  end

  def test_error_500_not_stored_resend_resumes
    k = TestDB.fresh_key("phased-boom")
    assert_equal 500, post(k, { amount: "1.00", boom: true }).status
    assert_equal ["debit", "failed"], [Steps.steps(k), Steps.status(k)]
    r = post(k, { amount: "1.00", boom: true }.merge(boom: false))
    assert_equal 422, r.status # another body: a mismatch, even after a failure
    r = post(k, { amount: "1.00", boom: true })
    assert_equal 500, r.status
    assert_equal "debit", Steps.steps(k) # resumed after debit each time; finish rolled back
  end

  def test_5xx_and_429_from_respond_not_stored_4xx_stored
    [503, 429].each do |status|
      k = TestDB.fresh_key("phased-#{status}")
      assert_equal status, post(k, { amount: "1.00", status: status }).status
      assert_equal ["debit", "failed"], [Steps.steps(k), Steps.status(k)], "status #{status}"
    end
    k = TestDB.fresh_key("phased-404")
    assert_equal 404, post(k, { amount: "1.00", status: 404 }).status
    r = post(k, { amount: "1.00", status: 404 })
    assert_equal [404, "true", "status 404"], [r.status, r["Idempotent-Replayed"], r.body]
  end

  def test_scope_per_user
    k = TestDB.fresh_key("phased-user")
    a = post(k, { amount: "1.00" }, user: "alice")
    b = post(k, { amount: "2.00" }, user: "bob")
    assert_equal [201, 201], [a.status, b.status]
    assert_equal "debit,finish,debit,finish", Steps.steps(k)
  end
end
