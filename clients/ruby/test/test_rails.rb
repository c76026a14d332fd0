# frozen_string_literal: true

# Rails (ActionController + ActiveRecord) over real HTTP (Puma on a free
# port, Net::HTTP): `idempotent :create` guards on ActiveRecord's connection
# inside ActiveRecord's transaction, so Payment.create! commits with the key
# and rolls back with a handler error; replay, mismatch, busy, invalid key,
# a streamed response refused, a guard nested in the application's own
# transaction (a savepoint).
require_relative "helper"
require "json"
require "net/http"
require "logger"
ENV["RAILS_ENV"] ||= "test"
require "rails"
require "active_record/railtie"
require "action_controller/railtie"
require "pg_idempotency/rails"
require "puma"
require "puma/server"

db = TestDB.params
ENV["DATABASE_URL"] = "postgres://#{db[:user]}@#{db[:host]}:#{db[:port]}/#{db[:dbname]}" \
                      "?pool=5&prepared_statements=#{ENV['IDEMPOTENCY_BOUNCER'] != '1'}"

class TestRailsApp < Rails::Application
  config.root = __dir__
  config.api_only = true
  config.eager_load = false
  config.consider_all_requests_local = false
  config.secret_key_base = "test-only"
  config.logger = Logger.new(nil)
  config.hosts.clear
  config.active_record.legacy_connection_handling = false
end

class Payment < ActiveRecord::Base
  self.table_name = "payment"
end

class PaymentsController < ActionController::API
  class Declined < StandardError; end
  rescue_from(Declined) { render json: { error: "declined" }, status: 402 }

  idempotent :create, :streamed, scope: "rails-payments", lock_wait_seconds: 0.05
  idempotent :nested, scope: "rails-nested"

  def create
    p = JSON.parse(request.raw_post)
    payment = Payment.create!(idem_key: idempotency.key, amount: p["amount"])
    raise "boom" if p["boom"]
    raise Declined if p["declined"]
    return head(Integer(p["status"])) if p["status"]

    render json: { id: payment.id, outcome: idempotency.outcome, attempts: idempotency.attempts,
                   same_connection: idempotency.connection.equal?(Payment.connection) },
           status: :created, location: "/payments/#{payment.id}"
  end

  def streamed
    Payment.create!(idem_key: idempotency.key, amount: 1)
    self.response_body = Enumerator.new { |y| y << "streamed" }
  end

  def nested
    Payment.create!(idem_key: idempotency.key, amount: 1)
    render plain: "nested"
  end

  def index
    render plain: "unguarded #{idempotency.inspect}"
  end
end

class TransferStep < ActiveRecord::Base
  self.table_name = "transfer_step"
end

# phases on ActiveRecord: each database phase in ActiveRecord's transaction
class TransfersController < ActionController::API
  def create
    p = JSON.parse(request.raw_post)
    phased scope: "rails-transfers", lease_seconds: 1 do |ph|
      ph.phase("debit") do |ctx|
        raise PgIdempotency::PhaseError.new("card_declined", permanent: true, status: 402) if p["decline"]

        TransferStep.create!(idem_key: ctx.key, step: "debit")
        TransferStep.connection.exec_query("SELECT pg_sleep($1)", "sleep", [p["sleep"]]) if p["sleep"]
        { "same_connection" => ctx.connection.equal?(TransferStep.connection) }
      end
      ph.external("charge") { |ctx| { "charge_id" => ctx.derive_key("charge"), "connection" => ctx.connection.inspect } }
      ph.phase("finish") do |ctx|
        TransferStep.create!(idem_key: ctx.key, step: "finish")
        raise "boom" if p["boom"]

        ctx.outcome
      end
      ph.respond do |state|
        [201, { "Content-Type" => "application/json", "Location" => "/transfers/#{ctx_id(state)}" },
         JSON.generate(state)]
      end
    end
  end

  private

  def ctx_id(state)
    state["charge"]["charge_id"]
  end
end

TestRailsApp.initialize!
ActiveRecord::Base.connection.execute(
  "CREATE TABLE IF NOT EXISTS transfer_step (id bigserial PRIMARY KEY, idem_key text NOT NULL, step text NOT NULL)"
)
TestRailsApp.routes.draw do
  post "/transfers", to: "transfers#create"
  post "/payments", to: "payments#create"
  post "/streamed", to: "payments#streamed"
  post "/nested", to: "payments#nested"
  get "/payments", to: "payments#index"
end

SERVER = Puma::Server.new(TestRailsApp, Puma::Events.strings, min_threads: 0, max_threads: 4)
SERVER.add_tcp_listener("127.0.0.1", 0)
SERVER.run
PORT = SERVER.connected_ports.first
Minitest.after_run { SERVER.stop(true) }

class RailsTest < Minitest::Test
  def post(key, body, path: "/payments")
    req = Net::HTTP::Post.new(path, "Content-Type" => "application/json")
    req["Idempotency-Key"] = key if key
    req.body = JSON.generate(body)
    Net::HTTP.start("127.0.0.1", PORT) { |h| h.request(req) }
  end

  def test_model_write_commits_with_the_key_then_replays
    k = TestDB.fresh_key("rails")
    r1 = post(k, { amount: "10.00" })
    assert_equal "201", r1.code
    j = JSON.parse(r1.body)
    assert_equal ["new", 1, true], [j["outcome"], j["attempts"], j["same_connection"]]
    assert_equal [1, 1], [TestDB.payments(k), TestDB.keys(k)]
    r2 = post(k, { amount: "10.00" })
    assert_equal ["201", r1.body, r1["Content-Type"], r1["Location"], "true"],
                 [r2.code, r2.body, r2["Content-Type"], r2["Location"], r2["Idempotent-Replayed"]]
    assert_equal 1, TestDB.payments(k)
  end

  def test_handler_error_rolls_back_the_model_write
    k = TestDB.fresh_key("rails-boom")
    r = post(k, { amount: "11.00", boom: true })
    assert_equal "500", r.code
    assert_equal [0, 0], [TestDB.payments(k), TestDB.keys(k)]
    assert_equal "201", post(k, { amount: "11.00" }).code
    assert_equal 1, TestDB.payments(k)
  end

  def test_rescue_from_answer_is_not_stored
    k = TestDB.fresh_key("rails-rescued")
    assert_equal "402", post(k, { amount: "1.00", declined: true }).code
    assert_equal [0, 0], [TestDB.payments(k), TestDB.keys(k)]
  end

  def test_5xx_and_429_not_stored_4xx_stored
    %w[503 429].each do |s|
      k = TestDB.fresh_key("rails-#{s}")
      assert_equal s, post(k, { amount: "1.00", status: s }).code
      assert_equal [0, 0], [TestDB.payments(k), TestDB.keys(k)]
    end
    k = TestDB.fresh_key("rails-410")
    assert_equal "410", post(k, { amount: "1.00", status: 410 }).code
    assert_equal ["410", "true"], post(k, { amount: "1.00", status: 410 }).then { |r| [r.code, r["Idempotent-Replayed"]] }
    assert_equal 1, TestDB.payments(k)
  end

  def test_mismatch_422_nothing_written
    k = TestDB.fresh_key("rails-mismatch")
    post(k, { amount: "1.00" })
    r = post(k, { amount: "2.00" })
    assert_equal ["422", "application/problem+json"], [r.code, r["Content-Type"]]
    assert_equal 1, TestDB.payments(k)
  end

  def test_busy_409_with_retry_after
    k = TestDB.fresh_key("rails-busy")
    holder = TestDB.connect
    holder.exec("BEGIN")
    holder.exec_params("SELECT idempotency.begin($1, $2::jsonb, $3)",
                       [k, JSON.generate(PgIdempotency.request_json("POST", "/payments", '{"amount":"1.00"}')),
                        "rails-payments"])
    r = post(k, { amount: "1.00" })
    assert_equal "409", r.code
    assert_match(/\A[1-9][0-9]*\z/, r["Retry-After"])
    assert_equal 0, TestDB.payments(k)
  ensure
    holder&.close
  end

  def test_invalid_and_missing_keys_400
    assert_equal "400", post('"bad', { amount: "1.00" }).code
    r = post("y" * 256, { amount: "1.00" })
    assert_equal ["400", "Invalid Idempotency-Key"], [r.code, JSON.parse(r.body)["title"]]
    assert_equal 0, TestDB.payments("y" * 256)
    assert_equal ["400", "Idempotency-Key missing"], post(nil, { amount: "1.00" }).then { |x| [x.code, JSON.parse(x.body)["title"]] }
    r = Net::HTTP.get_response(URI("http://127.0.0.1:#{PORT}/payments"))
    assert_equal ["200", "unguarded nil"], [r.code, r.body]
  end

  def test_streamed_response_refused_and_rolled_back
    k = TestDB.fresh_key("rails-stream")
    r = post(k, {}, path: "/streamed")
    assert_equal "500", r.code
    assert_match(/streamed response body \(Enumerator\) cannot be stored/, JSON.parse(r.body)["detail"])
    assert_equal [0, 0], [TestDB.payments(k), TestDB.keys(k)]
  end

  def test_live_controller_refused_at_declaration
    e = assert_raises(ArgumentError) do
      Class.new(ActionController::Base) do
        include ActionController::Live
        idempotent :index, scope: "x"
      end
    end
    assert_match(/ActionController::Live/, e.message)
  end

  def test_inside_the_applications_transaction_a_savepoint
    # the application's own transaction around the request (say, a test's
    # or a middleware's): the guard is a savepoint in it, and the outer
    # rollback takes the key and the model write with it
    k = TestDB.fresh_key("rails-nested")
    env = Rack::MockRequest.env_for("/nested", method: "POST", input: "{}", "HTTP_IDEMPOTENCY_KEY" => k)
    status = nil
    ActiveRecord::Base.transaction do
      status, = TestRailsApp.call(env)
      assert_equal 1, Payment.where(idem_key: k).count
      assert_equal 1, ActiveRecord::Base.connection.select_value(
        ActiveRecord::Base.sanitize_sql(["SELECT count(*) FROM idempotency.idempotency_key WHERE key = ?", k])
      )
      raise ActiveRecord::Rollback
    end
    assert_equal 200, status
    assert_equal [0, 0], [TestDB.payments(k), TestDB.keys(k)]
  end

  def steps(key)
    TestDB.value("SELECT string_agg(step, ',' ORDER BY id) FROM transfer_step WHERE idem_key = $1", [key]).to_s
  end

  def test_phased_model_writes_commit_per_phase_then_replay
    k = TestDB.fresh_key("rails-phased")
    r1 = post(k, { amount: "1.00" }, path: "/transfers")
    assert_equal "201", r1.code
    derived = TestDB.value("SELECT idempotency.derive_key($1, 'charge', 'rails-transfers')", [k])
    assert_equal({ "debit" => { "same_connection" => true }, "charge" => { "charge_id" => derived, "connection" => "nil" },
                   "finish" => "new" }, JSON.parse(r1.body))
    assert_equal ["application/json", "/transfers/#{derived}", nil],
                 [r1["Content-Type"], r1["Location"], r1["Idempotent-Replayed"]]
    r2 = post(k, { amount: "1.00" }, path: "/transfers")
    assert_equal ["201", r1.body, r1["Content-Type"], r1["Location"], "true"],
                 [r2.code, r2.body, r2["Content-Type"], r2["Location"], r2["Idempotent-Replayed"]]
    assert_equal "debit,finish", steps(k)
    assert_equal "422", post(k, { amount: "2.00" }, path: "/transfers").code
  end

  def test_phased_error_rolls_back_its_phase_and_the_resend_resumes
    k = TestDB.fresh_key("rails-phased-boom")
    assert_equal "500", post(k, { amount: "1.00", boom: true }, path: "/transfers").code
    assert_equal "debit", steps(k) # finish's model write rolled back with its phase
    assert_equal "500", post(k, { amount: "1.00", boom: true }, path: "/transfers").code
    assert_equal ["debit", "failed"], [steps(k), TestDB.value("SELECT status FROM idempotency.idempotency_key WHERE key = $1", [k])]
  end

  def test_phased_decline_402_stored_and_replayed
    k = TestDB.fresh_key("rails-phased-decline")
    r1 = post(k, { amount: "1.00", decline: true }, path: "/transfers")
    assert_equal ["402", '{"error":"card_declined"}', "application/json"], [r1.code, r1.body, r1["Content-Type"]]
    r2 = post(k, { amount: "1.00", decline: true }, path: "/transfers")
    assert_equal ["402", r1.body, "true"], [r2.code, r2.body, r2["Idempotent-Replayed"]]
    assert_equal "", steps(k)
  end

  def test_phased_busy_409_and_missing_key_400
    k = TestDB.fresh_key("rails-phased-busy")
    t = Thread.new { post(k, { amount: "1.00", sleep: 2 }, path: "/transfers") }
    sleep 1.3 # past the first lease (1 s): only its renewals (on a connection of the model's pool) hold the key
    r = post(k, { amount: "1.00", sleep: 2 }, path: "/transfers")
    assert_equal "409", r.code
    assert_match(/\A[1-9][0-9]*\z/, r["Retry-After"])
    assert_equal "201", t.value.code
    assert_equal "400", post(nil, { amount: "1.00" }, path: "/transfers").code
  end

  def test_run_phases_on_active_record_refused_inside_a_transaction
    ActiveRecord::Base.transaction do
      e = assert_raises(ArgumentError) do
        PgIdempotency.run_phases(ActiveRecord::Base, key: "k", phases: [PgIdempotency::Phase.new("a") { 1 }],
                                                     response: ->(s) { s })
      end
      assert_match(/open transaction/, e.message)
    end
  end
end
