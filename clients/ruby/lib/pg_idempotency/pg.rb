# frozen_string_literal: true

# pg.rb: the guarded transaction on a plain PG::Connection (ruby-pg), taken
# from a pool for the request and given back after it; and ConnectionPool, a
# small thread-safe pool (any object with `with { |conn| ... }` will do, such
# as the connection_pool gem's).
#
# Statements go through exec_params: the extended protocol with an unnamed
# statement, so a PgBouncer in transaction mode is fine, and values never
# appear in a statement's text.
require "pg"
require_relative "guard"

module PgIdempotency
  # ConnectionPool.new(size: 10, timeout_seconds: 5) { PG.connect(...) }
  #   pool.with { |conn| ... }
  # Connections are made on demand, up to size; a connection given back
  # broken, or still inside a transaction, is closed instead of kept.
  class ConnectionPool
    # Raised when no connection is free within timeout_seconds.
    class TimeoutError < StandardError; end

    attr_reader :size

    def initialize(size: 10, timeout_seconds: 5, &connect)
      raise ArgumentError, "ConnectionPool needs a block that returns a new PG::Connection" unless connect

      @size = Integer(size)
      @timeout_seconds = timeout_seconds
      @connect = connect
      @idle = []
      @count = 0
      @mutex = Mutex.new
      @cond = ConditionVariable.new
    end

    def with
      conn = checkout
      begin
        yield conn
      ensure
        checkin(conn)
      end
    end

    # Closes every idle connection (at shutdown).
    def shutdown
      @mutex.synchronize do
        @idle.each { |c| c.close unless c.finished? }
        @count -= @idle.size
        @idle.clear
      end
    end

    private

    def checkout
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + @timeout_seconds
      @mutex.synchronize do
        loop do
          return @idle.pop unless @idle.empty?

          if @count < @size
            @count += 1
            break
          end
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          raise TimeoutError, "no connection free within #{@timeout_seconds} s (pool size #{@size})" if left <= 0

          @cond.wait(@mutex, left)
        end
      end
      begin
        @connect.call
      rescue Exception # rubocop:disable Lint/RescueException
        @mutex.synchronize do
          @count -= 1
          @cond.signal
        end
        raise
      end
    end

    def checkin(conn)
      healthy = !conn.finished? && conn.status == ::PG::CONNECTION_OK &&
                conn.transaction_status == ::PG::PQTRANS_IDLE
      conn.close if !healthy && !conn.finished?
      @mutex.synchronize do
        if healthy
          @idle.push(conn)
        else
          @count -= 1
        end
        @cond.signal
      end
    rescue ::PG::Error
      @mutex.synchronize do
        @count -= 1
        @cond.signal
      end
    end
  end

  # The guarded transaction on a connection from `pool` (an object with
  # `with { |conn| }`), or on one PG::Connection used by one thread at a time.
  class PGTransactions
    # One transaction: statements with $n parameters.
    class Tx
      attr_reader :connection

      def initialize(connection)
        @connection = connection
      end

      def execute(sql, params)
        @connection.exec_params(sql, params).clear
      end

      # the first row's values, as text (or nil)
      def row(sql, params)
        r = @connection.exec_params(sql, params)
        r.ntuples.zero? ? nil : r.values.first
      ensure
        r&.clear
      end
    end

    def initialize(pool)
      @pool = pool
    end

    def nested?
      false
    end

    # what the extension's version is remembered for (compat.rb)
    def compat_key
      @pool
    end

    def transaction
      with_connection do |conn|
        conn.transaction { yield Tx.new(conn) }
      rescue Rollback
        nil
      end
    end

    # one statement outside the guarded transaction -> its first value
    def value(sql, params)
      with_connection do |conn|
        r = conn.exec_params(sql, params)
        r.ntuples.zero? ? nil : r.getvalue(0, 0)
      end
    end

    private

    def with_connection(&block)
      return yield @pool if @pool.is_a?(::PG::Connection)

      @pool.with(&block)
    end
  end
end
