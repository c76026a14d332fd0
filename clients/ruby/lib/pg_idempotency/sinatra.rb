# frozen_string_literal: true

# sinatra.rb: one line per endpoint in a Sinatra app.
#
#   register PgIdempotency::Sinatra
#   set :idempotency_pool, POOL                       # once per app
#   idempotent "/payments", scope: "payments"          # per endpoint
#   post "/payments" do
#     idempotency.connection.exec_params(...)           # the guarded transaction
#   end
#
# `idempotent PATH, **options` is `use PgIdempotency::Rack, path: PATH, ...`
# with PATH a Sinatra pattern ("/orders/:id/pay") and the app's
# idempotency_pool; `idempotency` in a route is env["idempotency"].
require "sinatra/base"
require_relative "rack"
require_relative "pg"

module PgIdempotency
  module Sinatra
    module Helpers
      # the guarded request's PgIdempotency::Context (nil when unguarded)
      def idempotency
        env["idempotency"]
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
