# frozen_string_literal: true

# The shared parts, and that their wire formats are the Node and Python
# clients' own (compared as jsonb by PostgreSQL, and by begin()'s fingerprint:
# a key begun by another client's request is replayed, not refused).
require_relative "helper"
require "json"
require "open3"

ROOT = File.expand_path("../../..", __dir__)

class CoreTest < Minitest::Test
  def test_parse_key_sf_string_and_bare_token_are_one_key
    assert_equal "abc", PgIdempotency.parse_key('"abc"')
    assert_equal "abc", PgIdempotency.parse_key("abc")
    assert_equal "abc", PgIdempotency.parse_key(["  abc "])
    assert_equal 'a"b\\c', PgIdempotency.parse_key('"a\\"b\\\\c"')
    assert_nil PgIdempotency.parse_key(nil)
    assert_nil PgIdempotency.parse_key([])
    assert_nil PgIdempotency.parse_key("   ")
  end

  def test_parse_key_malformed
    {
      '"unterminated' => "unterminated",
      '"a"b' => "text after",
      '"a\\x"' => "bad escape",
      "\"caf\u00e9\"" => "printable ASCII"
    }.each do |value, why|
      e = assert_raises(PgIdempotency::InvalidKey) { PgIdempotency.parse_key(value) }
      assert_includes e.message, why
    end
    assert_raises(PgIdempotency::InvalidKey) { PgIdempotency.parse_key(%w[a b]) }
  end

  def test_body_json
    assert_nil PgIdempotency.body_json("")
    assert_equal({ "amount" => "1.00" }, PgIdempotency.body_json('{"amount":"1.00"}'))
    assert_equal({ "base64" => "bm90IGpzb24=" }, PgIdempotency.body_json("not json"))
    assert_equal({ "base64" => "/wD+" }, PgIdempotency.body_json("\xff\x00\xfe".b))
  end

  def test_encode_decode_round_trip
    get = ->(name) { { "Content-Type" => "text/plain", "Location" => "/x" }[name] }
    text = PgIdempotency.encode_response(201, get, "caf\u00e9 \u2713".b, PgIdempotency::DEFAULT_HEADERS)
    assert_equal "caf\u00e9 \u2713", text["body"]
    bin = PgIdempotency.encode_response(200, get, "a\x00b".b, PgIdempotency::DEFAULT_HEADERS)
    assert_equal "YQBi", bin["body_base64"]
    a = PgIdempotency.decode_response(JSON.generate(bin), "completed")
    assert_equal [200, "a\x00b".b, "/x", true], [a.status, a.body, a.headers["Location"], a.replayed]
    other = PgIdempotency.decode_response('{"ok": true}', "completed")
    assert_equal [200, '{"ok":true}'], [other.status, other.body]
  end

  def test_default_store
    assert_equal [true, true, true, false, false, false, false, false, false],
                 [200, 201, 404, 408, 409, 425, 429, 500, 503].map { |s| PgIdempotency.default_store(s) }
  end

  def test_options_units_and_validation
    o = PgIdempotency::Options.new(scope: "s", lock_wait_seconds: 1.5, ttl_seconds: 3600, headers: ["ETag", "location"])
    assert_equal ["1500ms", "3600 seconds"], [o.lock_wait_text, o.ttl_text]
    assert_equal %w[Content-Type Location ETag], o.header_names
    assert_nil PgIdempotency::Options.new(scope: "s").ttl_text
    assert_raises(ArgumentError) { PgIdempotency::Options.new(scope: nil) }
    assert_raises(ArgumentError) { PgIdempotency::Options.new(scope: "s", ttl_seconds: -1) }
    assert_raises(ArgumentError) { PgIdempotency::Options.new(scope: "s", lock_wait_seconds: "200ms") }
    assert_raises(ArgumentError) { PgIdempotency::Options.new(scope: "s", store: 5) }
    u = PgIdempotency::Options.new(scope: ->(r) { "t-#{r}" }, user: ->(r) { r == 1 ? "alice" : nil })
    assert_equal ["t-1|user:alice", "t-2"], [u.scope_for(1), u.scope_for(2)]
  end

  # --- the other clients' formats ----------------------------------------
  BODIES = ['{"amount":"49.90","note":"caf\u00e9 \u2713","n":[1,2.5,null,true]}', "", "not json",
            "\xff\x00\xfe".b].freeze

  def python(code, input)
    out, err, st = Open3.capture3("/usr/bin/python3", "-c", code, stdin_data: JSON.generate(input),
                                  chdir: File.join(ROOT, "clients/python"))
    skip "Python client not importable: #{err.lines.last}" unless st.success?
    JSON.parse(out)
  end

  def node(code, input)
    out, err, st = Open3.capture3("node", "-e", code, stdin_data: JSON.generate(input),
                                  chdir: File.join(ROOT, "clients/node"))
    skip "Node client not runnable: #{err.lines.last}" unless st.success?
    JSON.parse(out)
  end

  def same_jsonb?(a, b)
    TestDB.value("SELECT $1::jsonb = $2::jsonb", [JSON.generate(a), JSON.generate(b)]) == "t"
  end

  def test_request_fingerprint_is_the_python_clients
    b64 = BODIES.map { |b| [b].pack("m0") }
    theirs = python(<<~PY, b64)
      import base64, json, sys
      from pg_idempotency.core import request_json
      print(json.dumps([request_json("POST", "/payments?x=1", base64.b64decode(b)) for b in json.load(sys.stdin)]))
    PY
    ours = BODIES.map { |b| PgIdempotency.request_json("POST", "/payments?x=1", b) }
    ours.zip(theirs).each { |o, t| assert same_jsonb?(o, t), "#{o} vs #{t}" }
  end

  def test_request_fingerprint_is_the_node_clients_under_a_json_body_parser
    theirs = node(<<~JS, BODIES[0])
      const b = JSON.parse(require('fs').readFileSync(0, 'utf8'));
      const { Guard } = require('./lib/core');
      const g = new Guard({ pool: {}, scope: 's' });
      console.log(JSON.stringify(g.requestFor({}, 'POST', '/payments?x=1', JSON.parse(b))));
    JS
    assert same_jsonb?(PgIdempotency.request_json("POST", "/payments?x=1", BODIES[0]), theirs)
  end

  def test_stored_response_is_the_node_and_python_clients
    cases = [["caf\u00e9 \u2713".b, "application/json"], ["\xff\x00\xfe1".b, "application/octet-stream"]]
    input = cases.map { |b, t| [[b].pack("m0"), t] }
    py = python(<<~PY, input)
      import base64, json, sys
      from pg_idempotency.core import encode_response
      print(json.dumps([encode_response(201, {"Content-Type": t, "Location": "/p/1"}.get, base64.b64decode(b),
                                        ("Content-Type", "Location")) for b, t in json.load(sys.stdin)]))
    PY
    js = node(<<~JS, input)
      const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));
      const { encodeResponse } = require('./lib/core');
      console.log(JSON.stringify(input.map(([b, t]) => encodeResponse(201,
        n => ({ 'Content-Type': t, Location: '/p/1' })[n], Buffer.from(b, 'base64'), ['Content-Type', 'Location']))));
    JS
    cases.each_with_index do |(b, t), i|
      get = ->(n) { { "Content-Type" => t, "Location" => "/p/1" }[n] }
      ours = PgIdempotency.encode_response(201, get, b, PgIdempotency::DEFAULT_HEADERS)
      assert same_jsonb?(ours, py[i]), "python: #{py[i]}"
      assert same_jsonb?(ours, js[i]), "node: #{js[i]}"
    end
  end
end
