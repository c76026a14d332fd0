/*
 * Json: the small JSON codec the phases need (their state and results are
 * stored as jsonb), with no dependency: parse(text) gives Map<String,Object>
 * (insertion-ordered), List<Object>, String, Long / Double (BigDecimal when
 * a number does not fit), Boolean or null; write(value) takes those (any
 * Map, Collection, array of objects, CharSequence, Number, Boolean, null) and
 * writes compact JSON (no spaces), keys in the Map's order.
 */
package org.idempotency;

import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

public final class Json {
	private Json() {}

	/** Parses one JSON value; IllegalArgumentException when text is not JSON. */
	public static Object parse(String text) {
		if (text == null) throw new IllegalArgumentException("Json.parse: null");
		Reader r = new Reader(text);
		try {
			Object v = r.value(0);
			r.space();
			if (r.i != text.length()) throw r.error("text after the value");
			return v;
		} catch (StringIndexOutOfBoundsException e) {
			throw new IllegalArgumentException("Json.parse: unexpected end of the text", e);
		}
	}

	/** Compact JSON text of a value (see the class comment for the types). */
	public static String write(Object value) {
		StringBuilder b = new StringBuilder();
		write(b, value);
		return b.toString();
	}

	private static void write(StringBuilder b, Object v) {
		if (v == null) {
			b.append("null");
		} else if (v instanceof CharSequence) {
			b.append(Idempotency.json(v.toString()));
		} else if (v instanceof Boolean) {
			b.append(v.toString());
		} else if (v instanceof Double || v instanceof Float) {
			double d = ((Number) v).doubleValue();
			if (Double.isNaN(d) || Double.isInfinite(d)) throw new IllegalArgumentException("Json.write: " + d);
			b.append(d == Math.rint(d) && Math.abs(d) < 1e15 ? Long.toString((long) d) : Double.toString(d));
		} else if (v instanceof BigDecimal) {
			b.append(((BigDecimal) v).toString());
		} else if (v instanceof Number) {
			b.append(v.toString());
		} else if (v instanceof Map) {
			b.append('{');
			boolean first = true;
			for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
				if (!first) b.append(',');
				first = false;
				b.append(Idempotency.json(String.valueOf(e.getKey()))).append(':');
				write(b, e.getValue());
			}
			b.append('}');
		} else if (v instanceof Collection || v instanceof Object[]) {
			b.append('[');
			boolean first = true;
			for (Object o : v instanceof Object[] ? List.of((Object[]) v) : (Collection<?>) v) {
				if (!first) b.append(',');
				first = false;
				write(b, o);
			}
			b.append(']');
		} else {
			throw new IllegalArgumentException("Json.write: a " + v.getClass().getName()
				+ " is not JSON (Map, List, String, Number, Boolean or null)");
		}
	}

	private static final class Reader {
		final String s;
		int i;

		Reader(String s) { this.s = s; }

		IllegalArgumentException error(String what) {
			return new IllegalArgumentException("Json.parse: " + what + " at offset " + i);
		}

		void space() {
			while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) i++;
		}

		void expect(String word) {
			if (!s.startsWith(word, i)) throw error("expected " + word);
			i += word.length();
		}

		Object value(int depth) {
			if (depth > 1000) throw error("nested too deeply");
			space();
			char c = s.charAt(i);
			switch (c) {
			case '{': {
				i++;
				Map<String, Object> m = new LinkedHashMap<>();
				space();
				if (s.charAt(i) == '}') { i++; return m; }
				for (;;) {
					space();
					if (s.charAt(i) != '"') throw error("expected a string key");
					String k = string();
					space();
					expect(":");
					m.put(k, value(depth + 1));
					space();
					if (s.charAt(i) == '}') { i++; return m; }
					expect(",");
				}
			}
			case '[': {
				i++;
				List<Object> l = new ArrayList<>();
				space();
				if (s.charAt(i) == ']') { i++; return l; }
				for (;;) {
					l.add(value(depth + 1));
					space();
					if (s.charAt(i) == ']') { i++; return l; }
					expect(",");
				}
			}
			case '"':
				return string();
			case 't':
				expect("true");
				return Boolean.TRUE;
			case 'f':
				expect("false");
				return Boolean.FALSE;
			case 'n':
				expect("null");
				return null;
			default:
				return number();
			}
		}

		String string() {
			StringBuilder b = new StringBuilder();
			for (i++; ; i++) {
				char c = s.charAt(i);
				if (c == '"') { i++; return b.toString(); }
				if (c < 0x20) throw error("control character in a string");
				if (c != '\\') { b.append(c); continue; }
				char e = s.charAt(++i);
				switch (e) {
				case '"': case '\\': case '/': b.append(e); break;
				case 'b': b.append('\b'); break;
				case 'f': b.append('\f'); break;
				case 'n': b.append('\n'); break;
				case 'r': b.append('\r'); break;
				case 't': b.append('\t'); break;
				case 'u':
					String hex = s.substring(i + 1, i + 5);
					if (!hex.matches("[0-9a-fA-F]{4}")) throw error("bad \\u escape");
					b.append((char) Integer.parseInt(hex, 16));
					i += 4;
					break;
				default: throw error("bad escape");
				}
			}
		}

		Object number() {
			int start = i;
			if (i < s.length() && s.charAt(i) == '-') i++;
			while (i < s.length() && "0123456789.eE+-".indexOf(s.charAt(i)) >= 0) i++;
			String t = s.substring(start, i);
			if (!t.matches("-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?")) {
				i = start;
				throw error("not a JSON value");
			}
			if (t.matches("-?[0-9]+")) {
				try {
					return Long.parseLong(t);
				} catch (NumberFormatException e) {
					return new BigDecimal(t);
				}
			}
			BigDecimal d = new BigDecimal(t);
			double f = d.doubleValue();
			return !Double.isInfinite(f) && new BigDecimal(Double.toString(f)).compareTo(d) == 0 ? (Object) f : d;
		}
	}
}
