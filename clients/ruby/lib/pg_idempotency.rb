# frozen_string_literal: true

# pg_idempotency: exactly-once HTTP endpoints on the idempotency PostgreSQL
# extension.  require "pg_idempotency" loads the core, the plain-PG guard and
# the Rack middleware; under Rails (Rails::Railtie defined) also the
# controller declaration; "pg_idempotency/sinatra" is Sinatra's extension.
require_relative "pg_idempotency/version"
require_relative "pg_idempotency/core"
require_relative "pg_idempotency/compat"
require_relative "pg_idempotency/guard"
require_relative "pg_idempotency/pg"
require_relative "pg_idempotency/rack"
require_relative "pg_idempotency/phases"
require_relative "pg_idempotency/phased"
require_relative "pg_idempotency/rails" if defined?(::ActionController) || defined?(::Rails::Railtie)
