# frozen_string_literal: true

# serve.rb: runs a Rack app on Puma at 127.0.0.1:$PORT (0: any free port)
# with `threads` threads and prints "listening <port>" once it accepts
# connections (the example-app contract of test/clients/driver.js).
require "puma"
require "puma/server"

def serve(app, threads:)
  server = Puma::Server.new(app, Puma::Events.strings, min_threads: 0, max_threads: threads)
  server.add_tcp_listener("127.0.0.1", Integer(ENV.fetch("PORT", "0")))
  thread = server.run
  $stdout.puts "listening #{server.connected_ports.first}"
  $stdout.flush
  %w[INT TERM].each { |sig| trap(sig) { server.stop } }
  thread.join
end
