#!/usr/bin/python3
"""test/pgxn/validate.py META.json: validate against the PGXN Meta Spec v1
JSON Schema (test/pgxn/schema: schema/v1 of github.com/pgxn/meta, v0.7.0,
PostgreSQL License), with Debian's python3-jsonschema, offline.

The schema's patterns are ECMA/Rust regexes; the four constructs Python's re
lacks are translated (ASCII equivalents: META.json is ASCII).  Also checks
what the schema cannot: the version and the provided file match the control
file.  Prints "ok"/"not ok" lines; exits 1 on any error."""
import json, pathlib, re, sys

import jsonschema

HERE = pathlib.Path(__file__).resolve().parent / "schema"
TRANSLATE = [(r"\p{lower}", "a-z"), (r"\p{Cntrl}", r"\x00-\x1f\x7f"), (r"\p{Space}", r"\s"),
             ("[[:digit:]]", "[0-9]")]


def fix(node):
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "pattern":
                for a, b in TRANSLATE:
                    v = v.replace(a, b)
                # \p{lower}+ inside ^...$ came from a class-less use: wrap it
                v = v.replace("^a-z+$", "^[a-z]+$")
            out[k] = fix(v)
        return out
    if isinstance(node, list):
        return [fix(x) for x in node]
    return node


def validator():
    store = {}
    for f in HERE.glob("*.schema.json"):
        s = fix(json.loads(f.read_text()))
        store[s["$id"]] = s
    root = store["https://pgxn.org/meta/v1/distribution.schema.json"]
    try:
        # jsonschema >= 4.18 (trixie, sid): a referencing registry; its
        # RefResolver is deprecated and not consulted by every keyword
        from referencing import Registry, Resource
        registry = Registry().with_resources(
            (uri, Resource.from_contents(s)) for uri, s in store.items())
        return jsonschema.Draft202012Validator(root, registry=registry)
    except ImportError:
        # bookworm's jsonschema 4.10
        resolver = jsonschema.RefResolver.from_schema(root, store=store)
        return jsonschema.Draft202012Validator(root, resolver=resolver)


def main(path):
    meta = json.loads(pathlib.Path(path).read_text())
    errors = [f"{'/'.join(map(str, e.path)) or '(top)'}: {e.message}" for e in validator().iter_errors(meta)]
    top = pathlib.Path(path).resolve().parent
    control = (top / f"{meta.get('name')}.control").read_text()
    m = re.search(r"default_version\s*=\s*'([^']+)'", control)
    if not m or m.group(1) != meta.get("version"):
        errors.append(f"version {meta.get('version')} is not the control file's default_version")
    for ext, p in meta.get("provides", {}).items():
        if not (top / p["file"]).is_file():
            errors.append(f"provides/{ext}/file {p['file']} does not exist")
        if p.get("version") != meta.get("version"):
            errors.append(f"provides/{ext}/version is not {meta.get('version')}")
    for e in errors:
        print(f"# {e}")
    return errors


if __name__ == "__main__":
    errs = main(sys.argv[1] if len(sys.argv) > 1 else "META.json")
    # the validator is not vacuous: a copy without abstract and with a bad
    # license must fail
    broken = json.loads(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "META.json").read_text())
    del broken["abstract"]
    broken["license"] = "no such license"
    n = len(list(validator().iter_errors(broken)))
    print(f"{'ok' if not errs else 'not ok'} - [pgxn] META.json is valid against the PGXN Meta Spec v1 schema")
    print(f"{'ok' if n >= 2 else 'not ok'} - [pgxn] the validator rejects a broken copy ({n} errors)")
    sys.exit(1 if errs or n < 2 else 0)
