# frozen_string_literal: true

# core.rb: what every integration shares, in the wire formats of the Node
# (clients/node/lib/core.js) and Python (pg_idempotency.core) clients, so a
# key begun by one client is replayed, or refused as a mismatch, by another:
#
#   the key       the Idempotency-Key header: a structured-field string
#                 ("abc", RFC 8941 3.3.3) or bare (abc, as Stripe sends it)
#   the request   {"method": "POST", "path": "/payments?x=1", "body": B}
#                 fingerprinted by begin(): B is the body parsed as JSON,
#                 {"base64": ...} when it is not JSON, null when empty
#   the scope     the route's scope, "<scope>|user:<id>" per user
#   the response  {"status": 201, "headers": {"Content-Type": ...,
#                 "Location": ...}, "body": "<exact text>"} or
#                 "body_base64" when the body is not UTF-8 or has a NUL
#                 (idempotency.http_response()'s convention)
require "base64"
require "json"

module PgIdempotency
  LOCK_WAIT_SQL = "SELECT pg_catalog.set_config('idempotency.lock_wait', $1, true)"
  BEGIN_SQL = "SELECT outcome, status, response, attempts " \
              "FROM idempotency.begin($1, $2::jsonb, $3, $4::interval)"
  COMPLETE_SQL = "SELECT 1 FROM idempotency.complete($1, $2::jsonb, $3)"
  LOOKUP_SQL = "SELECT retry_after FROM idempotency.lookup($1, $2)"

  DEFAULT_HEADERS = %w[Content-Type Location].freeze
  # SQLSTATEs after which begin() runs again in a fresh transaction
  RETRYABLE = %w[40001 40P01].freeze
  # answers that are not final: rolled back, not stored, a resend runs again
  # (Stripe's practice): 408, 409, 425, 429 and any 5xx
  TRANSIENT = [408, 409, 425, 429].freeze
  # the largest response body stored by default (bytes)
  DEFAULT_MAX_BODY_BYTES = 1_048_576

  # A malformed Idempotency-Key header (400).
  class InvalidKey < StandardError; end

  # A response that cannot be stored for replay: a streamed body (a Rack
  # body that is not an Array, ActionController::Live, send_file) or one
  # over max_body_bytes.  The transaction is rolled back and the client gets
  # a 500 saying why.
  class UnstorableResponse < StandardError; end

  # What to send: status, headers, body bytes; replayed: the stored answer.
  Answer = Struct.new(:status, :headers, :body, :replayed)

  # What the handler answered: status, a header getter (name -> value or
  # nil, case-insensitive) and the exact body bytes.
  Captured = Struct.new(:status, :get_header, :body)

  # What a guarded handler sees (env["idempotency"], a controller's
  # #idempotency): the key, its scope, begin()'s outcome ("new" or "retry"),
  # the attempt number and the connection of the guarded transaction.
  Context = Struct.new(:key, :scope, :outcome, :attempts, :connection)

  module_function

  # default_store(status): whether an answer is stored and replayed: every
  # status below 500 except 408, 409, 425 and 429.
  def default_store(status)
    status < 500 && !TRANSIENT.include?(status)
  end

  # parse_key(values): the Idempotency-Key header (a String, an Array of the
  # values received, or nil) -> the key, or nil when missing; raises
  # InvalidKey when malformed or sent more than once.  The length limit (255)
  # is the extension's (IK003), so every client agrees on it.
  def parse_key(values)
    values = Array(values).compact
    raise InvalidKey, "more than one Idempotency-Key header" if values.length > 1
    return nil if values.empty?

    v = values[0].to_s.strip
    return nil if v.empty?
    return v unless v.start_with?('"')

    out = +""
    i = 1
    while i < v.length
      c = v[i]
      if c == "\\"
        i += 1
        raise InvalidKey, "bad escape in Idempotency-Key string" unless i < v.length && ['"', "\\"].include?(v[i])

        out << v[i]
      elsif c == '"'
        raise InvalidKey, "text after the Idempotency-Key string" unless i == v.length - 1

        return out
      elsif c.ord < 0x20 || c.ord > 0x7e
        raise InvalidKey, "Idempotency-Key string must be printable ASCII"
      else
        out << c
      end
      i += 1
    end
    raise InvalidKey, "unterminated Idempotency-Key string"
  end

  # request_json(method, path, body): the default fingerprinted request.
  def request_json(method, path, body)
    { "method" => method, "path" => path, "body" => body_json(body) }
  end

  # body_json(bytes): the body parsed as JSON, {"base64": ...} when it is not
  # JSON (or not UTF-8), nil when empty.
  def body_json(body)
    body = body.to_s
    return nil if body.empty?

    text = body.dup.force_encoding(Encoding::UTF_8)
    if text.valid_encoding?
      begin
        return JSON.parse(text)
      rescue JSON::ParserError, EncodingError
        nil
      end
    end
    { "base64" => Base64.strict_encode64(body) }
  end

  # problem(status, title, detail, headers): an RFC 9457
  # application/problem+json answer.
  def problem(status, title, detail, headers = {})
    body = JSON.generate({ "title" => title, "status" => status, "detail" => detail })
    Answer.new(status, { "Content-Type" => "application/problem+json" }.merge(headers), body.b, false)
  end

  def missing_key
    problem(400, "Idempotency-Key missing", "This request requires an Idempotency-Key header.")
  end

  def invalid_key(message)
    problem(400, "Invalid Idempotency-Key", message)
  end

  # encode_response(status, get_header, body, names) -> the stored form.
  def encode_response(status, get_header, body, names)
    headers = {}
    names.each do |name|
      v = get_header.call(name)
      headers[name] = v.is_a?(Array) ? v.join(", ") : v.to_s unless v.nil?
    end
    r = { "status" => status, "headers" => headers }
    text = body.dup.force_encoding(Encoding::UTF_8)
    if text.valid_encoding? && !text.include?("\u0000")
      r["body"] = text
    else
      r["body_base64"] = Base64.strict_encode64(body)
    end
    r
  end

  # decode_response(stored, status) -> the replayed Answer.  stored is the
  # jsonb as the driver returns it (text or parsed); a key completed by
  # other code, not in this shape, is sent as JSON.
  def decode_response(stored, status)
    r = stored.is_a?(String) ? JSON.parse(stored) : stored
    if r.is_a?(Hash) && r["status"].is_a?(Integer)
      body = r["body"].is_a?(String) ? r["body"].b : Base64.decode64(r["body_base64"].to_s)
      return Answer.new(r["status"], (r["headers"] || {}).to_h { |k, v| [k.to_s, v.to_s] }, body, true)
    end
    Answer.new(status == "failed" ? 500 : 200, { "Content-Type" => "application/json" },
               JSON.generate(r).b, true)
  end

  # error_answer(sqlstate, message, retry_after): the HTTP answer for an
  # extension error (IETF Idempotency-Key draft), or nil for any other.
  def error_answer(sqlstate, message, retry_after = "1")
    case sqlstate
    when "IK001"
      problem(422, "Idempotency-Key reused", "This Idempotency-Key was used with a different request.")
    when "IK002"
      problem(409, "Idempotency-Key in use",
              "A request with this Idempotency-Key is being processed; retry later.",
              { "Retry-After" => retry_after })
    when "IK003"
      problem(400, "Invalid Idempotency-Key", message)
    end
  end

  # sqlstate(error): the SQLSTATE of a PG::Error, or of one wrapped by
  # ActiveRecord (StatementInvalid#cause); nil for anything else.
  def sqlstate(error)
    seen = 0
    while error && seen < 5
      if defined?(::PG::Error) && error.is_a?(::PG::Error)
        res = error.result
        return res&.error_field(::PG::Result::PG_DIAG_SQLSTATE)
      end
      error = error.cause
      seen += 1
    end
    nil
  end

  # message(error): the server's primary message of a PG::Error.
  def message(error)
    pg = error
    pg = pg.cause while pg && !(defined?(::PG::Error) && pg.is_a?(::PG::Error)) && pg.cause
    res = pg.respond_to?(:result) ? pg.result : nil
    (res && res.error_field(::PG::Result::PG_DIAG_MESSAGE_PRIMARY)) || error.message
  end

  # header(headers, name): a Rack headers Hash looked up case-insensitively.
  def header(headers, name)
    return headers[name] if headers.key?(name)

    down = name.downcase
    headers.each { |k, v| return v if k.to_s.downcase == down }
    nil
  end
end
