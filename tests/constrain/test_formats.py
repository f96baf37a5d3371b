"""constrain/formats.py: each format's pattern is its RFC grammar (RFC examples in, near misses out; e-mail: the
addresses every validator takes; uri and iri: a hier-part; durations: those Python's timedelta holds), the rewrite
puts it in place of the `format`, and both backends then accept and refuse the same strings through the mask."""

from __future__ import annotations

import datetime
import re

import jsonschema
import pytest

from constrain import ConstraintSpec, GrammarCompiler, spec_from_request
from constrain.formats import FORMAT_PATTERNS, format_pattern
from constrain.rewrite import rewrite_schema
from constrain.spec import normalise_schema
from tests.constrain.conftest import accepts_document, accepts_value

VALID = {
    "email": ["a@b.co", "first.last+tag@sub.example.org", "A_B%c-d@x-y.IO"],
    "idn-email": ["a@b.co", "jöhn.dœ@example.org", "用户@x.io", "Δ_1+x@sub.example.org"],
    "idn-hostname": ["a", "example.com", "xn-a.b", "a-b-c.d1", "A1.b" + "c" * 61, "0-0"],
    "uri": ["http://example.com/a?b#c", "urn:isbn:0451450523", "mailto:x@y.z", "http://[::1]:8080/", "a:b",
            "HTTP://X", "ldap://[v7.fe80::a+en1]/", "file:///etc"],
    "uri-reference": ["http://example.com/a?b#c", "//host:80/p", "../a/b", "", "#frag", "?q", "mailto:x@y.z",
                      "urn:isbn:0451450523", "http://[::1]:8080/", "http://[2001:db8::7]/c=GB?x", "a:b",
                      "http://user:pw@h/%20x", "foo/bar:baz@", "ldap://[v7.fe80::a+en1]/"],
    "iri": ["http://ex.com/résumé", "https://例え.テスト/パス?q=値#ф", "urn:x", "http://x/\U00010400"],
    "iri-reference": ["résumé/x", "//ü/", "#ф", "", "http://a/b"],
    "uri-template": ["http://example.com/{id}", "{/path*}{?q,lang:2}", "{+base}x{#frag}", "/x/{a.b}", "plain",
                     "{var%20x}", "{;x,y:3}", "é{x}"],
    "json-pointer": ["", "/a/b", "/a~0b/~1", "/ é/\"x", "/"],
    "relative-json-pointer": ["0", "1/a", "2#", "10/a~1b"],
    "date": ["2024-02-29", "2000-02-29", "2023-12-31", "0001-01-01", "9999-11-30"],
    "time": ["23:59:59Z", "00:00:00.5+05:30", "12:30:00.123456789-08:00"],
    "date-time": ["2024-02-29T23:59:59Z", "1996-12-19T16:39:57-08:00", "1985-04-12T23:20:50.52Z"],
    "ipv6": ["::", "::1", "1::", "fe80::1", "2001:db8::8a2e:370:7334", "1:2:3:4:5:6:7:8", "ABCD:ef01::",
             "::ffff:1.2.3.4", "1:2:3:4:5:6:1.2.3.4", "64:ff9b::192.0.2.33"],
    "duration": ["P1D", "PT0S", "P1Y2M3DT4H5M6S", "P4W", "P0001Y", "PT1H0M1S", "P1MT1M",
                 "P9999Y99999M999999DT99999H999999M999999999S", "P99999W"],
    **{f"uuid{v}": [f"1b4e28ba-2fa1-{v}1d2-883f-0016d3cca427", f"1B4E28BA-2FA1-{v}1D2-B83F-0016D3CCA427"]
       for v in range(1, 9)},
    "ipvanyaddress": ["1.2.3.4", "::1", "::ffff:1.2.3.4", "fe80::1"],
    "ipv4interface": ["1.2.3.4", "1.2.3.4/0", "10.0.0.1/8", "255.255.255.255/32"],
    "ipv6interface": ["::1", "::1/128", "fe80::1/64", "::ffff:1.2.3.4/96", "2001:db8::/0"],
    "ipvanyinterface": ["1.2.3.4/24", "::1/128", "fe80::1"],
    "base64": ["", "YQ==", "YWI=", "YWJj", "aGVsbG8gd29ybGQ=", "fn8A", "Pz8+", "Lz8/"],
    "base64url": ["", "YQ==", "YWI=", "YWJj", "fn8A", "Pz8-", "Lz8_"],
}
INVALID = {
    # RFC 5321 takes these; ajv's check and email-validator (pydantic's EmailStr) refuse them.
    "email": ["a@b", "a@[1.2.3.4]", '"x y"@b.co', "a..b@c.de", "a@b.c", "a@-b.co", "a@b.c0", ".a@b.co"],
    # jsonschema only looks for the `@`: it took these, which no mail system does
    "idn-email": ["a b@c.de", "a@", "@b.co", "a@b", "a@ü.de"],
    # IDNA refuses a label with `--` in its third and fourth places, or longer than 63; the others are not LDH
    # labels (a label of another script is IDNA's, which no grammar states: none is written)
    "idn-hostname": ["ab--c", "xn--abc", "a" * 64, "-a", "a-", "a..b", "a b", "a_b", "", "münchen.de"],
    # (an empty hier-part, `a:`, is RFC 3986's too: ajv refuses it, and no answer needs it)
    "uri": ["a:", "a:#f", "a:?q", "//host/p", "/rel", "http://exa mple.com", "1a:b", "http://x/%zz", "http://x/é"],
    "uri-reference": ["http://exa mple.com", "a b", "http://[::1/", "%zz", "http://x/<>", ":nope", "1a:b/c:d",
                      "http://[1:2:3:4:5:6:7:8:9]/"],
    "iri": ["résumé", "http://x/a b", "/rel", "http://x/\ufffe", "a:"],
    "iri-reference": ["a b", "%g0", "x\x7f"],
    "uri-template": ["{", "}", "{a b}", "{a,}", "{a:0}", "{a:12345}", "x'y", "{}", "a{b}}", "{.a.}"],
    "json-pointer": ["a", "/a~2", "/~"],
    "relative-json-pointer": ["", "01", "-1", "1a", "#", "0##"],
    # Python's datetime (pydantic, jsonschema) reads none of these: February 31, year 0, a leap second, a
    # lower-case t or z; nor are they RFC 3339 but for the last three.
    "date": ["2023-02-29", "1900-02-29", "2023-02-31", "2023-04-31", "0000-01-01", "2023-13-01", "2023-1-01"],
    "time": ["23:59:60Z", "24:00:00Z", "12:00:00", "12:00:00z", "12:00Z"],
    "date-time": ["2023-02-29T00:00:00Z", "2020-01-01t00:00:00Z", "2020-01-01T00:00:00z", "2020-01-01 00:00:00Z",
                  "0000-01-01T00:00:00Z", "2020-01-01T23:59:60+01:00"],
    # jsonschema's check (Python's ipaddress) refuses a zone index too
    "ipv6": ["", ":1::", "1:::2", "1::2::3", "12345::", "1:2:3:4:5:6:7:8:9", "1.2.3.4", "::ffff:01.2.3.4",
             "::ffff:1.2.3.256", "fe80::1%eth0", "1:2:3:4:5:6:7:1.2.3.4"],
    # not RFC 3339's (nothing after P or T, the time's parts without T, weeks beside days, fractions, lower case),
    # and RFC 3339's that Python's timedelta (pydantic) cannot hold (QA schemagen F1)
    "duration": ["P", "PT", "P1H", "P1DT", "P1W2D", "P1.5D", "p1d", "PT1H1S", "P7822699Y", "PT99999999H",
                 "PT0064M00227365777789525S"],
    # another version, another variant (Python's uuid reads no version there), no hyphens, braces
    **{f"uuid{v}": [f"1b4e28ba-2fa1-{v % 8 + 1}1d2-883f-0016d3cca427", f"1b4e28ba-2fa1-{v}1d2-c83f-0016d3cca427",
                    f"1b4e28ba2fa1{v}1d2883f0016d3cca427", f"{{1b4e28ba-2fa1-{v}1d2-883f-0016d3cca427}}"]
       for v in range(1, 9)},
    "ipvanyaddress": ["01.2.3.4", "1.2.3", "1::2::3", "", "localhost"],
    "ipv4interface": ["1.2.3.4/33", "::1/64", "1.2.3.4/", "1.2.3/8"],
    "ipv6interface": ["::1/129", "1.2.3.4/8", "::1/", "1::2::3/64"],
    "ipvanyinterface": ["1.2.3.4/33", "::1/129", "1.2.3.4/", ""],
    # unpadded, padded wrongly, spaces, another alphabet; and bytes that are not ASCII (`/+8=`, `wqM=`: "£")
    "base64": ["YQ", "YQ=", "Y", "YQ===", "Y Q==", "Pz8-", "/+8=", "wqM=", "YR=="],
    "base64url": ["YQ", "YQ=", "Pz8+", "Lz8/", "_-8=", "wqM="],
}


@pytest.mark.parametrize("name", sorted(FORMAT_PATTERNS))
def test_pattern_is_the_rfc_grammar(name):
    pattern = re.compile(format_pattern(name))
    assert [s for s in VALID[name] if not pattern.fullmatch(s)] == []
    assert [s for s in INVALID[name] if pattern.fullmatch(s)] == []


def test_durations_are_those_python_holds(tokenizers, vocabs):
    """pydantic writes a `timedelta` as `format: duration`, and llguidance's own check took any number of digits
    in every part: `P7822699Y`, which no timedelta holds, failed `model_validate_json` (and the SDK's `parse()`)
    in 8 answers of 20 (QA schemagen F1). Now the parts are held to what Python's timedelta holds."""
    from pydantic import TypeAdapter

    as_timedelta = TypeAdapter(datetime.timedelta)
    assert [as_timedelta.validate_python(s) for s in VALID["duration"]]  # (raises where one is not held)
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    compiler = GrammarCompiler(vocab, tok, backend="llguidance")
    try:
        g = compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "d", "strict": True, "schema": {"type": "object", "properties": {
                "v": {"type": "string", "format": "duration"}}, "required": ["v"], "additionalProperties": False}}}))
        assert [s for s in VALID["duration"] if not accepts_value(g, tok, vocab, s)] == []
        assert [s for s in INVALID["duration"] if accepts_value(g, tok, vocab, s)] == []
    finally:
        compiler.close()


def test_pydantics_uuid_versions_and_any_ip_address_are_what_pydantic_reads(tokenizers, vocabs):
    """pydantic writes `UUID4` as `format: uuid4` and `IPvAnyAddress` as `format: ipvanyaddress`, which JSON Schema
    does not define: dropped as annotations, any string was written, and `model_validate_json` refused most
    (`UUID version 4 expected`). They are now the patterns of what pydantic reads, where a value must hold them."""
    from ipaddress import IPv4Interface, IPv6Interface

    from pydantic import UUID1, UUID4, UUID7, BaseModel, IPvAnyAddress, IPvAnyInterface, TypeAdapter

    for name, kind in (("uuid1", UUID1), ("uuid4", UUID4), ("uuid7", UUID7), ("ipvanyaddress", IPvAnyAddress),
                       ("ipv4interface", IPv4Interface), ("ipv6interface", IPv6Interface),
                       ("ipvanyinterface", IPvAnyInterface)):
        reads = TypeAdapter(kind)
        assert [reads.validate_python(s) for s in VALID[name]]  # (raises where one is not read)
        for text in INVALID[name][:2 if name.startswith("uuid") else None]:  # (pydantic also reads a UUID without
            with pytest.raises(ValueError):                                # hyphens or in braces, never written)
                reads.validate_python(text)

    class Host(BaseModel):
        v: UUID4

    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    compiler = GrammarCompiler(vocab, tok, backend="llguidance")
    try:
        g = compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "h", "strict": True, "schema": {**Host.model_json_schema(), "additionalProperties": False}}}))
        assert [s for s in VALID["uuid4"] if not accepts_value(g, tok, vocab, s)] == []
        assert [s for s in INVALID["uuid4"] if accepts_value(g, tok, vocab, s)] == []
    finally:
        compiler.close()


def test_pydantics_base64_is_padded_base64_of_ascii_text_which_base64str_and_base64bytes_read(tokenizers, vocabs):
    """pydantic writes `Base64Str` and `Base64Bytes` as `format: base64` (the URL-safe ones as `base64url`), which
    JSON Schema does not define: dropped, any string was written, and `parse()` refused it. `Base64Str` also wants
    UTF-8 inside: the pattern is exactly the padded base64 of ASCII text (checked on random strings), which both
    read."""
    import base64
    import random

    from pydantic import Base64Bytes, Base64Str, Base64UrlBytes, Base64UrlStr, BaseModel, TypeAdapter

    for name, kinds in (("base64", (Base64Str, Base64Bytes)), ("base64url", (Base64UrlStr, Base64UrlBytes))):
        for kind in kinds:
            reads = TypeAdapter(kind)
            for text in VALID[name]:
                reads.validate_python(text)  # (raises where one is not read)
        pattern, alphabet = re.compile(format_pattern(name)), "ABCXYZabcxyz0189+/-_="
        decode, encode = ((base64.b64decode, base64.b64encode) if name == "base64"
                          else (base64.urlsafe_b64decode, base64.urlsafe_b64encode))
        rng = random.Random(0)
        for text in ["".join(rng.choice(alphabet) for _ in range(rng.choice([2, 3, 4, 8]))) for _ in range(20_000)]:
            try:
                data = decode(text.encode())
                ascii_text = encode(data).decode() == text and data.isascii()
            except ValueError:
                ascii_text = False
            assert bool(pattern.fullmatch(text)) == ascii_text, (name, text)
        for _ in range(200):
            text = "".join(chr(rng.randrange(128)) for _ in range(rng.randrange(9)))
            assert pattern.fullmatch(encode(text.encode()).decode())

    class Host(BaseModel):
        v: Base64Str

    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    compiler = GrammarCompiler(vocab, tok, backend="llguidance")
    try:
        g = compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "h", "strict": True, "schema": {**Host.model_json_schema(), "additionalProperties": False}}}))
        assert [s for s in VALID["base64"] if not accepts_value(g, tok, vocab, s)] == []
        assert [s for s in INVALID["base64"] if accepts_value(g, tok, vocab, s)] == []
    finally:
        compiler.close()


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_ipv6_is_what_jsonschemas_check_takes(backend, tokenizers, vocabs):
    """llguidance's own `ipv6` refused the forms ending in an IPv4 address (`::ffff:1.2.3.4`, RFC 4291 2.2.3),
    which jsonschema, Python's ipaddress and the tool formats' raw values take, and outlines refused the format
    (QA round 27): now the RFC's pattern, on both backends."""
    checker = jsonschema.FormatChecker()
    assert all(checker.conforms(s, "ipv6") for s in VALID["ipv6"])
    assert not any(checker.conforms(s, "ipv6") for s in INVALID["ipv6"])
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": "ipv6"}}, "required": ["v"],
              "additionalProperties": False}
    compiler = GrammarCompiler(vocab, tok, backend=backend, background_outlines=False, compile_timeout_s=120)
    try:
        g = compiler.compile(spec_from_request(response_format={
            "type": "json_schema", "json_schema": {"name": "ip", "schema": schema, "strict": True}}))
        assert [s for s in VALID["ipv6"] if not accepts_value(g, tok, vocab, s)] == []
        assert [s for s in INVALID["ipv6"] if accepts_value(g, tok, vocab, s)] == []
    finally:
        compiler.close()


def test_formats_the_backends_lack_become_patterns_and_the_others_stay():
    schema = {"type": "object", "properties": {
        "a": {"type": "string", "format": "uri-reference"},
        "b": {"type": "string", "format": "json-pointer", "pattern": "^/"},
        "c": {"type": "string", "format": "email"},
        "d": {"type": "string", "format": "idn-hostname"},
        "e": {"type": "string", "format": "hostname"}}}
    props = rewrite_schema(schema)["properties"]
    assert props["a"] == {"type": "string", "pattern": format_pattern("uri-reference")}
    assert props["b"] == {"type": "string", "pattern": "^/", "allOf": [{"pattern": format_pattern("json-pointer")}]}
    assert props["c"] == {"type": "string", "pattern": format_pattern("email")}
    assert props["d"] == {"type": "string", "pattern": format_pattern("idn-hostname"), "maxLength": 253}
    assert props["e"] == schema["properties"]["e"]
    assert format_pattern("regex") is None


def test_dates_are_exactly_those_python_reads():
    """Every day string of years around the leap rules: the pattern and `datetime.date.fromisoformat` agree."""
    pattern = re.compile(format_pattern("date"))
    for year in (0, 1, 4, 100, 400, 1900, 1996, 2000, 2023, 2024, 9999):
        for month in range(14):
            for day in range(33):
                text = f"{year:04d}-{month:02d}-{day:02d}"
                try:
                    datetime.date.fromisoformat(text)
                    python_reads = True
                except ValueError:
                    python_reads = False
                assert bool(pattern.fullmatch(text)) == python_reads, text


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_both_backends_enforce_the_formats_in_strict_mode(backend, tokenizers, vocabs):
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    compiler = GrammarCompiler(vocab, tok, backend=backend, background_outlines=False, compile_timeout_s=120)
    # json-pointer's strings may hold '"': outlines cannot escape it (constrain/support.py json_safe_pattern)
    names = ["uri-template", "uri-reference", "date", "date-time", "email", "ipv6"] if backend == "outlines" \
        else FORMAT_PATTERNS
    try:
        for name in names:
            schema = {"type": "object", "properties": {"v": {"type": "string", "format": name}},
                      "required": ["v"], "additionalProperties": False}
            g = compiler.compile(ConstraintSpec(kind="json_schema", schema=rewrite_schema(schema), strict=True))
            assert g.unenforced == ()
            assert [s for s in VALID[name] if not accepts_value(g, tok, vocab, s)] == [], name
            assert [s for s in INVALID[name] if accepts_value(g, tok, vocab, s)] == [], name
    finally:
        compiler.close()


def test_email_and_uri_take_only_what_every_validator_takes(tokenizers, vocabs):
    """llguidance's own formats took `a@b` and `a@[1.2.3.4]` (RFC 5321's) and `a:` (RFC 3986's empty hier-part),
    which ajv (and, for e-mail, pydantic's EmailStr) refuse."""
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    compiler = GrammarCompiler(vocab, tok, backend="llguidance")
    try:
        for name, refused, accepted in [("email", ["a@b", "a@[1.2.3.4]", '"a b"@c.de'], ["a.b+c@d-e.fg"]),
                                        ("uri", ["a:", "a:?q", "a:#f"], ["a:b", "https://x.org/p?q#f"])]:
            schema = {"type": "object", "properties": {"v": {"type": "string", "format": name}},
                      "required": ["v"], "additionalProperties": False}
            g = compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True))
            assert [s for s in refused if accepts_value(g, tok, vocab, s)] == [], name
            assert [s for s in accepted if not accepts_value(g, tok, vocab, s)] == [], name
    finally:
        compiler.close()


@pytest.mark.parametrize("schema, text, valid", [
    ({"type": "string", "not": {"format": "idn-hostname"}}, "münchen.de", False),
    ({"type": "string", "not": {"format": "idn-hostname"}}, "xn--mnchen-3ya.de", False),
    ({"type": "string", "not": {"format": "idn-hostname"}}, "a b", True),
    ({"type": "string", "not": {"format": "idn-email"}}, "a@b", False),
    ({"type": "string", "oneOf": [{"format": "idn-hostname"}, {"minLength": 5}]}, "münchen.de", False),
    ({"type": "string", "not": {"$ref": "#/$defs/h"}}, "münchen.de", False),
    ({"type": "string", "not": {"format": "duration"}}, "P7822699Y", False),  # (a duration, which Python can't hold)
])
def test_a_format_whose_pattern_is_part_of_it_stays_exact_where_it_is_not_asserted(schema, text, valid, tokenizers,
                                                                                     vocabs):
    """`idn-hostname` and `idn-email` are written as the part of their languages a grammar states: under `not`
    (or where a value may or may not hold it) the part let through values the rest of the format holds for
    (`"münchen.de"` under `not: {format: idn-hostname}`, review of 75ea5f9). There they stay formats, checked on
    finished values as jsonschema (with idna) checks them."""
    import jsonschema

    root = {"type": "object", "properties": {"v": schema}, "required": ["v"],
            "$defs": {"h": {"format": "idn-hostname"}}}
    assert jsonschema.Draft202012Validator(root, format_checker=jsonschema.FormatChecker()).is_valid({"v": text}) \
        == valid
    compiler = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="llguidance")
    try:
        g = compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(root), strict=True))
        assert accepts_document(g, tokenizers["gpt2"], vocabs["gpt2"], {"v": text}) == valid
    finally:
        compiler.close()
    positive = {"type": "object", "properties": {"v": {"$ref": "#/$defs/h"}}, "$defs": {"h": {
        "type": "string", "format": "idn-hostname"}}}
    assert rewrite_schema(positive)["$defs"]["h"]["pattern"] == format_pattern("idn-hostname")
