# frozen_string_literal: true

module PgIdempotency
  VERSION = "0.6.0"
end
