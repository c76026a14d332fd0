# frozen_string_literal: true

# guard.rb: the guarded transaction, whatever runs it (a PG::Connection from
# a pool, ActiveRecord's connection):
#
#   BEGIN; set_config('idempotency.lock_wait', '200ms', true)   -- SET LOCAL
#   begin(key, request, scope, ttl)
#     replay      -> ROLLBACK, the stored answer is sent
#     new / retry -> the handler runs on this connection, in this transaction;
#                    an answer that `store` accepts is stored with complete(),
#                    then COMMIT; any other answer or an exception: ROLLBACK
#   IK001 -> 422, IK002 -> 409 + Retry-After, IK003 -> 400
#   40001 / 40P01 from begin() (before the handler ran): a fresh transaction,
#   `retries` times, then 503 + Retry-After; after the handler ran: 503 (a
#   Rack app or a Rails action is not run twice in one request)
#
# Every value travels as a server-side parameter (exec_params; ActiveRecord
# binds): no request body in a statement's text, so none in the server log.
require "json"
require_relative "core"
require_relative "compat"

module PgIdempotency
  # Raised inside a transaction block to roll it back without an error.
  class Rollback < StandardError; end

  # Shared settings (see README.md for each, with its default).
  class Options
    attr_reader :scope, :user, :lock_wait_seconds, :retries, :required, :header_names,
                :ttl_seconds, :store, :request, :max_body_bytes

    def initialize(scope:, user: nil, lock_wait_seconds: 0.2, retries: 3, required: true,
                   headers: [], ttl_seconds: nil, store: nil, request: nil,
                   max_body_bytes: DEFAULT_MAX_BODY_BYTES)
      raise ArgumentError, "idempotent: scope is required" if scope.nil?
      raise ArgumentError, "idempotent: lock_wait_seconds must be a number >= 0" unless
        lock_wait_seconds.is_a?(Numeric) && lock_wait_seconds >= 0
      raise ArgumentError, "idempotent: ttl_seconds must be a positive number or nil" unless
        ttl_seconds.nil? || (ttl_seconds.is_a?(Numeric) && ttl_seconds.positive?)

      @scope = scope
      @user = user
      @lock_wait_seconds = lock_wait_seconds
      @retries = Integer(retries)
      @required = required
      @header_names = DEFAULT_HEADERS.dup
      Array(headers).each do |h|
        @header_names << h.to_s unless @header_names.any? { |n| n.casecmp?(h.to_s) }
      end
      @ttl_seconds = ttl_seconds
      @store = store || PgIdempotency.method(:default_store)
      raise ArgumentError, "idempotent: store must respond to call" unless @store.respond_to?(:call)

      @request = request
      @max_body_bytes = max_body_bytes
    end

    # the scope of one request: the route's, "<scope>|user:<id>" per user
    def scope_for(request)
      s = @scope.respond_to?(:call) ? @scope.call(request) : @scope
      if @user
        u = @user.call(request)
        s = "#{s}|user:#{u}" unless u.nil? || u.to_s.empty?
      end
      s.to_s
    end

    def lock_wait_text
      "#{(@lock_wait_seconds * 1000).round}ms"
    end

    def ttl_text
      @ttl_seconds && "#{@ttl_seconds} seconds"
    end
  end

  # Guard.new(options).run(transactions, key, scope, request) { |context| Captured }
  # -> nil when the handler's own response is to be sent (stored and
  # committed, or refused by `store` and rolled back), else the Answer to
  # send instead (a replay, a 4xx for the key, a 500 for a response that
  # cannot be stored, a 503 to retry).
  class Guard
    attr_reader :options

    def initialize(options)
      @options = options
    end

    def run(transactions, key, scope, request)
      o = @options
      attempt = 0
      loop do
        ran = false
        answer = nil
        begin
          transactions.transaction do |tx|
            PgIdempotency.check_extension(compat_key(transactions)) { |sql| tx.row(sql, []) }
            tx.execute(LOCK_WAIT_SQL, [o.lock_wait_text])
            outcome, status, response, attempts = tx.row(BEGIN_SQL, [key, JSON.generate(request), scope, o.ttl_text])
            raise "idempotency.begin() returned no row" if outcome.nil?

            if outcome == "replay"
              answer = PgIdempotency.decode_response(response, status)
              raise Rollback
            end
            ran = true
            got = yield Context.new(key, scope, outcome, attempts.to_i, tx.connection)
            if o.store.call(got.status)
              if o.max_body_bytes && got.body.bytesize > o.max_body_bytes
                raise UnstorableResponse, "the response body has #{got.body.bytesize} bytes, more than " \
                                          "max_body_bytes (#{o.max_body_bytes}): it cannot be stored for replay"
              end
              stored = PgIdempotency.encode_response(got.status, got.get_header, got.body, o.header_names)
              tx.execute(COMPLETE_SQL, [key, JSON.generate(stored), scope])
            else
              raise Rollback
            end
          end
          return answer
        rescue UnstorableResponse => e
          return PgIdempotency.problem(500, "Response not stored", e.message)
        rescue StandardError => e
          state = PgIdempotency.sqlstate(e)
          raise if state.nil?

          if RETRYABLE.include?(state)
            if !ran && attempt < o.retries && !transactions.nested?
              attempt += 1
              sleep((5 * attempt + rand * 20) / 1000.0)
              next
            end
            return PgIdempotency.problem(503, "Try again", PgIdempotency.message(e), { "Retry-After" => "1" })
          end
          retry_after = state == "IK002" ? retry_after(transactions, key, scope) : "1"
          ans = PgIdempotency.error_answer(state, PgIdempotency.message(e), retry_after)
          raise if ans.nil?

          return ans
        end
      end
    end

    private

    # what the extension's version is remembered for: the pool or model
    # behind transactions (compat.rb)
    def compat_key(transactions)
      transactions.respond_to?(:compat_key) ? transactions.compat_key : transactions
    end

    # Seconds a client should wait before resending (Retry-After), from
    # idempotency.lookup(); "1" when it has nothing to say or fails.
    def retry_after(transactions, key, scope)
      v = transactions.value(LOOKUP_SQL, [key, scope])
      s = v.nil? ? 0 : Float(v)
      s.positive? ? s.ceil.to_s : "1"
    rescue StandardError
      "1"
    end
  end
end
