# frozen_string_literal: true

# phased.rb: phases behind an HTTP endpoint with the guard's HTTP rules.
# PhasedRoute#call(rack_request) { |p| p.phase(...); p.external(...);
# p.respond { |state| [status, headers, body] } } -> the Answer to send:
#
#   Idempotency-Key missing / malformed / too long     400 (problem+json)
#   begin(): IK001 422, IK002 409 + Retry-After (the lease's end), IK003 400
#   replay                     the stored status, headers, body byte for byte,
#                              Idempotent-Replayed: true
#   the phases ran             respond's answer; stored with complete() in the
#                              last phase's transaction when `store` accepts
#                              its status (by default < 500, not 408/409/425/
#                              429); otherwise sent, the key failed retryably
#                              (a resend resumes after the last checkpoint)
#   PhaseError permanent       its status/headers/body, stored with
#                              fail(retryable => false), replayed from then on
#   taken over (IK004)         409 + Retry-After: another attempt has the key
#   any other error            failed retryably, then raised: the framework's
#                              500, not stored
#
# Used by the Sinatra helper (sinatra.rb) and the Rails controller helper
# (rails.rb), both named `phased`.
require_relative "core"
require_relative "guard"
require_relative "phases"

module PgIdempotency
  # The phases of one request, declared in the `phased` block.
  class PhasesBuilder
    attr_reader :phases, :responder

    def initialize
      @phases = []
      @responder = nil
    end

    # a database phase: runs in its own transaction, its writes commit with
    # its checkpoint; the block gets a PhaseContext, returns a JSON-able result
    def phase(name, external: false, &block)
      @phases << Phase.new(name, external: external, &block)
      self
    end

    # an external phase: no transaction held open while it runs (a call to
    # another system); checkpointed in autocommit after it
    def external(name, &block)
      phase(name, external: true, &block)
    end

    # the answer, from the phases' results: the block gets the state (a Hash,
    # string keys) and returns [status, headers, body] (body a String or an
    # Array of Strings); it runs in the last phase's transaction
    def respond(&block)
      raise ArgumentError, "respond: a block is required" unless block

      @responder = block
      self
    end
  end

  # Options of a phased endpoint: the guard's (scope, user, headers,
  # ttl_seconds, store, request, max_body_bytes, retries) and the lease's.
  class PhasedOptions < Options
    attr_reader :lease_seconds, :renew_every_seconds

    def initialize(lease_seconds: 30, renew_every_seconds: nil, **options)
      if options.key?(:required) || options.key?(:lock_wait_seconds)
        raise ArgumentError, "phased: required: and lock_wait_seconds: do not apply (a phased request always " \
                             "needs its key; a duplicate in flight gets 409 at once)"
      end
      super(**options)
      raise ArgumentError, "phased: lease_seconds must be a number > 0" unless
        lease_seconds.is_a?(Numeric) && lease_seconds.positive?
      raise ArgumentError, "phased: renew_every_seconds must be a number > 0 or nil" unless
        renew_every_seconds.nil? || (renew_every_seconds.is_a?(Numeric) && renew_every_seconds.positive?)

      @lease_seconds = lease_seconds
      @renew_every_seconds = renew_every_seconds
    end
  end

  class PhasedRoute
    # A status that `store` refused: the answer is sent, nothing stored.
    class NotStored < StandardError
      attr_reader :captured

      def initialize(captured)
        super("status #{captured.status} is not stored")
        @captured = captured
      end
    end

    attr_reader :options

    # db: a pool of PG::Connection or an ActiveRecord class; options: PhasedOptions' keywords
    def initialize(db, **options)
      @db = db
      @options = PhasedOptions.new(**options)
    end

    # request: a Rack::Request (ActionDispatch::Request under Rails); the block
    # declares the phases on a PhasesBuilder; after_commit: a test hook
    def call(request, after_commit: nil)
      o = @options
      begin
        key = PgIdempotency.parse_key(request.get_header("HTTP_IDEMPOTENCY_KEY"))
      rescue InvalidKey => e
        return PgIdempotency.invalid_key(e.message)
      end
      return PgIdempotency.missing_key if key.nil?

      builder = PhasesBuilder.new
      yield builder
      raise ArgumentError, "phased: the block declared no phase" if builder.phases.empty?
      raise ArgumentError, "phased: the block declared no respond { |state| ... }" unless builder.responder

      scope = o.scope_for(request)
      fingerprint = o.request ? o.request.call(request) : PgIdempotency.request_json(
        request.request_method, full_path(request), read_body(request)
      )
      sent = nil
      respond = lambda do |state|
        sent = capture(builder.responder.call(state))
        raise NotStored, sent unless o.store.call(sent.status)

        if o.max_body_bytes && sent.body.bytesize > o.max_body_bytes
          raise UnstorableResponse, "the response body has #{sent.body.bytesize} bytes, more than " \
                                    "max_body_bytes (#{o.max_body_bytes}): it cannot be stored for replay"
        end
        PgIdempotency.encode_response(sent.status, sent.get_header, sent.body, o.header_names)
      end
      run(key, scope, fingerprint, builder.phases, respond, after_commit) { sent }
    end

    private

    def run(key, scope, fingerprint, phases, respond, after_commit)
      o = @options
      tries = 0
      begin
        result = PgIdempotency.run_phases(
          @db, key: key, scope: scope, request: fingerprint, phases: phases, response: respond,
               lease_seconds: o.lease_seconds, renew_every_seconds: o.renew_every_seconds,
               ttl_seconds: o.ttl_seconds, error_response: method(:stored_error), after_commit: after_commit
        )
        return PgIdempotency.decode_response(result.response, result.status) if result.outcome == "replay"

        sent = yield
        Answer.new(sent.status, sent.headers, sent.body, false)
      rescue NotStored => e
        Answer.new(e.captured.status, e.captured.headers, e.captured.body, false)
      rescue PhaseError => e
        raise unless e.permanent

        Answer.new(e.status, e.headers, e.body_bytes, false)
      rescue UnstorableResponse => e
        PgIdempotency.problem(500, "Response not stored", e.message)
      rescue TakenOver
        taken_over(key, scope)
      rescue StandardError => e
        state = PgIdempotency.sqlstate(e)
        raise if state.nil?
        return taken_over(key, scope) if state == "IK004"

        if RETRYABLE.include?(state)
          if tries < o.retries
            tries += 1
            sleep((5 * tries + rand * 20) / 1000.0)
            retry
          end
          return PgIdempotency.problem(503, "Try again", PgIdempotency.message(e), { "Retry-After" => "1" })
        end
        ans = PgIdempotency.error_answer(state, PgIdempotency.message(e),
                                         state == "IK002" ? retry_after(key, scope) : "1")
        raise if ans.nil?

        ans
      end
    end

    # what fail() stores: a permanent PhaseError's HTTP answer (replayed);
    # anything else {"error": message} (retried, never sent)
    def stored_error(err)
      return { "error" => err.message } unless err.is_a?(PhaseError) && err.permanent

      headers = err.headers
      PgIdempotency.encode_response(err.status, ->(name) { PgIdempotency.header(headers, name) },
                                    err.body_bytes, @options.header_names)
    end

    def taken_over(key, scope)
      PgIdempotency.problem(409, "Idempotency-Key in use",
                            "Another attempt took this Idempotency-Key over; retry later.",
                            { "Retry-After" => retry_after(key, scope) })
    end

    # seconds until the holder's lease ends (idempotency.lookup()), "1" when unknown
    def retry_after(key, scope)
      v = PhaseDB.for(@db).row(LOOKUP_SQL, [key, scope])&.first
      s = v.nil? ? 0 : Float(v)
      s.positive? ? s.ceil.to_s : "1"
    rescue StandardError
      "1"
    end

    def full_path(request)
      request.respond_to?(:original_fullpath) ? request.original_fullpath : request.fullpath
    end

    def read_body(request)
      input = request.body
      return "" unless input

      input.rewind if input.respond_to?(:rewind)
      body = input.read.to_s
      input.rewind if input.respond_to?(:rewind)
      body.b
    end

    # [status, headers, body] -> Captured plus the full headers
    def capture(triple)
      unless triple.is_a?(Array) && triple.length == 3
        raise ArgumentError, "phased: respond must return [status, headers, body], not #{triple.class}"
      end

      status, headers, body = triple
      parts = body.is_a?(String) ? [body] : body
      unless parts.is_a?(Array) && parts.all? { |part| part.is_a?(String) }
        raise UnstorableResponse, "a streamed response body (#{body.class}) cannot be stored for replay; " \
                                  "answer with a String or an Array of Strings"
      end
      headers = (headers || {}).to_h { |k, v| [k.to_s, v.to_s] }
      SentAnswer.new(Integer(status), headers, parts.join.b)
    end

    # an answer the phases produced: its full headers, and the getter encode_response reads
    SentAnswer = Struct.new(:status, :headers, :body) do
      def get_header
        ->(name) { PgIdempotency.header(headers, name) }
      end
    end
  end
end
