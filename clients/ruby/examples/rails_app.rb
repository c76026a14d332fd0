# frozen_string_literal: true

# Example (and test server): POST /payments on a one-file Rails (API) app,
# guarded by `idempotent :create`: the key is begun on ActiveRecord's
# connection, inside ActiveRecord's transaction, so Payment.create! commits
# or rolls back with it; and POST /transfers, three phases under one key in
# lease mode (`phased`: each database phase in ActiveRecord's transaction;
# test/conformance's phased-endpoint contract).  The same contract as clients/node/examples/express.js.
# Database from DATABASE_HOST/PORT/NAME/USER; IDEMPOTENCY_BOUNCER=1: behind
# PgBouncer in transaction mode (prepared_statements: false).  Prints
# "listening <port>".
require "json"
require "net/http"
require "set"
require "logger"
ENV["RAILS_ENV"] ||= "production"
require "rails"
require "active_record/railtie"
require "action_controller/railtie"
require "pg_idempotency"
require_relative "serve"

ENV["DATABASE_URL"] = "postgres://#{ENV['DATABASE_USER']}@#{ENV['DATABASE_HOST']}:#{ENV['DATABASE_PORT']}/" \
                      "#{ENV['DATABASE_NAME']}?pool=20&prepared_statements=#{ENV['IDEMPOTENCY_BOUNCER'] != '1'}"

class PaymentsExample < Rails::Application
  config.root = __dir__
  config.api_only = true
  config.eager_load = false
  config.consider_all_requests_local = false
  config.secret_key_base = "example-only"
  config.logger = Logger.new($stderr)
  config.log_level = :warn # at :debug ActiveRecord logs every bind, the fingerprinted body too
  config.active_record.legacy_connection_handling = false
end

class Payment < ActiveRecord::Base
  self.table_name = "payment"
  attribute :amount, :string # the amount as sent: numeric keeps its scale ("12.30", not 12.3)
end

class PaymentsController < ActionController::API
  THROTTLED = Set.new

  idempotent :create, scope: "payments", user: ->(req) { req.get_header("HTTP_X_USER") }

  def create
    p = JSON.parse(request.raw_post)
    return render(json: { error: "card_declined" }, status: 402) if p["decline"]

    payment = Payment.create!(idem_key: idempotency.key, amount: p["amount"])
    Payment.connection.exec_query("SELECT pg_sleep($1)", "sleep", [p["sleep"]]) if p["sleep"]
    raise "boom" if p["boom"]

    if p["throttle"] && THROTTLED.add?(idempotency.key) # 429: rolled back, not stored
      response.set_header("Retry-After", "1")
      return render(json: { error: "rate_limited" }, status: 429)
    end
    if p["stream"] # refused: 500, rolled back
      return self.response_body = Enumerator.new { |y| y << "streamed #{payment.id}" }
    end
    return send_data("\xff\x00\xfe".b + payment.id.to_s, type: "application/octet-stream") if p["binary"]

    body = %({"status":"paid","id":#{payment.id},"amount":#{JSON.generate(p['amount'])},"note":"café ✓"})
    render body: body, status: 201, content_type: "application/json", location: "/payments/#{payment.id}"
  end
end

class TransferStep < ActiveRecord::Base
  self.table_name = "transfer_step"
end

# POST /transfers: debit (a database phase), charge (a call to
# DOWNSTREAM_URL, outside any transaction), finish (a database phase).
# X-Crash: charge / finish ends the process at once (a crash) there.
class TransfersController < ActionController::API
  def create
    p = JSON.parse(request.raw_post)
    crash = request.get_header("HTTP_X_CRASH")
    phased scope: "transfers", user: ->(req) { req.get_header("HTTP_X_USER") }, lease_seconds: 2, renew_every_seconds: 0.5 do |ph|
      ph.phase("debit") do |ctx|
        raise PgIdempotency::PhaseError.new("card_declined", permanent: true, status: 402) if p["decline"]

        TransferStep.create!(idem_key: ctx.key, step: "debit")
        TransferStep.connection.exec_query("SELECT pg_sleep($1)", "sleep", [p["sleep"]]) if p["sleep"]
        { "debited" => p["amount"] }
      end
      ph.external("charge") do |ctx|
        answer = charge(p["amount"], ctx.derive_key("charge"))
        exit!(1) if crash == "charge"
        answer
      end
      ph.phase("finish") do |ctx|
        exit!(1) if crash == "finish"
        TransferStep.create!(idem_key: ctx.key, step: "finish")
        true
      end
      ph.respond do |state|
        [201, { "Content-Type" => "application/json" },
         JSON.generate({ "status" => "done", "charge_id" => state["charge"]["charge_id"], "amount" => p["amount"] })]
      end
    end
  end

  private

  def charge(amount, key)
    uri = URI("#{ENV.fetch('DOWNSTREAM_URL')}/charge")
    res = Net::HTTP.post(uri, JSON.generate({ "amount" => amount }),
                         "Content-Type" => "application/json", "Idempotency-Key" => key)
    raise "downstream answered #{res.code}" unless res.code == "200"

    JSON.parse(res.body)
  end
end

PaymentsExample.initialize!
PaymentsExample.routes.draw do
  post "/payments", to: "payments#create"
  post "/transfers", to: "transfers#create"
end

serve(PaymentsExample, threads: 10) if $PROGRAM_NAME == __FILE__
