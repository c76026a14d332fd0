# frozen_string_literal: true

# active_record.rb: the guarded transaction on ActiveRecord's own connection
# and inside ActiveRecord's own transaction (`model.transaction(requires_new:
# true)`), so the handler's model writes (Payment.create!) commit with the
# key's answer or roll back with it.  Inside a transaction the application
# already opened, the guard is a savepoint, and a 40001 is not retried here
# (the caller's whole transaction must run again).
#
# Statements go through exec_query with binds: with the adapter's default
# prepared_statements: true they are prepared per connection; with
# prepared_statements: false (PgBouncer in transaction mode) they are sent
# with exec_params and an unnamed statement.  Never pasted into SQL.
require "active_record"
require_relative "guard"

module PgIdempotency
  class ActiveRecordTransactions
    # One transaction: statements with $n parameters as binds.
    class Tx
      def initialize(model)
        @model = model
      end

      def connection
        @model.connection
      end

      def execute(sql, params)
        connection.exec_query(sql, "Idempotency", params)
        nil
      end

      def row(sql, params)
        connection.exec_query(sql, "Idempotency", params).rows.first
      end
    end

    # model: the ActiveRecord class whose connection guards (and whose
    # connection the handler's models must share), ActiveRecord::Base by default
    def initialize(model = ::ActiveRecord::Base)
      @model = model
    end

    def nested?
      @model.connection.transaction_open?
    end

    # what the extension's version is remembered for (compat.rb)
    def compat_key
      @model
    end

    def transaction
      @model.transaction(requires_new: true) do
        yield Tx.new(@model)
      rescue Rollback
        raise ::ActiveRecord::Rollback
      end
    end

    def value(sql, params)
      r = nil
      @model.transaction(requires_new: true) do
        r = @model.connection.exec_query(sql, "Idempotency", params).rows.first
        raise ::ActiveRecord::Rollback
      end
      r&.first
    end
  end
end
