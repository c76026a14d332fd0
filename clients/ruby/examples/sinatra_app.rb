# frozen_string_literal: true

# Example (and test server): POST /payments on Sinatra + ruby-pg, guarded by
# PgIdempotency::Sinatra, and POST /transfers, three phases under one key in
# lease mode (test/conformance's phased-endpoint contract).  The same contract as clients/node/examples/express.js.
# Database from DATABASE_HOST/PORT/NAME/USER (exec_params only: fine behind
# PgBouncer in transaction mode).  Prints "listening <port>".
require "json"
require "net/http"
require "set"
require "sinatra/base"
require "pg_idempotency/sinatra"
require_relative "serve"

POOL = PgIdempotency::ConnectionPool.new(size: 20) do
  PG.connect(host: ENV["DATABASE_HOST"], port: ENV["DATABASE_PORT"],
             dbname: ENV["DATABASE_NAME"], user: ENV["DATABASE_USER"])
end

class PaymentsApp < Sinatra::Base
  set :environment, :production
  set :show_exceptions, false
  set :throttled, Set.new
  register PgIdempotency::Sinatra
  set :idempotency_pool, POOL

  idempotent "/payments", scope: "payments", user: ->(req) { req.get_header("HTTP_X_USER") }

  post "/payments" do
    p = JSON.parse(request.body.read)
    return [402, { "Content-Type" => "application/json" }, '{"error":"card_declined"}'] if p["decline"]

    db = idempotency.connection
    id = db.exec_params("INSERT INTO payment (idem_key, amount) VALUES ($1, $2) RETURNING id",
                        [idempotency.key, p["amount"]]).getvalue(0, 0).to_i
    db.exec_params("SELECT pg_sleep($1)", [p["sleep"]]) if p["sleep"]
    raise "boom" if p["boom"]

    if p["throttle"] && settings.throttled.add?(idempotency.key) # 429: rolled back, not stored
      return [429, { "Content-Type" => "application/json", "Retry-After" => "1" }, '{"error":"rate_limited"}']
    end
    return stream { |out| out << "streamed #{id}" } if p["stream"] # refused: 500, rolled back
    if p["binary"]
      return [200, { "Content-Type" => "application/octet-stream" }, "\xff\x00\xfe".b + id.to_s]
    end

    body = %({"status":"paid","id":#{id},"amount":#{JSON.generate(p['amount'])},"note":"café ✓"})
    [201, { "Content-Type" => "application/json", "Location" => "/payments/#{id}" }, body]
  end
end

# POST /transfers: debit (a database phase), charge (a call to
# DOWNSTREAM_URL, outside any transaction), finish (a database phase).
# X-Crash: charge / finish ends the process at once (a crash) there.
def charge(amount, key)
  uri = URI("#{ENV.fetch('DOWNSTREAM_URL')}/charge")
  res = Net::HTTP.post(uri, JSON.generate({ "amount" => amount }),
                       "Content-Type" => "application/json", "Idempotency-Key" => key)
  raise "downstream answered #{res.code}" unless res.code == "200"

  JSON.parse(res.body)
end

class PaymentsApp
  post "/transfers" do
    p = JSON.parse(request.body.read)
    crash = request.get_header("HTTP_X_CRASH")
    phased scope: "transfers", user: ->(req) { req.get_header("HTTP_X_USER") }, lease_seconds: 2, renew_every_seconds: 0.5 do |ph|
      ph.phase("debit") do |ctx|
        raise PgIdempotency::PhaseError.new("card_declined", permanent: true, status: 402) if p["decline"]

        ctx.connection.exec_params("INSERT INTO transfer_step (idem_key, step) VALUES ($1, 'debit')", [ctx.key])
        ctx.connection.exec_params("SELECT pg_sleep($1)", [p["sleep"]]) if p["sleep"]
        { "debited" => p["amount"] }
      end
      ph.external("charge") do |ctx|
        answer = charge(p["amount"], ctx.derive_key("charge"))
        exit!(1) if crash == "charge"
        answer
      end
      ph.phase("finish") do |ctx|
        exit!(1) if crash == "finish"
        ctx.connection.exec_params("INSERT INTO transfer_step (idem_key, step) VALUES ($1, 'finish')", [ctx.key])
        true
      end
      ph.respond do |state|
        [201, { "Content-Type" => "application/json" },
         JSON.generate({ "status" => "done", "charge_id" => state["charge"]["charge_id"], "amount" => p["amount"] })]
      end
    end
  end
end

serve(PaymentsApp, threads: 10) if $PROGRAM_NAME == __FILE__
