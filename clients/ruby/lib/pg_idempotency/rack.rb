# frozen_string_literal: true

# rack.rb: PgIdempotency::Rack, the Rack middleware (Sinatra, Roda, Hanami,
# plain Rack; Rails has the controller declaration in rails.rb).
#
#   use PgIdempotency::Rack, pool: POOL, path: "/payments", scope: "payments"
#
# For a guarded request (by default POST and PATCH, on `path` when given) it
# reads the Idempotency-Key, fingerprints the request, begins the key in a
# transaction on a pooled connection, calls the app with env["idempotency"]
# (a PgIdempotency::Context: key, scope, outcome, attempts, connection) and
# stores the app's response with the key before the transaction commits.
# The app must answer with an Array body (what Sinatra, Rack::Response and
# most handlers give); any other body is a streamed one and is refused: the
# transaction rolls back and the client gets a 500 saying so.
require "rack"
require_relative "guard"

module PgIdempotency
  class Rack
    # app; pool: an object with `with { |conn| }` (PgIdempotency::ConnectionPool,
    # the connection_pool gem) or a PG::Connection; or transactions: a
    # PgIdempotency::ActiveRecordTransactions (or PGTransactions); path: a
    # String (exact), a Regexp or anything with ===, nil for every path;
    # methods: the guarded methods (POST, PATCH); the rest: Options.
    def initialize(app, pool: nil, transactions: nil, path: nil, methods: %w[POST PATCH], **options)
      @app = app
      @transactions = transactions || (pool && PGTransactions.new(pool))
      raise ArgumentError, "PgIdempotency::Rack: pool: or transactions: is required" unless @transactions

      @path = path
      @methods = Array(methods).map { |m| m.to_s.upcase }
      @guard = Guard.new(Options.new(**options))
    end

    def call(env)
      return @app.call(env) unless guarded?(env)

      o = @guard.options
      begin
        key = PgIdempotency.parse_key(env["HTTP_IDEMPOTENCY_KEY"])
      rescue InvalidKey => e
        return respond(PgIdempotency.invalid_key(e.message))
      end
      if key.nil?
        return @app.call(env) unless o.required

        return respond(PgIdempotency.missing_key)
      end
      request = ::Rack::Request.new(env)
      scope = o.scope_for(request)
      fingerprint = o.request ? o.request.call(request) : PgIdempotency.request_json(
        request.request_method, full_path(env), read_body(env)
      )
      result = nil
      answer = @guard.run(@transactions, key, scope, fingerprint) do |context|
        env["idempotency"] = context
        status, headers, body = @app.call(env)
        bytes = buffer(body)
        result = [status, headers, [bytes]]
        Captured.new(status.to_i, ->(name) { PgIdempotency.header(headers, name) }, bytes)
      end
      answer ? respond(answer) : result
    end

    private

    def guarded?(env)
      @methods.include?(env["REQUEST_METHOD"]) && (@path.nil? || @path === env["PATH_INFO"]) # rubocop:disable Style/CaseEquality
    end

    def full_path(env)
      path = "#{env['SCRIPT_NAME']}#{env['PATH_INFO']}"
      qs = env["QUERY_STRING"].to_s
      qs.empty? ? path : "#{path}?#{qs}"
    end

    def read_body(env)
      input = env["rack.input"]
      return "" unless input

      input.rewind if input.respond_to?(:rewind)
      body = input.read.to_s
      input.rewind if input.respond_to?(:rewind)
      body.b
    end

    # the body's bytes; a body that is not an Array of Strings is refused
    def buffer(body)
      unless body.is_a?(Array) && body.all? { |part| part.is_a?(String) }
        body.close if body.respond_to?(:close)
        raise UnstorableResponse, "a streamed response body (#{body.class}) cannot be stored for replay; " \
                                  "answer with an Array body"
      end
      body.join.b
    end

    def respond(answer)
      headers = answer.headers.dup
      headers["Idempotent-Replayed"] = "true" if answer.replayed
      headers["Content-Length"] = answer.body.bytesize.to_s
      [answer.status, headers, [answer.body]]
    end
  end
end
