# frozen_string_literal: true

# phases.rb: a request that calls other systems, run as named phases under
# one idempotency key in lease mode, resumable after a crash (recovery
# points, idempotency.checkpoint()).  The semantics of the Node client's
# runPhases (clients/node/lib/phases.js) and the Python client's run_phases:
#
#   begin(key, request, scope, ttl, lease)      autocommit: commits the lease
#     replay -> the stored response; nothing runs
#     new    -> every phase runs
#     retry  -> the phases up to recovery_point are skipped; state comes back
#   for each phase still to run:
#     BEGIN; result = phase.run(ctx); checkpoint(key, name, state, attempt)
#     COMMIT                                     (the phase's writes and its
#                                                 point commit together)
#     an external phase runs outside a transaction (no connection held
#     during a slow call) and checkpoints in autocommit after it
#   the last phase completes the key instead of checkpointing:
#     complete(key, response(state), scope, attempt)
#
# While phases run, a thread renews the lease every renew_every_seconds
# (idempotency.renew) on a connection of its own; when the key was taken
# over (IK004) ctx.taken_over? turns true, no further phase starts and the
# next checkpoint is refused (IK004): this attempt stops, the new one goes on.
# A phase that raises rolls its transaction back and the key is failed
# retryably (fail(retryable => true)): a resend retries from the last point.
# PhaseError.new(message, permanent: true) ends the request for good
# (fail(retryable => false)): its answer is stored and replayed.
#
# Every value is a server-side parameter (exec_params, ActiveRecord binds).
require "json"
require_relative "core"
require_relative "compat"

module PgIdempotency
  PHASE_BEGIN_SQL = "SELECT outcome, status, response, attempts, recovery_point, recovery_state " \
                    "FROM idempotency.begin($1, $2::jsonb, $3, $4::interval, $5::interval)"
  PHASE_CHECKPOINT_SQL = "SELECT 1 FROM idempotency.checkpoint($1, $2, $3::jsonb, $4::int4, $5)"
  PHASE_COMPLETE_SQL = "SELECT 1 FROM idempotency.complete($1, $2::jsonb, $3, $4::int4)"
  PHASE_FAIL_SQL = "SELECT 1 FROM idempotency.fail($1, $2::jsonb, $3, $4::boolean, $5::int4)"
  PHASE_RENEW_SQL = "SELECT idempotency.renew($1, $2::interval, $3::int4, $4)"
  PHASE_DERIVE_SQL = "SELECT idempotency.derive_key($1, $2, $3)"

  # A phase's failure.  permanent: true ends the request for good: the key is
  # failed with retryable => false and its answer replayed from then on.
  # Under the HTTP integration (phased) a permanent error is answered with
  # `status` (default 400, as the Node and Python clients), `headers` (default Content-Type
  # application/json) and `body` (default {"error":"<message>"}), stored.
  class PhaseError < StandardError
    attr_reader :permanent, :status, :headers, :body

    def initialize(message = "phase failed", permanent: false, status: 400, headers: nil, body: nil)
      super(message)
      @permanent = permanent
      @status = Integer(status)
      @headers = headers || { "Content-Type" => "application/json" }
      @body = body
    end

    # the answer's body bytes
    def body_bytes
      (@body || JSON.generate({ "error" => message })).to_s.b
    end
  end

  # The lease was taken over by another attempt (IK004 from renew()): this
  # attempt stops before its next phase.
  class TakenOver < StandardError
    def initialize(message = "the key was taken over by another attempt (IK004)")
      super
    end
  end

  # One phase: a name (unique), external (run outside a transaction, the
  # checkpoint in autocommit after it) and the block, called with a
  # PhaseContext; its result (JSON-able) is stored in state[name].
  class Phase
    attr_reader :name, :external, :run

    def initialize(name, external: false, &run)
      raise ArgumentError, "phase: a block is required" unless run
      raise ArgumentError, "phase names must be non-empty strings" unless name.is_a?(String) || name.is_a?(Symbol)

      @name = name.to_s
      raise ArgumentError, "phase names must be non-empty strings" if @name.empty?

      @external = external ? true : false
      @run = run
    end
  end

  # What a phase's block gets.
  class PhaseContext
    # connection: the phase's transaction (a PG::Connection, or under Rails
    # ActiveRecord's connection; nil for an external phase); state: the
    # results of the phases before this one (a Hash, string keys); request,
    # key, scope; attempt: begin()'s attempt number; outcome: "new" or "retry"
    attr_reader :connection, :state, :request, :key, :scope, :attempt, :outcome

    def initialize(runner, connection)
      @runner = runner
      @connection = connection
      @state = runner.state
      @request = runner.request
      @key = runner.key
      @scope = runner.scope
      @attempt = runner.attempt
      @outcome = runner.outcome
    end

    # idempotency.derive_key(key, step, scope): the Idempotency-Key to send
    # to another system for `step`, the same on every attempt
    def derive_key(step)
      @runner.derive_key(step.to_s)
    end

    # true once the lease renewal found the key taken over (IK004)
    def taken_over?
      @runner.taken_over?
    end
  end

  # What run_phases returns: outcome ("new", "retry" or "replay"), response
  # (what response(state) gave, or the stored one on a replay: parsed JSON),
  # status (begin()'s status on a replay: "completed" or "failed"),
  # attempts, resumed_from (the recovery point a retry started after).
  PhasesResult = Struct.new(:outcome, :response, :status, :attempts, :resumed_from)

  # Where phases run: a pool of PG::Connection (anything with `with { |c| }`)
  # or, under Rails, an ActiveRecord class (its connection and transactions).
  class PhaseDB
    # what the extension's version is remembered for (compat.rb)
    def compat_key
      self
    end

    def self.for(db)
      return db if db.is_a?(PhaseDB)
      if defined?(::ActiveRecord::Base) && db.is_a?(Class) && db <= ::ActiveRecord::Base
        return ActiveRecordPhaseDB.new(db)
      end
      if defined?(::PG::Connection) && db.is_a?(::PG::Connection)
        raise ArgumentError, "run_phases needs a pool (with { |conn| }), not one PG::Connection: " \
                             "the lease is renewed on a second connection while a phase runs"
      end
      raise ArgumentError, "run_phases: db must respond to with { |conn| } or be an ActiveRecord class" unless
        db.respond_to?(:with)

      PGPhaseDB.new(db)
    end
  end

  # ruby-pg: autocommit statements and phase transactions on pooled connections
  class PGPhaseDB < PhaseDB
    def initialize(pool)
      super()
      @pool = pool
    end

    def check!; end

    def compat_key
      @pool
    end

    def row(sql, params)
      @pool.with { |conn| first_row(conn, sql, params) }
    end
    alias renew_row row

    def transaction
      @pool.with { |conn| conn.transaction { yield conn } }
    end

    def tx_row(conn, sql, params)
      first_row(conn, sql, params)
    end

    private

    def first_row(conn, sql, params)
      r = conn.exec_params(sql, params)
      r.ntuples.zero? ? nil : r.values.first
    ensure
      r&.clear
    end
  end

  # ActiveRecord: the model's connection (autocommit outside a transaction),
  # each database phase in model.transaction; the renewals on a connection
  # of the model's pool checked out by the renewing thread
  class ActiveRecordPhaseDB < PhaseDB
    def initialize(model)
      super()
      @model = model
    end

    def compat_key
      @model
    end

    def check!
      return unless @model.connection.transaction_open?

      raise ArgumentError, "phases cannot run inside an open transaction: begin() must commit the lease " \
                           "and each phase commits on its own"
    end

    def row(sql, params)
      @model.connection.exec_query(sql, "Idempotency", params).rows.first
    end

    def renew_row(sql, params)
      @model.connection_pool.with_connection { |c| c.exec_query(sql, "Idempotency", params).rows.first }
    end

    def transaction
      @model.transaction(requires_new: true) { yield @model.connection }
    end

    def tx_row(conn, sql, params)
      conn.exec_query(sql, "Idempotency", params).rows.first
    end
  end

  # Renews the lease every `every` seconds on a thread of its own until stopped.
  class LeaseRenewer
    def initialize(db, key, scope, attempt, lease_text, every)
      @mutex = Mutex.new
      @cond = ConditionVariable.new
      @stopped = false
      @taken_over = false
      @thread = Thread.new do
        Thread.current.report_on_exception = false
        until wait(every)
          begin
            db.renew_row(PHASE_RENEW_SQL, [key, lease_text, attempt.to_s, scope])
          rescue StandardError => e
            if PgIdempotency.sqlstate(e) == "IK004"
              @taken_over = true
              break
            end
          end
        end
      end
    end

    def taken_over?
      @taken_over
    end

    def stop
      @mutex.synchronize do
        @stopped = true
        @cond.signal
      end
      @thread.join
    end

    private

    # sleeps `every` seconds; true when stopped meanwhile
    def wait(every)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + every
      @mutex.synchronize do
        until @stopped
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          break if left <= 0

          @cond.wait(@mutex, left)
        end
        @stopped
      end
    end
  end

  # One run of run_phases (see there).
  class PhaseRunner
    attr_reader :state, :request, :key, :scope, :attempt, :outcome

    def initialize(db, key:, phases:, response:, scope: "", request: nil, lease_seconds: 30,
                   renew_every_seconds: nil, ttl_seconds: nil, error_response: nil, after_commit: nil)
      @db = PhaseDB.for(db)
      raise ArgumentError, "run_phases: key is required" if key.nil? || key.to_s.empty?

      @key = key.to_s
      @scope = scope.to_s
      @request = request
      @lease_seconds = seconds(:lease_seconds, lease_seconds, positive: true)
      @renew_every_seconds = renew_every_seconds.nil? ? [@lease_seconds / 3.0, 0.05].max : seconds(:renew_every_seconds, renew_every_seconds, positive: true)
      @ttl_seconds = ttl_seconds.nil? ? nil : seconds(:ttl_seconds, ttl_seconds, positive: true)
      @phases = Array(phases)
      raise ArgumentError, "run_phases: phases must be a non-empty Array of PgIdempotency::Phase" if
        @phases.empty? || !@phases.all? { |p| p.is_a?(Phase) }

      names = @phases.map(&:name)
      raise ArgumentError, "run_phases: phase names must be unique (#{names.join(', ')})" if names.uniq.size != names.size
      raise ArgumentError, "run_phases: response must respond to call" unless response.respond_to?(:call)

      @response = response
      @error_response = error_response || ->(e) { { "error" => e.message } }
      @after_commit = after_commit || ->(_name) {}
      @derived = {}
    end

    def taken_over?
      @renewer ? @renewer.taken_over? : false
    end

    def derive_key(step)
      @derived[step] ||= @db.row(PHASE_DERIVE_SQL, [@key, step, @scope]).first
    end

    def run
      @db.check!
      PgIdempotency.check_extension(@db.compat_key) { |sql| @db.row(sql, []) }
      lease_text = interval(@lease_seconds)
      b = @db.row(PHASE_BEGIN_SQL, [@key, @request.nil? ? nil : JSON.generate(@request), @scope,
                                    @ttl_seconds && interval(@ttl_seconds), lease_text])
      raise "idempotency.begin() returned no row" if b.nil?

      @outcome, status, stored, attempts, point, saved = b
      @attempt = attempts.to_i
      return PhasesResult.new("replay", json(stored), status, @attempt, point) if @outcome == "replay"

      @after_commit.call("(begin)")
      names = @phases.map(&:name)
      start = 0
      @state = {}
      if @outcome == "retry" && point
        i = names.index(point)
        raise PhaseError, "recovery point \"#{point}\" is not one of the phases (#{names.join(', ')})" if i.nil?

        start = i + 1
        saved = json(saved)
        @state = saved.is_a?(Hash) ? saved : {}
      end
      @renewer = LeaseRenewer.new(@db, @key, @scope, @attempt, lease_text, @renew_every_seconds)
      begin
        out = start == @phases.length ? finish_resumed : run_from(start)
        PhasesResult.new(@outcome, out, nil, @attempt, point)
      rescue StandardError => e
        record_failure(e)
        raise
      ensure
        @renewer.stop
      end
    end

    private

    def run_from(start)
      out = nil
      (start...@phases.length).each do |i|
        phase = @phases[i]
        last = i == @phases.length - 1
        raise TakenOver if taken_over?

        if phase.external
          store_result(phase, phase.run.call(PhaseContext.new(self, nil)))
          if last
            out = @response.call(@state)
            @db.row(PHASE_COMPLETE_SQL, [@key, JSON.generate(out), @scope, @attempt.to_s])
          else
            @db.row(PHASE_CHECKPOINT_SQL, [@key, phase.name, JSON.generate(@state), @attempt.to_s, @scope])
          end
        else
          @db.transaction do |conn|
            store_result(phase, phase.run.call(PhaseContext.new(self, conn)))
            if last
              out = @response.call(@state)
              @db.tx_row(conn, PHASE_COMPLETE_SQL, [@key, JSON.generate(out), @scope, @attempt.to_s])
            else
              @db.tx_row(conn, PHASE_CHECKPOINT_SQL, [@key, phase.name, JSON.generate(@state), @attempt.to_s, @scope])
            end
          end
        end
        @after_commit.call(last ? "(complete)" : phase.name)
      end
      out
    end

    # resumed after the last phase committed but before complete()
    def finish_resumed
      out = @response.call(@state)
      @db.row(PHASE_COMPLETE_SQL, [@key, JSON.generate(out), @scope, @attempt.to_s])
      @after_commit.call("(complete)")
      out
    end

    # a result as it comes back on a retry (through JSON): string keys
    def store_result(phase, result)
      @state = @state.merge(phase.name => JSON.parse(JSON.generate([result])).first)
    end

    # fail() the key, unless it was taken over (the new attempt owns it)
    def record_failure(err)
      return if taken_over? || err.is_a?(TakenOver) || PgIdempotency.sqlstate(err) == "IK004"

      permanent = err.is_a?(PhaseError) && err.permanent
      @db.row(PHASE_FAIL_SQL, [@key, JSON.generate(@error_response.call(err)), @scope,
                               permanent ? "false" : "true", @attempt.to_s])
    rescue StandardError
      nil
    end

    def json(value)
      value.is_a?(String) ? JSON.parse(value) : value
    end

    def interval(secs)
      "#{[(secs * 1000).round, 1].max} milliseconds"
    end

    def seconds(name, value, positive: false)
      unless value.is_a?(Numeric) && (positive ? value.positive? : value >= 0)
        raise ArgumentError, "run_phases: #{name} must be a number of seconds > 0"
      end

      value
    end
  end

  module_function

  # run_phases(db, key:, phases:, response:, scope: "", request: nil,
  #            lease_seconds: 30, renew_every_seconds: lease_seconds / 3,
  #            ttl_seconds: nil, error_response: nil, after_commit: nil)
  # -> PhasesResult.  db: a pool of PG::Connection (with { |conn| }) or an
  # ActiveRecord class; phases: [PgIdempotency::Phase, ...] in order;
  # response: ->(state) { JSON-able }, stored by complete().
  def run_phases(db, **options)
    PhaseRunner.new(db, **options).run
  end
end
