# frozen_string_literal: true

# compat.rb: the gem refuses a database whose idempotency extension is older
# than it needs (docs/clients.md, "Versions"): a gem x.y.z needs the
# extension x.y.0 or newer.  Asked once per pool (the PG pool or connection
# of a middleware, an ActiveRecord class): the first guarded request (or
# run_phases) sends one query, every later one reuses the answer, so a
# request costs no extra round trip.  A refusal is not remembered: after
# ALTER EXTENSION idempotency UPDATE the next request asks again.
require_relative "version"

module PgIdempotency
  # the oldest extension this gem works with: its own major.minor
  EXTENSION_MIN = VERSION.sub(/\A(\d+)\.(\d+)\..*\z/, '\1.\2.0')
  # the extension's version; a plain install of the portable edition (psql -f,
  # no extension) records it in the schema's comment instead
  VERSION_SQL = "SELECT COALESCE((SELECT e.extversion FROM pg_catalog.pg_extension AS e WHERE e.extname OPERATOR(pg_catalog.=) 'idempotency')," \
                " (SELECT pg_catalog.substring(pg_catalog.obj_description(n.oid, 'pg_namespace'), '^idempotency ([0-9.]+) \\(portable edition\\)$')" \
                " FROM pg_catalog.pg_namespace AS n WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency')) AS extversion"

  # The database's extension is older than EXTENSION_MIN (found), or missing (found nil).
  class ExtensionVersionError < StandardError
    attr_reader :found, :needed

    def initialize(found)
      @found = found
      @needed = EXTENSION_MIN
      super(if found.nil?
              "pg_idempotency #{VERSION} needs the idempotency extension #{EXTENSION_MIN} or newer; " \
                "it is not installed in this database (CREATE EXTENSION idempotency, or psql -f of the portable edition)"
            else
              "pg_idempotency #{VERSION} needs the idempotency extension #{EXTENSION_MIN} or newer; " \
                "this database has #{found} (ALTER EXTENSION idempotency UPDATE; a plain install: the portable upgrade script)"
            end)
    end
  end

  @extension_checked = {}.compare_by_identity
  @extension_lock = Mutex.new
  @version_queries = 0

  class << self
    # version queries sent (the tests count them)
    attr_reader :version_queries

    # the extension's version for key (a pool, a model class), asked with
    # the block (VERSION_SQL -> the first row's values, or nil) the first time
    def check_extension(key)
      found = @extension_lock.synchronize { @extension_checked[key] }
      return found if found

      @extension_lock.synchronize { @version_queries += 1 }
      row = yield VERSION_SQL
      found = row&.first
      raise ExtensionVersionError, found if found.nil? || Gem::Version.new(found) < Gem::Version.new(EXTENSION_MIN)

      @extension_lock.synchronize { @extension_checked[key] = found }
    end
  end
end
