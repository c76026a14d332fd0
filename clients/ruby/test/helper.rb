# frozen_string_literal: true

# helper.rb: the gem as a user has it (installed into GEM_HOME, never
# the checkout's lib/), the database of DATABASE_HOST/PORT/NAME/USER (a
# throwaway cluster with the extension and the payment table), and one TAP
# line per test: "ok - [ruby FILE] Class#test" / "not ok - ...".
require "minitest"

gem "pg_idempotency"
spec = Gem.loaded_specs.fetch("pg_idempotency")
if ENV["GEM_HOME"] && !spec.full_gem_path.start_with?(File.expand_path(ENV["GEM_HOME"]))
  abort "not ok - [ruby] pg_idempotency loaded from #{spec.full_gem_path}, not from GEM_HOME"
end
require "pg_idempotency"
require "securerandom"

module TestDB
  module_function

  def params
    { host: ENV.fetch("DATABASE_HOST"), port: ENV.fetch("DATABASE_PORT"),
      dbname: ENV.fetch("DATABASE_NAME"), user: ENV.fetch("DATABASE_USER") }
  end

  def connect
    PG.connect(**params)
  end

  def value(sql, params = [])
    conn = connect
    conn.exec_params(sql, params).values.dig(0, 0)
  ensure
    conn&.close
  end

  def payments(key)
    value("SELECT count(*) FROM payment WHERE idem_key = $1", [key]).to_i
  end

  def keys(key)
    value("SELECT count(*) FROM idempotency.idempotency_key WHERE key = $1", [key]).to_i
  end

  def fresh_key(tag)
    "ruby-#{tag}-#{SecureRandom.hex(6)}"
  end
end

class TapReporter < Minitest::StatisticsReporter
  def initialize(io, options, label)
    super(io, options)
    @label = label
  end

  def record(result)
    super
    name = "#{result.klass}##{result.name}"
    if result.skipped?
      io.puts "ok - [#{@label}] #{name} # skip #{result.failure.message}"
    elsif result.passed?
      io.puts "ok - [#{@label}] #{name}"
    else
      io.puts "not ok - [#{@label}] #{name}"
      result.failures.each do |f|
        text = f.is_a?(Minitest::UnexpectedError) ? "#{f.error.class}: #{f.error.message}\n#{f.backtrace.first(8).join("\n")}" : f.message
        text.each_line { |l| io.puts "# #{l.chomp}" }
      end
    end
    io.flush
  end
end

module Minitest
  def self.plugin_tap_init(options)
    reporter.reporters.reject! { |r| r.is_a?(Minitest::ProgressReporter) }
    reporter << TapReporter.new(options[:io], options, "ruby #{File.basename($PROGRAM_NAME, '.rb')}")
  end
end
Minitest.extensions << "tap"
require "minitest/autorun"
