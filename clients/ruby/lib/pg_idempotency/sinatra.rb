# frozen_string_literal: true

# sinatra.rb: one line per endpoint in a Sinatra app.
#
#   register PgIdempotency::Sinatra
#   set :idempotency_pool, POOL                       # once per app
#   idempotent "/payments", scope: "payments"          # per endpoint
#   post "/payments" do
#     idempotency.connection.exec_params(...)           # the guarded transaction
#   end
#   post "/transfers" do                                 # phases (lease mode)
#     phased scope: "transfers", lease_seconds: 2 do |p|
#       p.phase("debit") { |ctx| ... }                   # ctx.connection: its transaction
#       p.external("charge") { |ctx| ... }               # ctx.derive_key("charge")
#       p.respond { |state| [201, { ... }, body] }
#     end
#   end
#
# `idempotent PATH, **options` is `use PgIdempotency::Rack, path: PATH, ...`
# with PATH a Sinatra pattern ("/orders/:id/pay") and the app's
# idempotency_pool; `idempotency` in a route is env["idempotency"].
require "sinatra/base"
require_relative "rack"
require_relative "pg"
require_relative "phased"

module PgIdempotency
  module Sinatra
    module Helpers
      # the guarded request's PgIdempotency::Context (nil when unguarded)
      def idempotency
        env["idempotency"]
      end

      # phased(scope:, **options) { |p| p.phase(...); p.external(...);
      # p.respond { |state| [status, headers, body] } } -> the Rack answer:
      # the route's phases under its Idempotency-Key in lease mode, on the
      # app's idempotency_pool (or pool:), with the guard's HTTP rules
      # (PgIdempotency::PhasedRoute)
      def phased(pool: nil, **options, &block)
        pool ||= settings.idempotency_pool
        raise ArgumentError, "phased: set :idempotency_pool first, or pass pool:" unless pool

        answer = PgIdempotency::PhasedRoute.new(pool, **options).call(request, &block)
        headers = answer.headers.dup
        headers["Idempotent-Replayed"] = "true" if answer.replayed
        headers["Content-Length"] = answer.body.bytesize.to_s
        [answer.status, headers, [answer.body]]
      end
    end

    def self.registered(app)
      app.helpers Helpers
      app.set :idempotency_pool, nil unless app.respond_to?(:idempotency_pool)
    end

    def idempotent(path = nil, pool: nil, **options)
      pool ||= settings.idempotency_pool
      unless pool || options[:transactions]
        raise ArgumentError, "idempotent #{path.inspect}: set :idempotency_pool first, or pass pool:"
      end

      pattern = path.is_a?(String) ? Mustermann.new(path) : path
      use PgIdempotency::Rack, pool: pool, path: pattern, **options
    end
  end
end
