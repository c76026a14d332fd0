#!/usr/bin/env bash
# The Sinatra example app (clients/ruby/examples/sinatra_app.rb) on the pg_idempotency
# gem built offline and installed into a fresh GEM_HOME (see run.sh there).
# debian: bookworm
# packages: ruby ruby-pg ruby-rack ruby-rails ruby-sinatra puma
exec "$(dirname "$0")/../../../clients/ruby/examples/run.sh" sinatra sinatra_app.rb
