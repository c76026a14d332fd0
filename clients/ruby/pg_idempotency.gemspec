# frozen_string_literal: true

require_relative "lib/pg_idempotency/version"

Gem::Specification.new do |s|
  s.name        = "pg_idempotency"
  s.version     = PgIdempotency::VERSION
  s.summary     = "Exactly-once HTTP endpoints on the idempotency PostgreSQL extension (Rack, Rails, Sinatra)"
  s.description = "Rack middleware and a Rails controller declaration that run a request under its " \
                  "Idempotency-Key in the application's own PostgreSQL transaction (ActiveRecord's " \
                  "under Rails), store the response with the key and replay it byte for byte."
  s.authors     = ["idempotency developers"]
  s.license     = "PostgreSQL"
  s.required_ruby_version = ">= 2.7"
  # listed without git, so that `gem build` works from an exported tree
  s.files = Dir[File.join(__dir__, "lib", "**", "*.rb")].map { |f| f.delete_prefix("#{__dir__}/") }.sort +
            %w[README.md LICENSE pg_idempotency.gemspec]
  s.require_paths = ["lib"]
  s.add_runtime_dependency "pg", "~> 1.1"
  s.add_runtime_dependency "rack", ">= 2.0", "< 3" # Rack 3 (lower-case header names) is untested
end
